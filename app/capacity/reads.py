"""Read queries over Core rows. Each loader takes many pool ids, so lists never run N+1.

The rules they apply (lineage, grants, archived visibility, the quota rows a viewer books
against with their offers) are app/capacity/read_rules.py's, as the compiled reads'."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, Protocol, TypeVar, cast

from sqlalchemy import (
    Column,
    ColumnElement,
    Row,
    Select,
    Subquery,
    and_,
    bindparam,
    exists,
    select,
)
from sqlalchemy.sql.util import ClauseAdapter

from app.capacity.fields import OFFER, POOL, RESERVATION_ORDER, Value
from app.capacity.labels import Requirement, selector_clause
from app.capacity.policy import readable_policy
from app.capacity.read_rules import (
    ReservationsPage,
    grant_clause,
    lineage_cte,
    own_reservations,
    pool_seen_by,
    quota_offer,
    quotas_with_offers,
    reservations_after,
)
from app.capacity.views import (
    CapacityView,
    Grant,
    GrantView,
    OfferView,
    PoolView,
    QuotaView,
    ReservationView,
    StoredPool,
)
from app.db.engine import Executor
from app.db.models import AuthzRow, CapacityRow, Offer, Pool, QuotaRow, Reservation, Tenant
from app.errors import NotFound
from app.iam.decisions import PoolAttributes
from app.iam.principal import Principal


def pool_not_found(pool_id: str) -> NotFound:
    """The one answer for a pool that is missing or hidden, so neither can be told apart."""
    return NotFound(f"pool {pool_id} not found", field="poolId")


@dataclass(frozen=True, slots=True)
class Actor:
    """A principal acting for one tenant; `lineage` is the tenant, then its ancestors."""

    principal: Principal
    tenant_id: str
    lineage: tuple[str, ...]

    @property
    def ancestors(self) -> tuple[str, ...]:
        return self.lineage[1:]


# Built once, with its tenant bound per call (as the other statements below).
_LINEAGE_CHAIN = lineage_cte(bindparam("tenant_id"))
_LINEAGE = select(_LINEAGE_CHAIN.c.id).order_by(_LINEAGE_CHAIN.c.depth)


async def load_lineage(executor: Executor, tenant_id: str) -> tuple[str, ...]:
    """The tenant and its ancestors, nearest first; NOT_FOUND for an unknown tenant."""
    rows = (await executor.execute(_LINEAGE, {"tenant_id": tenant_id})).all()
    if not rows:
        raise tenant_not_found(tenant_id)
    return tuple(r.id for r in rows)


def tenant_not_found(tenant_id: str) -> NotFound:
    return NotFound(f"tenant {tenant_id} not found", field="tenantId")


# Whether the bound `tenant_id` names a tenant: a column of a write's first read that
# needs no lineage (pools.create), NOT_FOUND (`tenant_not_found`) when false.
TENANT_KNOWN = exists().where(Tenant.id == bindparam("tenant_id"))


def _grant_clause(tenant: Any, ancestors: Any | None) -> Any:
    """The authz rows that let `tenant` see a pool (read_rules.grant_clause): its own, or
    those of `ancestors` that include descendants (None: it has none). Values, or bound
    parameters."""
    inherited = None if ancestors is None else AuthzRow.tenant_id.in_(ancestors)
    return grant_clause(AuthzRow.tenant_id == tenant, inherited)


def _grant_filter(actor: Actor) -> Any:
    return _grant_clause(actor.tenant_id, actor.ancestors or None)


def _visible_clause(tenant: Any, ancestors: Any | None) -> Select[Any]:
    granted = select(AuthzRow.pool_id).where(_grant_clause(tenant, ancestors))
    return select(Pool.__table__).where(Pool.id.in_(granted), pool_seen_by(tenant))


def _visible_pools_query(actor: Actor) -> Select[Any]:
    return _visible_clause(actor.tenant_id, actor.ancestors or None)


async def load_grants(
    executor: Executor, actor: Actor, pool_ids: Sequence[str]
) -> dict[str, Grant]:
    """The row that lets the actor see each pool: its own first, else the nearest ancestor's."""
    if not pool_ids:
        return {}
    rows = (
        await executor.execute(
            select(AuthzRow.__table__).where(AuthzRow.pool_id.in_(pool_ids), _grant_filter(actor))
        )
    ).all()
    return _best_grants(actor, rows)


