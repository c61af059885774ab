"""The IAM steps every method shares, in CONTRACT section 2's order.

authentication (done by the transport) -> input validation -> the tenant decision ->
visibility (NOT_FOUND) -> the permission on the pool (PERMISSION_DENIED) -> state rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from sqlalchemy import (
    Row,
    Select,
    String,
    Subquery,
    Table,
    and_,
    bindparam,
    literal_column,
    select,
    true,
)
from sqlalchemy.ext.asyncio import AsyncSession

from app.capacity.read_rules import caller_live
from app.capacity.reads import (
    Actor,
    OfferQuota,
    load_lineage,
    offers_of_pool,
    pool_not_found,
)
from app.capacity.views import PoolView, StoredPool
from app.catalog import Method
from app.db.engine import Executor
from app.db.models import AuthzRow, Pool
from app.db.session_statements import SessionStatements
from app.db.uow import UnitOfWork
from app.errors import Conflict, PermissionDenied
from app.events.outbox import note_pool_lock
from app.iam.decisions import (
    PoolAttributes,
    allows_pool,
    decide_acting_for,
    decide_pool,
    decide_tenant,
)
from app.iam.principal import Principal
from app.iam.roles import CAPACITY_READ, POOLS_SHARE


async def resolve_actor(
    executor: Executor, principal: Principal, tenant_id: str, method: Method
) -> Actor:
    """The tenant decision, as the method's catalog row says. A method on compute-tenant
    (list, create, ...) needs its permission on the tenant. On compute-pool the tenant
    decision is only whether the caller may act for the tenant: the permission is decided
    on the pool once it is visible, so a pool the tenant cannot see is NOT_FOUND whatever
    the caller's role (CONTRACT 2)."""
    decide_actor(principal, tenant_id, method)
    return Actor(principal, tenant_id, await load_lineage(executor, tenant_id))


def decide_actor(principal: Principal, tenant_id: str, method: Method) -> None:
    """`resolve_actor`'s decision alone, for a write that needs no lineage (it checks the
    tenant exists by a column of its own first read: reads.TENANT_KNOWN)."""
    if method.resource_type == "compute-pool":
        decide_acting_for(principal, tenant_id)
    else:
        decide_tenant(principal, tenant_id, method.permission)


def attributes_of(row: AuthzRow) -> PoolAttributes:
    return PoolAttributes(row.gpu_model, row.pool_class, row.sharing, row.region, row.owned)


async def pool_attributes(
    executor: Executor, tenant_id: str, pool_ids: Sequence[str]
) -> dict[str, PoolAttributes]:
    """Each pool's attributes as the tenant's authz row carries them, read from the pool
    itself: a reservation outlives the row (unoffer, archive) but not the binding."""
    if not pool_ids:
        return {}
    rows = await executor.execute(
        select(
            Pool.id, Pool.tenant_id, Pool.gpu_model, Pool.pool_class, Pool.sharing, Pool.region
        ).where(Pool.id.in_(pool_ids))
    )
    return {
        r.id: PoolAttributes(
            r.gpu_model, r.pool_class, r.sharing, r.region, r.tenant_id == tenant_id
        )
        for r in rows
    }


async def lock_owned_pool(
    session: AsyncSession, actor: Actor, pool_id: str, permission: str
) -> Pool:
    """Lock a pool the actor owns for a write. Anyone else gets NOT_FOUND (seed).

    FOR NO KEY UPDATE, not FOR UPDATE: owner writes exclude each other, while the key-share
    lock of a reservation's foreign key never makes them wait (docs/decisions/0004)."""
    found = (
        await session.execute(_LOCK_OWNED_POOL, {"pool_id": pool_id, "tenant_id": actor.tenant_id})
    ).one_or_none()
    owner_row: AuthzRow | None = None if found is None else found.AuthzRow
    if found is None or found.Pool.tenant_id != actor.tenant_id:
        raise pool_not_found(pool_id)
    _owned(
        session,
        actor.principal,
        pool_id,
        None if owner_row is None else attributes_of(owner_row),
        permission,
    )
    pool: Pool = found.Pool
    return pool


