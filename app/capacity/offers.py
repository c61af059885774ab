"""Sharing a pool: offer (create or resize) and unoffer."""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import (
    Select,
    Table,
    Update,
    and_,
    bindparam,
    delete,
    exists,
    func,
    insert,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.elements import BindParameter

from app.capacity.access import (
    LockedPool,
    check_version,
    joined_values,
    lock_owned_pool_row,
    lock_owned_pool_with,
    locking_first,
    locking_with,
)
from app.capacity.bounds import MAX_OFFERS_PER_POOL, MAX_RESOURCES
from app.capacity.changes import offer_changes, offer_entry
from app.capacity.impact import unoffer_impact
from app.capacity.inputs import OfferPoolInput, UnofferPoolInput
from app.capacity.pool_reads import offered_pool_detail, owned_pool_detail
from app.capacity.pool_rows import forget_loaded, sync_loaded, write_pool
from app.capacity.projection import (
    among,
    authz_values,
    for_tenants,
    put_authz_row,
    remove_authz_rows,
    removing_authz_rows,
)
from app.capacity.reads import OfferQuota, owner_offer_locking_quotas, quota_view
from app.capacity.views import ImpactView, PoolDetail
from app.catalog import OFFER_POOL, UNOFFER_POOL
from app.db.engine import Executor
from app.db.models import Node, Offer, Pool, QuotaRow, Tenant, utcnow
from app.db.session_statements import SessionStatements
from app.db.uow import UnitOfWork
from app.errors import InvalidInput, InvalidState, NotFound, ResourceExhausted
from app.events.outbox import PendingEvent
from app.iam.principal import Principal

SHARED_GPU_MODES = ("timeslice", "mps")

# Statements every call runs alike, built once; the pool is bound per call.
_OFFERS_ON = select(Offer).where(Offer.pool_id == bindparam("pool_id")).order_by(Offer.tenant_id)
# The same offers as rows, not entities: what a write reads of them (built once).
_OFFER_ROWS = (
    select(Offer.tenant_id, Offer.include_descendants, Offer.priority)
    .where(Offer.pool_id == bindparam("pool_id"))
    .order_by(Offer.tenant_id)
)


async def _check_offer_state(
    uow: UnitOfWork, pool: LockedPool, inp: OfferPoolInput, facts: Row[Any]
) -> None:
    """The seed's INVALID_STATE rules for offer, over the facts of `_OFFER_FACTS`."""
    if pool.archived:
        raise InvalidState(f"pool {pool.id} is archived", field="poolId")
    to_guest = inp.to_tenant_id != pool.tenant_id
    # The owner's own offer with includeDescendants shares the pool with its subtree.
    shared = to_guest or inp.include_descendants
    if shared and pool.sharing in SHARED_GPU_MODES:
        raise InvalidState(
            f"a {pool.sharing} pool can only be offered to its owner, without descendants",
            field="toTenantId",
        )
    if shared and facts.tenant_nodes:
        raise InvalidState(
            "a pool holding tenant-owned nodes can only be offered to its owner, "
            "without descendants",
            field="toTenantId",
        )
    if pool.policy.get("singleTenant"):
        if inp.include_descendants:
            raise InvalidState(
                "a singleTenant pool cannot be offered with includeDescendants",
                field="includeDescendants",
            )
        # The owner resizing its own rows adds no tenant, so only a guest offer can clash.
        others = {pool.tenant_id, inp.to_tenant_id}
        offers = await offer_rows(uow.statements, pool.id)
        if to_guest and any(o.tenant_id not in others for o in offers):
            raise InvalidState(
                "a singleTenant pool is already offered to another tenant", field="toTenantId"
            )


def _check_offer_bounds(inp: OfferPoolInput, *, offers: int | None, rows: set[str]) -> None:
    """Sizes that grow with each offer (app/capacity/bounds.py). Rows not named keep their
    value, so successive offers could otherwise pile up rows a single map cannot hold.
    `offers`: the pool's offers, for a new offer (None: the target's is resized)."""
    held = len(rows | set(inp.quota))
    if held > MAX_RESOURCES:
        raise ResourceExhausted(
            f"a tenant may hold at most {MAX_RESOURCES} quota rows on a pool; "
            f"this offer would leave {inp.to_tenant_id} {held}",
            field="quota",
            limit="quotaRowsPerTenant",
            max=MAX_RESOURCES,
        )
    if offers is not None and offers >= MAX_OFFERS_PER_POOL:
        raise ResourceExhausted(
            f"a pool may be offered to at most {MAX_OFFERS_PER_POOL} tenants, its owner included",
            field="toTenantId",
            limit="offersPerPool",
            max=MAX_OFFERS_PER_POOL,
        )


def next_version(pool: Pool | LockedPool) -> dict[str, Any]:
    """Every write that changes what the pool shows (its offers and quota maxima included)
    moves it to the next version; bookings change only `used` and leave it (ADR 0004).
    The values to write (pool_rows.write_pool)."""
    return {"version": pool.version + 1, "updated_at": utcnow()}


def bump_version(pool: Pool) -> None:
    """`next_version`, set on a loaded Pool (flushed by the session)."""
    for name, value in next_version(pool).items():
        setattr(pool, name, value)


async def offers_on(session: AsyncSession, pool_id: str) -> list[Offer]:
    """Every offer of a pool, the owner's included."""
    return list((await session.execute(_OFFERS_ON, {"pool_id": pool_id})).scalars())


async def offer_rows(executor: Executor, pool_id: str) -> Sequence[Row[str, bool, int]]:
    """Every offer of a pool as (tenant_id, include_descendants, priority) rows, in tenant
    order: `offers_on` for a write that changes none of them."""
    return (await executor.execute(_OFFER_ROWS, {"pool_id": pool_id})).all()


_OFFERS: Table = Offer.__table__  # type: ignore[assignment]
_QUOTAS: Table = QuotaRow.__table__  # type: ignore[assignment]
# Withdrawing offers, by Core statements built once (the unit of work's statements).
_DELETE_OFFER = delete(_OFFERS).where(
    _OFFERS.c.pool_id == bindparam("pool_key"), _OFFERS.c.tenant_id == bindparam("tenant")
)
_DELETE_GUEST_OFFERS = (
    delete(_OFFERS)
    .where(_OFFERS.c.pool_id == bindparam("pool_key"), _OFFERS.c.tenant_id != bindparam("owner"))
    .returning(_OFFERS.c.tenant_id)
)


def _dropping_withdrawn(tenants: BindParameter[Any] | Select[Any]) -> Update:
    """The tenants' quota rows of a pool drop to what is in use, in one statement that first
    locks them in resource order (tenant by tenant), as bookings and releases take them:
    its subquery's FOR UPDATE locks rows in its ORDER BY's order before the UPDATE writes
    them. `tenants` a list bound per call, or a subquery (`_WITHDRAW_GUESTS`)."""
    rows = (_QUOTAS.c.pool_id == bindparam("pool_key")) & among(_QUOTAS.c.tenant_id, tenants)
    locked = (
        select(_QUOTAS.c.tenant_id, _QUOTAS.c.resource)
        .where(rows)
        .order_by(_QUOTAS.c.tenant_id, _QUOTAS.c.resource)
        .with_for_update()
    )
    return (
        update(_QUOTAS)
        .where(rows, tuple_(_QUOTAS.c.tenant_id, _QUOTAS.c.resource).in_(locked))
        .values(max=_QUOTAS.c.used)
    )


_DROP_WITHDRAWN = for_tenants(_dropping_withdrawn)
# An archive's withdrawal on PostgreSQL: the guests' offers, authz rows and quota maxima
# in one statement, the same three writes with the deleted offers' tenants as their list
# (of one snapshot: none of them reads what another writes). It answers the guests
# (`removed`, one array) beside the owner's offer with its quota rows, locked by the same
# statement (reads.owner_offer_locking_quotas): what the archive answers.
_GONE = _DELETE_GUEST_OFFERS.cte("gone")
_GONE_TENANTS = select(_GONE.c.tenant_id)
_REMOVED = select(func.array_agg(_GONE.c.tenant_id).label("removed")).subquery("removed")
_OWN, _OWN_ORDER = owner_offer_locking_quotas(bindparam("pool_key"), bindparam("owner"))
_WITHDRAW_GUESTS = (
    select(_REMOVED.c.removed, *(_OWN.c[name] for name in OfferQuota._fields))
    .select_from(_REMOVED.outerjoin(_OWN, true()))
    .order_by(*_OWN_ORDER)
    .add_cte(
        removing_authz_rows(_GONE_TENANTS).cte("authz_gone"),
        _dropping_withdrawn(_GONE_TENANTS).cte("quotas_dropped"),
    )
)


def _offer_with_quotas(pool: Any, tenant: Any) -> Select[Any]:
    """An offer with its tenant's quota rows (none, or one row per resource)."""
    return (
        select(_OFFERS.c.include_descendants, _OFFERS.c.priority, _QUOTAS.c.resource, _QUOTAS.c.max)
        .select_from(
            _OFFERS.outerjoin(
                _QUOTAS,
                and_(
                    _QUOTAS.c.pool_id == _OFFERS.c.pool_id,
                    _QUOTAS.c.tenant_id == _OFFERS.c.tenant_id,
                ),
            )
        )
        .where(_OFFERS.c.pool_id == pool, _OFFERS.c.tenant_id == tenant)
    )


# Built once: alone (bound: pool_key, tenant), and read with the pool's lock (an unoffer's;
# bound: pool_id, to_tenant).
_OFFER_WITH_QUOTAS = _offer_with_quotas(bindparam("pool_key"), bindparam("tenant"))
_OFFER_COLUMNS = tuple(_OFFER_WITH_QUOTAS.selected_columns.keys())
_HELD_OFFER = _offer_with_quotas(bindparam("pool_id"), bindparam("to_tenant")).subquery("held")
_LOCK_WITH_OFFER = locking_with(
    _HELD_OFFER, (_HELD_OFFER.c.resource,), _HELD_OFFER.c.include_descendants
)


# An offer's own rows as offer writes them; built once, the pool and tenant bound per call.
_AT_OFFER = (_OFFERS.c.pool_id == bindparam("pool_key")) & (
    _OFFERS.c.tenant_id == bindparam("tenant")
)
_AT_QUOTAS = (_QUOTAS.c.pool_id == bindparam("pool_key")) & (
    _QUOTAS.c.tenant_id == bindparam("tenant")
)
_LOCK_QUOTAS = (
    select(_QUOTAS.c.resource, _QUOTAS.c.max, _QUOTAS.c.used)
    .where(_AT_QUOTAS)
    .order_by(_QUOTAS.c.resource)
    .with_for_update()
)
# What offer checks before it writes, in one statement: the target's offer (its flags,
# NULL when it has none), the pool's offer count, whether the pool holds tenant-owned
# nodes, and whether the target tenant exists. Read under the pool's lock (offers change
# only under it); the rules look at them in the seed's order (no tenant oracle).
_OFFER_FACTS = select(
    select(_OFFERS.c.include_descendants)
    .where(_AT_OFFER)
    .scalar_subquery()
    .label("include_descendants"),
    select(_OFFERS.c.priority).where(_AT_OFFER).scalar_subquery().label("priority"),
    select(_OFFERS.c.created_at).where(_AT_OFFER).scalar_subquery().label("created_at"),
    select(func.count())
    .select_from(_OFFERS)
    .where(_OFFERS.c.pool_id == bindparam("pool_key"))
    .scalar_subquery()
    .label("offers"),
    exists()
    .where(Node.pool_id == bindparam("pool_key"), Node.owner_tenant_id.is_not(None))
    .label("tenant_nodes"),
    exists().where(Tenant.id == bindparam("tenant")).label("tenant_exists"),
)
# The facts with the target's quota rows, locked (a concurrent release must not change
# `used` under a resize), in one statement: one row per quota row, or one with NULL
# resource when it holds none. The lock comes before the rules look (a refusal held it
# for nothing, and let it go at once).
_FACTS = _OFFER_FACTS.subquery("facts")
_LOCKED = _LOCK_QUOTAS.subquery("locked")
_OFFER_FACTS_AND_QUOTAS = (
    select(_FACTS, _LOCKED.c.resource, _LOCKED.c.max, _LOCKED.c.used)
    .select_from(_FACTS.outerjoin(_LOCKED, true()))
    .order_by(_LOCKED.c.resource)
)
# On PostgreSQL read with the pool's lock, in the same statement, after it
# (access.lock_owned_pool_with): the facts as `OfferFacts`.
_LOCK_WITH_FACTS = locking_first(_OFFER_FACTS_AND_QUOTAS, "offers", ("resource",))
OfferFacts = namedtuple(  # type: ignore[misc]  # the statement's own column names
    "OfferFacts", tuple(_OFFER_FACTS_AND_QUOTAS.selected_columns.keys())
)
_ADD_OFFER = insert(_OFFERS)
_SET_OFFER = update(_OFFERS).where(_AT_OFFER)
_ADD_QUOTA = insert(_QUOTAS)
_SET_QUOTA = (
    update(_QUOTAS)
    .where(_AT_QUOTAS, _QUOTAS.c.resource == bindparam("key"))
    .values(max=bindparam("set_max"))
)


async def withdraw_offer(statements: SessionStatements, pool_id: str, tenant_id: str) -> None:
    """Remove an offer: its authz row goes, its quota rows drop to what is in use. Blind
    writes, all three: an unoffer's ride in its event INSERT (app/db/carried_writes.py)."""
    await statements.write_later(_DELETE_OFFER, {"pool_key": pool_id, "tenant": tenant_id})
    await _withdrawn(statements, pool_id, [tenant_id])


async def withdraw_guest_offers(
    statements: SessionStatements, pool: LockedPool
) -> tuple[list[str], list[OfferQuota] | None]:
    """Remove every offer but the owner's, each as `withdraw_offer` removes one, in the
    same statements however many there are; returns the guests, in tenant order, and on
    PostgreSQL the owner's offer with its quota rows (as reads.offers_of_pool gives them),
    else None. On PostgreSQL one statement (`_WITHDRAW_GUESTS`): it locks the guests'
    quota rows and the owner's, still before the archive's capacity rows
    (docs/decisions/0004, "Deadlocks"); every quota row of the pool is then held, so no
    booking changes the owner's rows before the archive commits, and they are its answer."""
    at = {"pool_key": pool.id, "owner": pool.tenant_id}
    if statements.dialect != "postgresql":
        removed = await statements.execute(_DELETE_GUEST_OFFERS, at)
        guests = sorted(removed.scalars())
        await _withdrawn(statements, pool.id, guests)  # with none, as many statements
        return guests, None
    found = (await statements.execute(_WITHDRAW_GUESTS, at)).all()
    guests = sorted(found[0].removed or ())
    fields = OfferQuota._fields
    own = [OfferQuota(*(getattr(r, f) for f in fields)) for r in found if r.tenant_id is not None]
    await _withdrawn(statements, pool.id, guests, sent=True)
    return guests, own


async def _withdrawn(
    statements: SessionStatements, pool_id: str, tenant_ids: Sequence[str], *, sent: bool = False
) -> None:
    """After their offers are deleted: the tenants' authz rows go, their quota rows drop
    to what is in use (`sent`: both went with the offers, `_WITHDRAW_GUESTS`). The session
    forgets the withdrawn offers it had loaded (a fleet apply's), and gives its loaded
    quota rows their new maxima."""
    await remove_authz_rows(statements, pool_id, tenant_ids, sent=sent)
    if not sent:
        await statements.write_later(*_DROP_WITHDRAWN.bound(pool_id, tenant_ids))
    gone = set(tenant_ids)
    forget_loaded(statements, Offer, lambda o: o.pool_id == pool_id and o.tenant_id in gone)
    sync_loaded(
        statements,
        QuotaRow,
        lambda q: q.pool_id == pool_id and q.tenant_id in gone,
        lambda q: {"max": q.used},
    )


async def offer_pool(uow: UnitOfWork, principal: Principal, inp: OfferPoolInput) -> PoolDetail:
    statements = uow.statements
    at = {"pool_key": inp.pool_id, "tenant": inp.to_tenant_id}
    found: Sequence[Any] | None = None
    if statements.dialect == "postgresql":  # the facts with the lock, when still current
        pool, held = await lock_owned_pool_with(
            uow, principal, inp.tenant_id, inp.pool_id, OFFER_POOL, _LOCK_WITH_FACTS, at
        )
        if held is not None:
            names = OfferFacts._fields
            found = [OfferFacts(*values) for values in joined_values(held, names)]
    else:
        pool = await lock_owned_pool_row(uow, principal, inp.tenant_id, inp.pool_id, OFFER_POOL)
    check_version(pool, inp.version)
    # The state rules and the bounds come before the target tenant's existence: a pool that
    # refuses an offer refuses it alike whether toTenantId exists or not (no tenant oracle).
    if found is None:
        found = (await statements.execute(_OFFER_FACTS_AND_QUOTAS, at)).all()
    facts = found[0]
    await _check_offer_state(uow, pool, inp, facts)
    offer = None if facts.include_descendants is None else facts
    rows = {row.resource: row for row in found if row.resource is not None}
    _check_offer_bounds(inp, offers=facts.offers if offer is None else None, rows=set(rows))
    target_exists = facts.tenant_exists
    if not target_exists and principal.is_fleet_admin:
        # A fleet admin may act for any tenant, so it learns which exist from tenantId
        # anyway: it is told, which catches a typo in a fleet file.
        raise NotFound(f"tenant {inp.to_tenant_id} not found", field="toTenantId")
    # Anyone else cannot see other tenants, and the seed has it offer to them: an offer to
    # a missing tenant is taken and answered as one to a real tenant, and stays inert (no
    # caller acts for a missing tenant) unless a tenant of that id is made (ADR 0001).

    before = (
        None
        if offer is None
        else offer_entry(
            offer.include_descendants, offer.priority, {r: q.max for r, q in rows.items()}
        )
    )
    after_quota = {r: q.max for r, q in rows.items()}
    flags = {"include_descendants": inp.include_descendants, "priority": inp.priority}
    # A resize that keeps the offer's flags leaves its row, and its authz row (the pool's
    # attributes and includeDescendants), as they are.
    flags_moved = offer is not None and (offer.include_descendants, offer.priority) != (
        inp.include_descendants,
        inp.priority,
    )
    added: list[dict[str, Any]] = []
    resized: list[dict[str, Any]] = []
    for resource, maximum in inp.quota.items():
        row = rows.get(resource)
        if row is None:
            added.append(
                {
                    "pool_id": pool.id,
                    "tenant_id": inp.to_tenant_id,
                    "resource": resource,
                    "max": maximum,
                    "used": 0,
                }
            )
            after_quota[resource] = maximum
        else:
            after_quota[resource] = max(maximum, row.used)  # never below what is in use
            if after_quota[resource] != row.max:
                resized.append({**at, "key": resource, "set_max": after_quota[resource]})
    # A resize that adds no row knows every row the tenant then holds: those it locked, in
    # their order, at their new maxima. It answers from them (reads.quota_view), so nothing
    # reads the offer's and rows' writes, and they ride in the event's INSERT (blind
    # writes). Rows added come back in the database's order: written now and read back.
    known = None
    if offer is not None and not added and inp.to_tenant_id != pool.tenant_id:
        terms = (inp.include_descendants, inp.priority, offer.created_at)
        known = tuple(
            quota_view(pool.id, inp.to_tenant_id, (r, after_quota[r], row.used), terms)
            for r, row in rows.items()
        )
    if offer is None:
        await statements.execute(
            _ADD_OFFER,
            {"pool_id": pool.id, "tenant_id": inp.to_tenant_id, **flags, "created_at": utcnow()},
        )
    elif flags_moved:
        if known is None:
            await statements.execute(_SET_OFFER, {**at, **flags})
        else:
            await statements.write_later(_SET_OFFER, {**at, **flags})
    if added:
        await statements.execute_many(_ADD_QUOTA, added)
    if resized:
        if known is None:
            await statements.execute_many(_SET_QUOTA, resized)
        else:
            for one in resized:
                await statements.write_later(_SET_QUOTA, one)
        new_max = {r["key"]: r["set_max"] for r in resized}
        sync_loaded(
            statements,
            QuotaRow,
            lambda q: (
                (q.pool_id, q.tenant_id) == (pool.id, inp.to_tenant_id) and q.resource in new_max
            ),
            lambda q: {"max": new_max[q.resource]},
        )
    if flags_moved:
        sync_loaded(
            statements,
            Offer,
            lambda o: (o.pool_id, o.tenant_id) == (pool.id, inp.to_tenant_id),
            lambda _: flags,
        )
    after = offer_entry(inp.include_descendants, inp.priority, after_quota)
    authz_row = authz_values(pool, inp.to_tenant_id, inp.include_descendants)
    written = next_version(pool)
    # The answer is read first: it reads the offer and quota rows (written above), which
    # neither the pool's row nor the authz row changes, so those two writes ride in the
    # event's INSERT (app/db/carried_writes.py).
    shown = replace(pool, **written)  # the pool as write_pool leaves it
    # The seed: "returns the pool as that tenant sees it", the offered tenant.
    if inp.to_tenant_id == pool.tenant_id:
        detail = await owned_pool_detail(statements, principal, shown)
    else:
        detail = await offered_pool_detail(
            statements, principal, shown, inp.to_tenant_id, authz_row, known
        )
    if offer is None or offer.include_descendants != inp.include_descendants:
        await put_authz_row(
            statements,
            pool,
            inp.to_tenant_id,
            include_descendants=inp.include_descendants,
            new_offer=offer is None,
        )
    pool = await write_pool(statements, pool, written)
    uow.emit(
        PendingEvent(
            type="pool.offered",
            pool_id=pool.id,
            tenant_id=inp.tenant_id,
            data={
                "toTenantId": inp.to_tenant_id,
                "quota": dict(inp.quota),
                "includeDescendants": inp.include_descendants,
                "priority": inp.priority,
                "version": pool.version,
                "changes": offer_changes(inp.to_tenant_id, before, after),
            },
            audience=frozenset({pool.tenant_id, inp.to_tenant_id}),
        )
    )
    return detail


async def unoffer_pool(
    uow: UnitOfWork, principal: Principal, inp: UnofferPoolInput
) -> bool | ImpactView:
    # The offer comes with the lock, unless the pool moved while the lock was awaited.
    pool, held = await lock_owned_pool_with(
        uow,
        principal,
        inp.tenant_id,
        inp.pool_id,
        UNOFFER_POOL,
        _LOCK_WITH_OFFER,
        {"to_tenant": inp.to_tenant_id},
    )
    if inp.to_tenant_id == pool.tenant_id:
        raise InvalidInput("a pool cannot be unoffered from its owner", field="toTenantId")
    check_version(pool, inp.version)
    if inp.dry_run:
        return await unoffer_impact(uow.session, principal, pool, inp.to_tenant_id)
    if held is None:
        at = {"pool_key": pool.id, "tenant": inp.to_tenant_id}
        found = [tuple(r) for r in await uow.statements.execute(_OFFER_WITH_QUOTAS, at)]
    else:
        found = joined_values(held, _OFFER_COLUMNS)
    if not found:  # no such offer
        return False
    include_descendants, priority = found[0][:2]
    quota = {resource: maximum for _, _, resource, maximum in found if resource is not None}
    before = offer_entry(include_descendants, priority, quota)
    await withdraw_offer(uow.statements, pool.id, inp.to_tenant_id)
    pool = await write_pool(uow.statements, pool, next_version(pool))
    uow.emit(
        PendingEvent(
            type="pool.unoffered",
            pool_id=pool.id,
            tenant_id=inp.tenant_id,
            data={
                "toTenantId": inp.to_tenant_id,
                "version": pool.version,
                "changes": offer_changes(inp.to_tenant_id, before, None),
            },
            audience=frozenset({pool.tenant_id, inp.to_tenant_id}),
        )
    )
    return True