class GrantingRow(Protocol):
    """An authz row as the grant rule reads it (a database row, or the relay's copy)."""

    @property
    def tenant_id(self) -> str: ...

    @property
    def include_descendants(self) -> bool: ...


_Row = TypeVar("_Row", bound=GrantingRow)


def nearest_grant(actor: Actor, rows: Iterable[_Row]) -> _Row | None:
    """Of one pool's authz rows, the one that grants it to the actor (read_rules'
    grant_clause and nearest_grants, for rows already in hand): its own row first, else
    the nearest ancestor's that includes descendants; None when none grants it."""
    best: _Row | None = None
    best_rank = len(actor.lineage)
    for row in rows:
        if row.tenant_id == actor.tenant_id:
            rank = 0
        elif row.include_descendants and row.tenant_id in actor.ancestors:
            rank = actor.lineage.index(row.tenant_id)
        else:
            continue
        if rank < best_rank:
            best, best_rank = row, rank
    return best


def grant_for(actor: Actor, tenant_id: str, attributes: PoolAttributes) -> Grant:
    """The grant of a pool through `tenant_id`'s row (`granted_as`)."""
    return granted_as(actor.tenant_id, tenant_id, attributes)


def granted_as(acting_tenant: str, tenant_id: str, attributes: PoolAttributes) -> Grant:
    """The grant of a pool to `acting_tenant` through `tenant_id`'s row: `owned` only for
    the owner acting for itself (an ancestor's row says its own tenant owns the pool, not
    the actor)."""
    if attributes.owned and tenant_id != acting_tenant:
        attributes = dataclasses.replace(attributes, owned=False)
    return Grant(tenant_id=tenant_id, attributes=attributes)


def _best_grants(actor: Actor, rows: Sequence[Any]) -> dict[str, Grant]:
    """Of authz rows matching `_grant_filter(actor)`, the one granting each pool."""
    by_pool: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        by_pool[row.pool_id].append(row)
    found: dict[str, Grant] = {}
    for pool_id, held in by_pool.items():
        best = nearest_grant(actor, held)
        if best is not None:
            attributes = PoolAttributes(
                best.gpu_model, best.pool_class, best.sharing, best.region, best.owned
            )
            found[pool_id] = grant_for(actor, best.tenant_id, attributes)
    return found


# The pool's stored values, read by the table of fields (app/capacity/fields.py): a
# column added there reaches the read model with no change here. The policy is shown
# readable (never a secret, on any surface) and `owned` is the acting tenant's.
_STORED = tuple(
    (e.name, e.column.key)
    for e in POOL.entries
    if isinstance(e, Value) and isinstance(e.column, Column) and e.name != "policy"
)


# The order of each list of a pool, as the compiled reads sort it too (the table's `order`).
_ORDER = {name: POOL.relation(name).order for name in ("quotas", "capacity", "offers")}


def owned_pool_view(pool: StoredPool) -> PoolView:
    """A pool as its owner sees it, from its row (one a write holds): granted by the
    owner's own authz row, which carries the pool's attributes (projection.authz_values,
    refreshed when they change)."""
    attributes = PoolAttributes(pool.gpu_model, pool.pool_class, pool.sharing, pool.region, True)
    return _pool_view(pool, pool.tenant_id, Grant(tenant_id=pool.tenant_id, attributes=attributes))