async def lock_owned_pool_row(
    uow: UnitOfWork, principal: Principal, tenant_id: str, pool_id: str, method: Method
) -> LockedPool:
    """`resolve_actor` and `lock_owned_pool` of a method on compute-pool, in one statement
    (with a remembered caller's check, uow.caller_params), the pool read as a row
    (`LockedPool`), not loaded as an entity: for a write that changes it by Core statements
    (app/capacity/pool_rows.py). The owner acting for itself needs no lineage (a write
    returns the pool as its owner sees it: pool_reads.owned_pool_detail); a pool missing
    or not the tenant's is refused as before, NOT_FOUND on tenantId first for a tenant
    that does not exist."""
    pool, _ = await _locked(uow, principal, tenant_id, pool_id, method, _LOCK_OWNED_ROW, {})
    return pool


async def lock_owned_pool_with(
    uow: UnitOfWork,
    principal: Principal,
    tenant_id: str,
    pool_id: str,
    method: Method,
    statement: Select[Any],
    params: Mapping[str, Any],
) -> tuple[LockedPool, list[Row[Any]] | None]:
    """`lock_owned_pool_row` with rows of other tables read in the same statement
    (`statement`, made by `locking_with` or `locking_first`; `params` binds theirs): the
    rows that matched (their columns `joined_<name>`). None for them when the pool's row
    moved before the lock was granted (the statement's `moved`): PostgreSQL re-reads only
    the locked row then, so rows beside it are of the statement's snapshot, older than
    the lock, and the caller reads them again."""
    pool, found = await _locked(uow, principal, tenant_id, pool_id, method, statement, params)
    if found[0].moved:
        return pool, None
    return pool, [r for r in found if r.joined_matched]


async def lock_owned_pool_with_offers(
    uow: UnitOfWork, principal: Principal, tenant_id: str, pool_id: str, method: Method
) -> tuple[LockedPool, list[OfferQuota] | None]:
    """`lock_owned_pool_with` the pool's offers and their quota rows
    (reads.offers_of_pool): for a write that reads them whatever it does (an update)."""
    pool, found = await lock_owned_pool_with(
        uow, principal, tenant_id, pool_id, method, _LOCK_OWNED_WITH_OFFERS, {}
    )
    if found is None:
        return pool, None
    return pool, [OfferQuota(*values) for values in joined_values(found, OfferQuota._fields)]


def joined_values(rows: Sequence[Row[Any]], names: Sequence[str]) -> list[tuple[Any, ...]]:
    """The columns `names` of the rows `lock_owned_pool_with` gave (`locking_with` labels
    them `joined_<name>`), in that order."""
    return [tuple(getattr(r, f"joined_{name}") for name in names) for r in rows]


async def _locked(
    uow: UnitOfWork,
    principal: Principal,
    tenant_id: str,
    pool_id: str,
    method: Method,
    statement: Select[Any],
    params: Mapping[str, Any],
) -> tuple[LockedPool, Sequence[Row[Any]]]:
    """The pool `statement` locks, decided as `lock_owned_pool_row` says, and every row the
    statement gave (at least one)."""
    assert method.resource_type == "compute-pool"
    decide_acting_for(principal, tenant_id)
    bound = {**params, "pool_id": pool_id, "tenant_id": tenant_id, **uow.caller_params()}
    rows = (await uow.statements.execute(statement, bound)).all()
    found = rows[0] if rows else None
    if found is None or found.tenant_id != tenant_id:
        await load_lineage(uow.statements, tenant_id)  # NOT_FOUND for an unknown tenant
        raise pool_not_found(pool_id)
    uow.caller_seen(found.caller_live)
    owned = None
    if found.owner_owned is not None:
        owned = PoolAttributes(
            found.owner_gpu_model,
            found.owner_pool_class,
            found.owner_sharing,
            found.owner_region,
            found.owner_owned,
        )
    _owned(uow.statements, principal, pool_id, owned, method.permission)
    return LockedPool(**{name: getattr(found, name) for name in POOL_COLUMNS}), rows


