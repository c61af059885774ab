"""Paged and batched reads for clients that page or nest (GraphQL): the same rules as
`pools.list_pools` and `pools.get_pool`, a page or a batch at a time.

Per-item IAM runs over the authz rows loaded with each batch (`PoolView.grant`), never a
query per pool.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.capacity.access import resolve_actor
from app.capacity.inputs import (
    POOL_ID_PATTERN,
    RESERVATION_ID_PATTERN,
    ListPoolsInput,
    ListQuotasInput,
)
from app.capacity.paging import Page, PageRequest, page_request
from app.capacity.reads import (
    effective_quotas,
    reservations_pages,
    visible_pool,
    visible_pools,
    visible_pools_by_id,
)
from app.capacity.views import PoolView, QuotaView, ReservationView
from app.catalog import LIST_POOLS, LIST_RESERVATIONS
from app.db.engine import Executor
from app.iam.decisions import allows_pool, decide_pool
from app.iam.principal import Principal


def pools_page_request(first: int | None, after: str | None) -> PageRequest:
    return page_request(first, after, POOL_ID_PATTERN)


def reservations_page_request(first: int | None, after: str | None) -> PageRequest:
    return page_request(first, after, RESERVATION_ID_PATTERN)


async def page_pools(
    executor: Executor, principal: Principal, inp: ListPoolsInput, page: PageRequest
) -> Page[PoolView]:
    """One keyset page of `list`: the tenant decision, then compute:pools:read per pool."""
    actor = await resolve_actor(executor, principal, inp.tenant_id, LIST_POOLS)
    scan = page.first + 1  # one more than asked tells whether a next page exists
    allowed: list[PoolView] = []
    after = page.after
    while len(allowed) < scan:
        batch = await visible_pools(executor, actor, after=after, limit=scan)
        allowed.extend(
            p for p in batch if allows_pool(principal, LIST_POOLS.permission, p.grant.attributes)
        )
        if len(batch) < scan:
            break
        after = batch[-1].id  # a narrowed binding hid some: keep scanning
    return Page(
        items=allowed[: page.first],
        has_next=len(allowed) > page.first,
        has_previous=page.after is not None,
    )


async def pools_by_id(
    executor: Executor, principal: Principal, tenant_id: str, pool_ids: Sequence[str]
) -> dict[str, PoolView]:
    """Many pools as the tenant sees them; a pool it cannot see or read is absent."""
    actor = await resolve_actor(executor, principal, tenant_id, LIST_POOLS)
    found = await visible_pools_by_id(executor, actor, pool_ids)
    return {
        pool_id: pool
        for pool_id, pool in found.items()
        if allows_pool(principal, LIST_POOLS.permission, pool.grant.attributes)
    }


async def list_quotas(
    executor: Executor, principal: Principal, inp: ListQuotasInput
) -> list[QuotaView]:
    """The tenant's own quota rows, in every pool it may read or in one (NOT_FOUND as get)."""
    actor = await resolve_actor(executor, principal, inp.tenant_id, LIST_POOLS)
    if inp.pool_id is not None:
        pool = await visible_pool(executor, actor, inp.pool_id)
        decide_pool(principal, LIST_POOLS.permission, pool.grant.attributes)
        pools = [pool]
    else:
        pools = [
            p
            for p in await visible_pools(executor, actor)
            if allows_pool(principal, LIST_POOLS.permission, p.grant.attributes)
        ]
    quotas = await effective_quotas(executor, pools)
    return [row for pool in pools for row in quotas[pool.id]]


def check_reservations(principal: Principal, pool: PoolView) -> None:
    decide_pool(principal, LIST_RESERVATIONS.permission, pool.grant.attributes)


async def pages_of_reservations(
    executor: Executor, tenant_id: str, pool_ids: Sequence[str], page: PageRequest
) -> dict[str, Page[ReservationView]]:
    """The tenant's own reservations in each of many visible pools, one page each."""
    found = await reservations_pages(
        executor, tenant_id, pool_ids, after=page.after, limit=page.first + 1
    )
    return {
        pool_id: Page(
            items=rows[: page.first],
            has_next=len(rows) > page.first,
            has_previous=page.after is not None,
        )
        for pool_id, rows in found.items()
    }