def _pool_view(row: Pool | Row[Any] | StoredPool, actor_tenant: str, grant: Grant) -> PoolView:
    stored = {name: getattr(row, key) for name, key in _STORED}
    return PoolView(
        **stored,
        policy=readable_policy(row.policy),
        owned=row.tenant_id == actor_tenant,
        grant=grant,
    )


async def visible_pools(
    executor: Executor,
    actor: Actor,
    *,
    after: str | None = None,
    limit: int | None = None,
    selector: tuple[Requirement, ...] = (),
) -> list[PoolView]:
    """Pools the actor sees, in id (creation) order, keyset-paged after `after`, those
    whose labels match `selector` (labels.selector_clause)."""
    query = _visible_pools_query(actor).order_by(Pool.id)
    if selector:
        query = query.where(selector_clause(selector, Pool.__table__.c.labels))
    if after is not None:
        query = query.where(Pool.id > after)
    if limit is not None:
        query = query.limit(limit)
    pools = (await executor.execute(query)).all()
    grants = await load_grants(executor, actor, [p.id for p in pools])
    return [_pool_view(p, actor.tenant_id, grants[p.id]) for p in pools if p.id in grants]


class _GrantRow(NamedTuple):
    tenant_id: str
    pool_id: str
    include_descendants: bool
    gpu_model: str | None
    pool_class: str
    sharing: str
    region: str
    owned: bool


def seen_through_own_row(
    principal: Principal, pool: StoredPool, tenant_id: str, row: dict[str, Any]
) -> PoolView:
    """`visible_pool` for a tenant that holds its own authz row on the pool (`row`, as
    projection.authz_values writes it), on a pool that is not archived: the row
    `nearest_grant` takes first whatever the tenant's ancestors hold, so neither the
    lineage nor a read is needed. For a write that holds the pool and wrote or kept the
    row (an offer, answered as the offered tenant sees the pool)."""
    actor = Actor(principal, tenant_id, (tenant_id,))
    grant = _best_grants(actor, [_GrantRow(tenant_id=tenant_id, pool_id=pool.id, **row)])
    return _pool_view(pool, tenant_id, grant[pool.id])


def _visible_pool_with_grants(with_ancestors: bool) -> Select[Any]:
    """The pool if the actor sees it, once per authz row that could grant it: the rows of
    `_visible_pools_query` and of `load_grants`, in one statement (bound: tenant_id,
    ancestors, pool_id)."""
    tenant: Any = bindparam("tenant_id")
    ancestors: Any = bindparam("ancestors", expanding=True) if with_ancestors else None
    pool_id: Any = bindparam("pool_id")
    pool = _visible_clause(tenant, ancestors).where(Pool.id == pool_id).subquery("pool")
    grant = (
        select(AuthzRow.__table__)
        .where(AuthzRow.pool_id == pool_id, _grant_clause(tenant, ancestors))
        .subquery("grant")
    )
    return select(pool, *(c.label(f"grant_{c.key}") for c in grant.c)).join(
        grant, grant.c.pool_id == pool.c.id
    )


# By whether the actor's tenant has ancestors, built once.
_VISIBLE_POOL = {False: _visible_pool_with_grants(False), True: _visible_pool_with_grants(True)}


async def visible_pool(executor: Executor, actor: Actor, pool_id: str) -> PoolView:
    """One pool as the actor sees it, or the same NOT_FOUND whether it is missing or hidden."""
    params: dict[str, Any] = {"tenant_id": actor.tenant_id, "pool_id": pool_id}
    if actor.ancestors:
        params["ancestors"] = list(actor.ancestors)
    rows = (await executor.execute(_VISIBLE_POOL[bool(actor.ancestors)], params)).all()
    if not rows:
        raise pool_not_found(pool_id)
    grant_rows = [_GrantRow(*(getattr(r, f"grant_{f}") for f in _GrantRow._fields)) for r in rows]
    return _pool_view(rows[0], actor.tenant_id, _best_grants(actor, grant_rows)[pool_id])