def _owned(
    tx: AsyncSession | SessionStatements,
    principal: Principal,
    pool_id: str,
    owner_row: PoolAttributes | None,
    permission: str,
) -> None:
    """The rule of both lock reads, over a pool the actor's tenant owns (anything else is
    NOT_FOUND before this) and the actor's own authz row's attributes."""
    note_pool_lock(tx, pool_id)  # the pool's events may be written (events/outbox.py)
    if owner_row is None:  # the projection always holds the owner's row
        raise pool_not_found(pool_id)
    decide_pool(principal, permission, owner_row)


# A locked pool's row as a write reads and changes it (pool_rows.write_pool): the pool's
# stored columns, the same record the read model's PoolView is built on.
LockedPool = StoredPool
POOL_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(StoredPool))


# The pool's row locked, with the actor's own authz row beside it (outer-joined: only the
# pool's row is locked, as a key-share-compatible FOR NO KEY UPDATE), built once; as
# entities, and as the pool's columns with the row's attributes beside them.
_LOCK_OWNED_POOL = (
    select(Pool, AuthzRow)
    .outerjoin(
        AuthzRow,
        and_(AuthzRow.pool_id == Pool.id, AuthzRow.tenant_id == bindparam("tenant_id")),
    )
    .where(Pool.id == bindparam("pool_id"))
    .with_for_update(key_share=True, of=Pool)
)
_POOLS: Table = Pool.__table__  # type: ignore[assignment]
_AUTHZ: Table = AuthzRow.__table__  # type: ignore[assignment]
_LOCK_OWNED_ROW = (
    select(
        *(_POOLS.c[name] for name in POOL_COLUMNS),
        *(
            _AUTHZ.c[name].label(f"owner_{name}")
            for name in ("gpu_model", "pool_class", "sharing", "region", "owned")
        ),
        caller_live(bindparam("token", type_=String()), bindparam("role", type_=String())).label(
            "caller_live"
        ),
    )
    .select_from(
        _POOLS.outerjoin(
            _AUTHZ,
            and_(_AUTHZ.c.pool_id == _POOLS.c.id, _AUTHZ.c.tenant_id == bindparam("tenant_id")),
        )
    )
    .where(_POOLS.c.id == bindparam("pool_id"))
    .with_for_update(key_share=True, of=_POOLS)
)
_SEEN = _POOLS.alias("seen")


def locking_with(rows: Subquery, order: Sequence[Any], matched: Any) -> Select[Any]:
    """`_LOCK_OWNED_ROW` with `rows` outer-joined (one row per row of theirs, or one with
    none; their columns labelled `joined_<name>`, `joined_matched` true where one
    matched: `matched`, a column of theirs never null in a row), in `order` (columns of
    `rows`), and `moved`: the locked row's version is not the one the statement's
    snapshot holds (the locked row's own columns are re-read once the lock is granted).
    For rows that change only under the pool's lock, by writes that move its version
    (offers and their quota rows' maxima). For `lock_owned_pool_with`; `rows` binds
    `pool_id` for the pool."""
    snapshot_version = (
        select(_SEEN.c.version).where(_SEEN.c.id == bindparam("pool_id")).scalar_subquery()
    )
    return (
        _LOCK_OWNED_ROW.add_columns(
            (_POOLS.c.version != snapshot_version).label("moved"),
            matched.is_not(None).label("joined_matched"),
            *(c.label(f"joined_{c.key}") for c in rows.c),
        )
        .outerjoin(rows, true())
        .order_by(*order)
    )


