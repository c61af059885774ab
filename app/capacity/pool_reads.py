"""Pools as a caller reads them: one read model (`PoolDetail`) for every transport.

`list` (whole on REST, keyset pages on GraphQL's `pools`), `get`, and the pool a write
returns are built here, with the parts the transport asks for: the tenant's own quota
rows, the rollup, the offers, the lender's view. Per-pool IAM is decided over each pool's
loaded authz row (`PoolView.grant`), and each part is loaded for every pool at once, so
the statements behind a page do not grow with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.capacity.access import (
    capacity_denied,
    offers_denied,
    resolve_actor,
)
from app.capacity.inputs import CapacityInput, GetPoolInput, ListPoolsInput, ListQuotasInput
from app.capacity.labels import Requirement, parse_selector
from app.capacity.lending import lent_capacity
from app.capacity.paging import Page, PageRequest
from app.capacity.reads import (
    Actor,
    OfferQuota,
    effective_quotas,
    offers_and_own_quotas,
    offers_of,
    owned_parts_of,
    owned_pool_view,
    reservations_pages,
    seen_through_own_row,
    visible_pool,
    visible_pools,
)
from app.capacity.views import (
    DETAIL_PARTS,
    CapacityView,
    Grant,
    OfferView,
    PoolDetail,
    PoolPart,
    PoolView,
    QuotaView,
    ReservationView,
    StoredPool,
)
from app.catalog import GET_POOL, LIST_POOLS, LIST_RESERVATIONS, POOL_CAPACITY
from app.db.engine import Executor
from app.errors import PermissionDenied
from app.iam.decisions import allows_pool, decide_pool, pool_denial
from app.iam.principal import Principal


async def read_parts(
    executor: Executor,
    principal: Principal,
    views: Sequence[PoolView],
    parts: frozenset[PoolPart],
    *,
    quotas: dict[str, tuple[QuotaView, ...]] | None = None,
) -> list[PoolDetail]:
    """The pools with the asked parts, each loaded for all of them in one batch; `quotas`
    when the rows are already known (a write read them in its transaction)."""
    if quotas is None:
        quotas = await effective_quotas(executor, views) if "quotas" in parts else {}
    capacity_denials = {v.id: capacity_denied(principal, v) for v in views if "capacity" in parts}
    # Only an owned pool has offers (or lending) to show; any other has none, no error.
    offer_denials = {
        v.id: offers_denied(principal, v)
        for v in views
        if v.owned and ("offers" in parts or "lending" in parts)
    }
    rollup_of = [v for v in views if v.id in capacity_denials and not capacity_denials[v.id]]
    rollups = await lent_capacity(executor, principal, rollup_of) if rollup_of else {}
    offered = [pool_id for pool_id, denied in offer_denials.items() if denied is None]
    offers = await offers_of(executor, offered) if offered else {}

    def capacity_of(view: PoolView) -> tuple[CapacityView, ...] | PermissionDenied | None:
        if "capacity" not in parts:
            return None
        return capacity_denials[view.id] or rollups[view.id]

    def offers_for(view: PoolView) -> tuple[OfferView, ...] | PermissionDenied | None:
        if "offers" not in parts or not view.owned:
            return None
        return offer_denials[view.id] or offers[view.id]

    def lending_of(view: PoolView) -> tuple[OfferView, ...] | PermissionDenied | None:
        if "lending" not in parts or not view.owned:
            return None
        denied = offer_denials[view.id]
        if denied is not None:
            return denied
        return tuple(o for o in offers[view.id] if o.tenant_id != view.tenant_id)

    return [
        PoolDetail(
            v,
            quotas.get(v.id, ()),
            offers_for(v),
            capacity=capacity_of(v),
            lending=lending_of(v),
        )
        for v in views
    ]


async def pool_detail(executor: Executor, actor: Actor, pool_id: str) -> PoolDetail:
    """The pool as the actor's tenant sees it, as a write returns it (DETAIL_PARTS)."""
    pool = await visible_pool(executor, actor, pool_id)
    (detail,) = await read_parts(executor, actor.principal, [pool], DETAIL_PARTS)
    return detail


OwnedParts = tuple[tuple[OfferView, ...], tuple[QuotaView, ...]]


async def owned_parts(
    executor: Executor,
    principal: Principal,
    pool: StoredPool,
    rows: Sequence[OfferQuota] | None = None,
) -> OwnedParts | None:
    """An owned pool's offers and its owner's quota rows in one statement
    (reads.offers_and_own_quotas), or from `rows` when the write read them with its lock
    (access.lock_owned_pool_with_offers), for a caller that reads the offers; None for one
    that does not (its answer reads the quota rows alone). What a write that changes
    neither reads first, for its own rules and its answer."""
    if offers_denied(principal, owned_pool_view(pool)) is not None:
        return None
    if rows is not None:
        return owned_parts_of(pool, rows)
    return await offers_and_own_quotas(executor, pool)


async def owned_pool_detail(
    executor: Executor, principal: Principal, pool: StoredPool, parts: OwnedParts | None = None
) -> PoolDetail:
    """`pool_detail` of a pool its owner wrote, as the owner sees it: the view built from
    the row the write holds (reads.owned_pool_view), with its parts (DETAIL_PARTS): those
    the write read already (`owned_parts`, still what the pool holds), else read now."""
    view = owned_pool_view(pool)
    if offers_denied(principal, view) is not None:
        # The offers withheld: read_parts says so, and reads the quota rows alone.
        (detail,) = await read_parts(executor, principal, [view], DETAIL_PARTS)
        return detail
    offers, quotas = parts if parts is not None else await offers_and_own_quotas(executor, pool)
    return PoolDetail(view, quotas, offers)