# `tenant_id`'s quota rows in some pools, each with the tenant's offer there (the rows a
# viewer granted by `tenant_id` books against: effective_quotas); built once.
_QUOTAS_OF = (
    select(
        QuotaRow.pool_id,
        QuotaRow.resource,
        QuotaRow.max,
        QuotaRow.used,
        Offer.tenant_id.label("offer_tenant"),
        Offer.include_descendants,
        Offer.priority,
        Offer.created_at,
    )
    .select_from(quotas_with_offers())
    .where(
        QuotaRow.tenant_id == bindparam("tenant_id"),
        QuotaRow.pool_id.in_(bindparam("pool_ids", expanding=True)),
    )
    .order_by(QuotaRow.pool_id, *_ORDER["quotas"])
)


async def quotas_of(
    executor: Executor, tenant_id: str, pool_ids: Sequence[str]
) -> dict[str, tuple[QuotaView, ...]]:
    """`tenant_id`'s rows in each pool, each with the tenant's offer there as its grant."""
    rows = await executor.execute(_QUOTAS_OF, {"tenant_id": tenant_id, "pool_ids": list(pool_ids)})
    found: dict[str, list[QuotaView]] = defaultdict(list)
    for r in rows:
        offer = (
            None if r.offer_tenant is None else (r.include_descendants, r.priority, r.created_at)
        )
        found[r.pool_id].append(
            quota_view(r.pool_id, tenant_id, (r.resource, r.max, r.used), offer)
        )
    return {pool_id: tuple(found.get(pool_id, ())) for pool_id in pool_ids}


QuotaRowValues = tuple[str, int, int]  # resource, max, used
OfferValues = tuple[bool, int, datetime]  # include_descendants, priority, created_at


def quota_view(
    pool_id: str, tenant_id: str, row: QuotaRowValues, offer: OfferValues | None
) -> QuotaView:
    """One of `tenant_id`'s quota rows as the tenant books against it, with its offer on
    the pool as its grant: as `quotas_of` reads them, and as an offer's resize answers
    from the rows it wrote (offers.offer_pool)."""
    grant = None if offer is None else GrantView(None, tenant_id, *offer)
    return QuotaView(*row, pool_id, grant)


async def effective_quotas(
    executor: Executor, pools: Sequence[PoolView]
) -> dict[str, tuple[QuotaView, ...]]:
    """The rows each pool's viewer books against: those of the tenant whose offer grants it
    the pool (its own, or an ancestor's with includeDescendants), as reservations book."""
    by_grant: dict[str, list[str]] = defaultdict(list)
    for pool in pools:
        by_grant[pool.grant.tenant_id].append(pool.id)
    found: dict[str, tuple[QuotaView, ...]] = {}
    for tenant_id, pool_ids in by_grant.items():
        found.update(await quotas_of(executor, tenant_id, pool_ids))
    return found


# Some pools' capacity rows; built once, the pools bound per call.
_CAPACITY_OF = (
    select(CapacityRow.__table__)
    .where(CapacityRow.pool_id.in_(bindparam("pool_ids", expanding=True)))
    .order_by(CapacityRow.pool_id, *_ORDER["capacity"])
)


async def capacity_of(
    executor: Executor, pool_ids: Sequence[str]
) -> dict[str, tuple[CapacityView, ...]]:
    rows = await executor.execute(_CAPACITY_OF, {"pool_ids": list(pool_ids)})
    found: dict[str, list[CapacityView]] = defaultdict(list)
    for r in rows:
        found[r.pool_id].append(CapacityView(r.resource, r.total, r.allocatable, r.booked))
    return {pool_id: tuple(found.get(pool_id, ())) for pool_id in pool_ids}