def locking_first(rows: Select[Any], matched: str, order: Sequence[str]) -> Select[Any]:
    """PostgreSQL: `_LOCK_OWNED_ROW` first, then `rows`, which may lock rows of their own
    (FOR UPDATE), so that they are locked after the pool's row, in the order of ADR 0004
    ("Deadlocks"). The pool's lock is taken in a materialized CTE, and `rows` are read
    by a lateral join on it: a nested loop, which reads them for the locked row only,
    once it is locked, and only when the pool is the acting tenant's (`tenant_id`):
    another tenant's caller, refused NOT_FOUND, locks none of them. `rows`' columns come
    labelled `joined_<name>`, in `order` (names of theirs), `joined_matched` true where
    `matched`, a column of theirs never null in a row, is set. `moved` is true when the
    locked row is not the version the statement's snapshot holds (its `xmin`: any write
    to the row since, a version moved or not; a tenant-owned node's join writes it,
    app/capacity/nodes.py): then `rows`, of that snapshot, may be older than the lock
    (`lock_owned_pool_with`). For rows that change without the version: an offer's facts
    (tenant-owned nodes)."""
    snapshot_xmin = (
        select(literal_column("seen.xmin::text"))
        .where(_SEEN.c.id == bindparam("pool_id"))
        .scalar_subquery()
    )
    locked = (
        _LOCK_OWNED_ROW.add_columns(
            (literal_column("pools.xmin::text") != snapshot_xmin).label("moved")
        )
        .cte("locked_pool")
        .prefix_with("MATERIALIZED", dialect="postgresql")
    )
    joined = rows.where(locked.c.tenant_id == bindparam("tenant_id")).lateral("joined")
    return (
        select(
            locked,
            joined.c[matched].is_not(None).label("joined_matched"),
            *(c.label(f"joined_{c.key}") for c in joined.c),
        )
        .select_from(locked.outerjoin(joined, true()))
        .order_by(*(joined.c[name] for name in order))
    )


# The pool with its offers and their quota rows (an update's).
_OFFER_ROWS, _OFFER_ROWS_ORDER = offers_of_pool(bindparam("pool_id"))
_LOCK_OWNED_WITH_OFFERS = locking_with(_OFFER_ROWS, _OFFER_ROWS_ORDER, _OFFER_ROWS.c.tenant_id)


def check_version(pool: Pool | LockedPool, expected: int | None) -> None:
    """Optimistic concurrency (CONTRACT section 10): a write that names the version it read
    is refused, changing nothing, once the pool has moved on. Runs under the pool's lock, so
    of two writers that read the same version exactly one gets past it."""
    if expected is not None and expected != pool.version:
        raise Conflict(
            f"pool {pool.id} is at version {pool.version}, not {expected}",
            field="version",
            currentVersion=pool.version,
        )


def reads_offers(principal: Principal, owned: bool, attributes: PoolAttributes) -> bool:
    """Whether a caller reads a pool's offers (other tenants' quotas, priorities): its tenant
    owns the pool and its role grants compute:pools:share on it. Reads and events ask this."""
    return owned and allows_pool(principal, POOLS_SHARE, attributes)


def sees_offers(principal: Principal, pool: PoolView) -> bool:
    return reads_offers(principal, pool.owned, pool.grant.attributes)


def sees_capacity(principal: Principal, pool: PoolView) -> bool:
    return allows_pool(principal, CAPACITY_READ, pool.grant.attributes)


def offers_denied(principal: Principal, pool: PoolView) -> PermissionDenied | None:
    """Why an owned pool's offers are withheld from this caller, or None if they are not.
    A pool the tenant does not own has no offers to show it: null with no error
    (CONTRACT 9, as REST's `offers: null`), so callers ask this of owned pools only."""
    if pool.owned and not sees_offers(principal, pool):
        return PermissionDenied(f"{POOLS_SHARE} is not granted on this pool", field="offers")
    return None


def capacity_denied(principal: Principal, pool: PoolView) -> PermissionDenied | None:
    """Why a visible pool's rollup is withheld from this caller, or None if it is not."""
    if not sees_capacity(principal, pool):
        return PermissionDenied(f"{CAPACITY_READ} is not granted on this pool", field="capacity")
    return None