async def offered_pool_detail(
    executor: Executor,
    principal: Principal,
    pool: StoredPool,
    tenant_id: str,
    authz_row: dict[str, Any],
    quotas: tuple[QuotaView, ...] | None = None,
) -> PoolDetail:
    """`pool_detail` of a pool just offered to `tenant_id`, as that tenant sees it: the
    view granted by the tenant's own authz row (reads.seen_through_own_row, as the offer
    wrote or kept it), its parts read as any view's (its own quota rows: one statement),
    or `quotas`, the tenant's own rows when the offer wrote them all (as `quotas_of` reads
    them: reads.quota_view)."""
    view = seen_through_own_row(principal, pool, tenant_id, authz_row)
    # Its own row grants it (seen_through_own_row), so its own rows are the ones it sees.
    own = view.grant.tenant_id == tenant_id
    known = {view.id: quotas} if quotas is not None and own else None
    (detail,) = await read_parts(executor, principal, [view], DETAIL_PARTS, quotas=known)
    return detail


def _readable(principal: Principal, views: Sequence[PoolView]) -> list[PoolView]:
    return [v for v in views if allows_pool(principal, LIST_POOLS.permission, v.grant.attributes)]


async def _page_of_pools(
    executor: Executor, actor: Actor, page: PageRequest, selector: tuple[Requirement, ...]
) -> Page[PoolView]:
    scan = page.first + 1  # one more than asked tells whether a next page exists
    allowed: list[PoolView] = []
    after = page.after
    while len(allowed) < scan:
        batch = await visible_pools(executor, actor, after=after, limit=scan, selector=selector)
        allowed.extend(_readable(actor.principal, batch))
        if len(batch) < scan:
            break
        after = batch[-1].id  # a narrowed binding hid some: keep scanning
    return Page(
        items=allowed[: page.first],
        has_next=len(allowed) > page.first,
        has_previous=page.after is not None,
    )


async def list_pools(
    executor: Executor,
    principal: Principal,
    inp: ListPoolsInput,
    parts: frozenset[PoolPart],
    page: PageRequest | None = None,
) -> Page[PoolDetail]:
    """The seed's `list`: the tenant decision, then compute:pools:read per pool. Every
    pool (REST), or one keyset page of them (GraphQL), those `labelSelector` selects."""
    # A malformed selector is INVALID_INPUT before any decision, as any other bad input.
    selector = parse_selector(inp.label_selector or "")
    actor = await resolve_actor(executor, principal, inp.tenant_id, LIST_POOLS)
    if page is None:
        pools = await visible_pools(executor, actor, selector=selector)
        found = Page(_readable(principal, pools), False, False)
    else:
        found = await _page_of_pools(executor, actor, page, selector)
    details = await read_parts(executor, principal, found.items, parts)
    return Page(details, found.has_next, found.has_previous)


async def get_pool(
    executor: Executor, principal: Principal, inp: GetPoolInput, parts: frozenset[PoolPart]
) -> PoolDetail:
    actor = await resolve_actor(executor, principal, inp.tenant_id, GET_POOL)
    pool = await visible_pool(executor, actor, inp.pool_id)
    decide_pool(principal, GET_POOL.permission, pool.grant.attributes)
    (detail,) = await read_parts(executor, principal, [pool], parts)
    return detail


async def pool_capacity(
    executor: Executor, principal: Principal, inp: CapacityInput
) -> tuple[CapacityView, ...]:
    actor = await resolve_actor(executor, principal, inp.tenant_id, POOL_CAPACITY)
    pool = await visible_pool(executor, actor, inp.pool_id)
    decide_pool(principal, POOL_CAPACITY.permission, pool.grant.attributes)
    # The owner (with share) also sees what it lent: offered, guestUsed, overcommit.
    return (await lent_capacity(executor, principal, [pool]))[pool.id]


async def list_quotas(
    executor: Executor, principal: Principal, inp: ListQuotasInput
) -> list[QuotaView]:
    """The tenant's own quota rows, in every pool it may read or in one (NOT_FOUND as get).
    Decided as `list` is."""
    actor = await resolve_actor(executor, principal, inp.tenant_id, LIST_POOLS)
    if inp.pool_id is not None:
        pool = await visible_pool(executor, actor, inp.pool_id)
        decide_pool(principal, LIST_POOLS.permission, pool.grant.attributes)
        pools = [pool]
    else:
        pools = _readable(principal, await visible_pools(executor, actor))
    quotas = await effective_quotas(executor, pools)
    return [row for pool in pools for row in quotas[pool.id]]


async def reservation_pages(
    executor: Executor,
    principal: Principal,
    tenant_id: str,
    pools: Sequence[tuple[str, Grant]],
    page: PageRequest,
) -> dict[str, Page[ReservationView] | PermissionDenied]:
    """The tenant's own reservations in each of many pools it sees (each with the grant it
    sees it through), one page each, in one statement. A pool whose reservations the
    caller may not read holds the PermissionDenied that withholds them."""
    denials = {
        pool_id: pool_denial(principal, LIST_RESERVATIONS.permission, grant.attributes)
        for pool_id, grant in pools
    }
    readable = [pool_id for pool_id, denied in denials.items() if denied is None]
    found = await reservations_pages(
        executor, tenant_id, readable, after=page.after, limit=page.first + 1
    )
    return {
        pool_id: denied
        or Page(
            items=found[pool_id][: page.first],
            has_next=len(found[pool_id]) > page.first,
            has_previous=page.after is not None,
        )
        for pool_id, denied in denials.items()
    }