# Every offer of some pools with its quota rows (outer-joined), in offer order; built once.
_OFFER_QUOTA_COLUMNS = (
    Offer.pool_id,
    Offer.tenant_id,
    Offer.include_descendants,
    Offer.priority,
    Offer.created_at,
    QuotaRow.resource,
    QuotaRow.max,
    QuotaRow.used,
)
_OFFER_QUOTA_ORDER = (Offer.pool_id, *_ORDER["offers"], *OFFER.relation("quotas").order)
_OFFER_QUOTAS = Offer.__table__.outerjoin(QuotaRow.__table__, quota_offer())


def _offer_quotas(pools: ColumnElement[bool]) -> Select[Any]:
    found = select(*_OFFER_QUOTA_COLUMNS).select_from(_OFFER_QUOTAS).where(pools)
    return cast(Select[Any], found)


_OFFERS_OF = _offer_quotas(Offer.pool_id.in_(bindparam("pool_ids", expanding=True))).order_by(
    *_OFFER_QUOTA_ORDER
)
# One pool's: a plain `=`, not an IN list SQLAlchemy renders again on every call.
_OFFERS_OF_ONE = _offer_quotas(Offer.pool_id == bindparam("pool_id")).order_by(*_OFFER_QUOTA_ORDER)


def offers_of_pool(pool_id: Any) -> tuple[Subquery, tuple[Any, ...]]:
    """`_OFFERS_OF` for the pool `pool_id` names (a parameter), as a subquery to join, with
    its order as that subquery's columns (a subquery keeps no order): for a statement that
    reads them beside another (access.lock_owned_pool_with_offers)."""
    offers = _offer_quotas(Offer.pool_id == pool_id).subquery("offer_quotas")
    return offers, tuple(offers.corresponding_column(cast(Any, c)) for c in _OFFER_QUOTA_ORDER)


def owner_offer_locking_quotas(pool_id: Any, owner: Any) -> tuple[Subquery, tuple[Any, ...]]:
    """`offers_of_pool`'s rows for the owner's offer alone (`owner`, a parameter), its quota
    rows locked (FOR UPDATE, in their order) by a CTE the same statement joins instead of
    the table: the rows as the last commit left them, and no booking changes them until
    the lock's transaction ends (an archive's answer: offers.withdraw_guest_offers).
    Derived from `_offer_quotas`, so its columns, join and order are the read's own."""
    quotas = QuotaRow.__table__
    locked = (
        select(quotas)
        .where(quotas.c.pool_id == pool_id, quotas.c.tenant_id == owner)
        .order_by(*OFFER.relation("quotas").order)
        .with_for_update()
        .cte("own_quotas")
    )
    read = _offer_quotas(and_(Offer.pool_id == pool_id, Offer.tenant_id == owner))
    adapt = ClauseAdapter(locked)
    rows = adapt.traverse(read).subquery("own_offer")
    order = tuple(
        rows.corresponding_column(adapt.traverse(cast(Any, c))) for c in _OFFER_QUOTA_ORDER
    )
    return rows, order


async def offers_of(
    executor: Executor, pool_ids: Sequence[str]
) -> dict[str, tuple[OfferView, ...]]:
    """Every offer of each pool (the owner's included) with the offered tenant's quota rows,
    in one statement: each offer once per quota row it holds (or once, with none)."""
    rows = (await executor.execute(_OFFERS_OF, {"pool_ids": list(pool_ids)})).all()
    return _offer_views(rows, pool_ids)


async def offers_and_own_quotas(
    executor: Executor, pool: StoredPool
) -> tuple[tuple[OfferView, ...], tuple[QuotaView, ...]]:
    """`offers_of` one pool, and its owner's quota rows as `effective_quotas` gives them
    to the owner (its own offer their grant: the owner's offer is never withdrawn), from
    the same statement: an owned pool's two parts in one round trip."""
    rows = (await executor.execute(_OFFERS_OF_ONE, {"pool_id": pool.id})).all()
    return owned_parts_of(pool, rows)


class OfferQuota(NamedTuple):
    """One row as `_OFFERS_OF` gives it: an offer with one of its quota rows (resource
    None: it holds none)."""

    pool_id: str
    tenant_id: str
    include_descendants: bool
    priority: int
    created_at: Any
    resource: str | None
    max: Any
    used: Any


def owned_parts_of(
    pool: StoredPool, rows: Sequence[Any]
) -> tuple[tuple[OfferView, ...], tuple[QuotaView, ...]]:
    """`offers_and_own_quotas` over its rows, read or known (a create's, as it wrote them)."""
    own = tuple(
        quota_view(
            pool.id,
            pool.tenant_id,
            (r.resource, r.max, r.used),
            (r.include_descendants, r.priority, r.created_at),
        )
        for r in rows
        if r.tenant_id == pool.tenant_id and r.resource is not None
    )
    return _offer_views(rows, [pool.id])[pool.id], own


def _offer_views(rows: Sequence[Any], pool_ids: Sequence[str]) -> dict[str, tuple[OfferView, ...]]:
    """`_OFFERS_OF`'s rows as each pool's offers: each offer once per quota row it holds
    (or once, with none), in offer order."""
    grouped: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for r in rows:  # in offer order, each offer's rows in resource order
        grouped[(r.pool_id, r.tenant_id)].append(r)
    found: dict[str, list[OfferView]] = defaultdict(list)
    for (pool_id, tenant_id), held in grouped.items():
        first = held[0]
        found[pool_id].append(
            OfferView(
                tenant_id=tenant_id,
                include_descendants=first.include_descendants,
                priority=first.priority,
                quotas=tuple(
                    QuotaView(q.resource, q.max, q.used, pool_id)
                    for q in held
                    if q.resource is not None
                ),
            )
        )
    return {pool_id: tuple(found.get(pool_id, ())) for pool_id in pool_ids}


def reservation_view(row: Reservation | Row[Any]) -> ReservationView:
    return ReservationView(
        id=row.id,
        pool_id=row.pool_id,
        tenant_id=row.tenant_id,
        resources={k: int(v) for k, v in row.resources.items()},
        state=row.state,
        created_at=row.created_at,
        ended_at=row.ended_at,
    )


async def reservations_of(
    executor: Executor,
    tenant_id: str,
    pool_ids: Sequence[str] | None = None,
    *,
    after: str | None = None,
    limit: int | None = None,
) -> list[ReservationView]:
    """The tenant's own reservations, in id order, optionally in some pools only
    (read_rules.own_reservations, the compiled list's rule too)."""
    query = (
        select(Reservation.__table__)
        .where(own_reservations(tenant_id), reservations_after(after))
        .order_by(*RESERVATION_ORDER)
    )
    if pool_ids is not None:
        query = query.where(Reservation.pool_id.in_(pool_ids))
    if limit is not None:
        query = query.limit(limit)
    return [reservation_view(r) for r in (await executor.execute(query))]


async def reservations_pages(
    executor: Executor,
    tenant_id: str,
    pool_ids: Sequence[str],
    *,
    after: str | None,
    limit: int,
) -> dict[str, list[ReservationView]]:
    """The tenant's reservations in each pool, id order, at most `limit` per pool after
    `after`: one statement for any number of pools (read_rules.ReservationsPage, the
    compiled `Pool.reservations`' rule too, each pool's end found from its pool row)."""
    if not pool_ids:
        return {}
    table = Reservation.__table__
    pools = select(Pool.id).where(Pool.id.in_(pool_ids)).subquery("paged")
    page = ReservationsPage(pools.c.id, tenant_id, after, limit)
    rows = await executor.execute(
        select(table)
        .join_from(pools, table, table.c.pool_id == pools.c.id)
        .where(own_reservations(tenant_id), reservations_after(after), page.shown())
        .order_by(table.c.pool_id, *RESERVATION_ORDER)
    )
    found: dict[str, list[ReservationView]] = defaultdict(list)
    for r in rows:
        found[r.pool_id].append(reservation_view(r))
    return {pool_id: found.get(pool_id, []) for pool_id in pool_ids}
