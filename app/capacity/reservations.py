"""Reservations: bookings that make quota use real.

Shared counters are guarded in the database with conditional UPDATEs
(`used + n <= max`, `booked + n <= allocatable`) and their rowcount, never a
read-check-write across awaits. Every booking and release touches quota rows
before capacity rows, each in resource order, so concurrent calls cannot deadlock.
Each of those UPDATEs (take_*, give_back_*: the only writers of `used` and `booked` a
booking or release makes, on both execution strategies) also stamps the row's `usage_tx`,
which is how `pool.usage` events find what moved (app/events/usage.py): no outbox row.

A booking locks the pool's row where it is not archived (`lock_unarchived_pool`, FOR NO
KEY UPDATE, as owner writes lock it) before its quota and capacity rows, and an archive
holds that lock from its first statement to its commit: so a booking either commits
before the archive or sees it (docs/decisions/0004).

On PostgreSQL a booking and a release are first tried as one statement each, built from
the builders here (take_quota, take_capacity, headroom, give_back_*: booking.py,
booking_release.py); this plain path answers wherever that one does not, and on SQLite.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    CompoundSelect,
    CursorResult,
    Select,
    Update,
    bindparam,
    case,
    literal,
    select,
    union_all,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession

from app.capacity.access import pool_attributes, resolve_actor
from app.capacity.idempotency import IdempotentCreate
from app.capacity.inputs import (
    CreateReservationInput,
    ListReservationsInput,
    ReleaseReservationInput,
)
from app.capacity.reads import reservation_view, reservations_of, visible_pool
from app.capacity.views import ReservationView
from app.catalog import CREATE_RESERVATION, LIST_RESERVATIONS, RELEASE_RESERVATION
from app.db.engine import Executor
from app.db.models import CapacityRow, Pool, QuotaRow, Reservation, utcnow
from app.db.uow import UnitOfWork
from app.errors import InvalidState, NotFound, ResourceExhausted
from app.events.usage import UsageStamp
from app.iam.decisions import allows_pool, decide_pool
from app.iam.principal import Principal


def _rowcount(result: Any) -> int:
    assert isinstance(result, CursorResult)
    return result.rowcount


Value = str | ColumnElement[Any]  # a value, a bound parameter or a scalar subquery


def take_quota(pool_id: Value, tenant_id: Value, resource: Value, amount: int | Value) -> Update:
    return (
        update(QuotaRow)
        .where(
            QuotaRow.pool_id == pool_id,
            QuotaRow.tenant_id == tenant_id,
            QuotaRow.resource == resource,
            QuotaRow.used <= QuotaRow.max - amount,  # no overflow near 2^63
        )
        .values(used=QuotaRow.used + amount, usage_tx=UsageStamp())
    )


def take_capacity(pool_id: Value, resource: Value, amount: int | Value) -> Update:
    return (
        update(CapacityRow)
        .where(
            CapacityRow.pool_id == pool_id,
            CapacityRow.resource == resource,
            CapacityRow.booked <= CapacityRow.allocatable - amount,
        )
        .values(booked=CapacityRow.booked + amount, usage_tx=UsageStamp())
    )


def exhausted(limit: str, resource: str) -> ResourceExhausted:
    return ResourceExhausted(
        f"{limit} for {resource} would be exceeded", field=f"resources.{resource}", limit=limit
    )


def headroom(
    pool_id: str | ColumnElement[str],
    quota_tenant: str | ColumnElement[str],
    resources: Sequence[str | ColumnElement[str]],
) -> CompoundSelect[Any]:
    """What is left now of each quota and capacity row a booking of `resources` takes:
    (limit, resource, room), read from the committed rows without locking any."""
    return union_all(
        select(
            literal("quota").label("limit"),
            QuotaRow.resource,
            (QuotaRow.max - QuotaRow.used).label("room"),
        ).where(
            QuotaRow.pool_id == pool_id,
            QuotaRow.tenant_id == quota_tenant,
            QuotaRow.resource.in_(resources),
        ),
        select(
            literal("capacity").label("limit"),
            CapacityRow.resource,
            (CapacityRow.allocatable - CapacityRow.booked).label("room"),
        ).where(CapacityRow.pool_id == pool_id, CapacityRow.resource.in_(resources)),
    )


def first_exhausted(
    room: Mapping[tuple[str, str], int], resources: Mapping[str, int]
) -> ResourceExhausted | None:
    """The refusal a booking meets first, in the order the guarded UPDATEs take the rows
    (quota rows, then capacity rows, each in resource order); a missing row grants 0."""
    for limit in ("quota", "capacity"):
        for resource in sorted(resources):
            if room.get((limit, resource), 0) < resources[resource]:
                return exhausted(limit, resource)
    return None


async def _refuse_if_full_now(
    session: AsyncSession, pool_id: str, quota_tenant: str, resources: dict[str, int]
) -> None:
    """Refuse, without waiting for any lock, a booking that does not fit what is committed
    now. Once a hot quota is spent, the bookings behind it answer at once instead of
    queueing one by one for its row lock (and holding a connection while they wait). Only
    a refusal is taken from this read: a booking that fits is still decided by the guarded
    UPDATEs below."""
    rows = await session.execute(headroom(pool_id, quota_tenant, list(resources)))
    refused = first_exhausted({(r.limit, r.resource): r.room for r in rows}, resources)
    if refused is not None:
        raise refused


def lock_unarchived_pool(pool_id: Value) -> Select[Any]:
    """A booking's lock on the pool's row, the first of its locks (ADR 0004's order: the
    pool row, quota rows, capacity rows): FOR NO KEY UPDATE, which an archive holds from
    its start to its commit, and only while the row is not archived. A booking that waits
    behind an archive gets the lock on the row's newest version, where `NOT archived` is
    checked again (EvalPlanQual), so once an archive commits no booking takes the lock.
    Both strategies take it: the plain path here, the one statement in booking.py."""
    return (
        select(Pool.id)
        .where(Pool.id == pool_id, Pool.archived.is_(False))
        .with_for_update(key_share=True)  # FOR NO KEY UPDATE, as owner writes
    )


_LOCK_UNARCHIVED = lock_unarchived_pool(bindparam("pool_key"))


async def _book(
    uow: UnitOfWork, pool_id: str, quota_tenant: str, resources: dict[str, int]
) -> None:
    """Each guarded UPDATE matches its row only while the booking fits; the pool's row is
    locked first, and a pool archived by then refuses the booking."""
    await _refuse_if_full_now(uow.session, pool_id, quota_tenant, resources)
    if (await uow.session.execute(_LOCK_UNARCHIVED, {"pool_key": pool_id})).first() is None:
        raise archived_refusal(pool_id)
    order = sorted(resources)
    steps = [
        *(("quota", r, take_quota(pool_id, quota_tenant, r, resources[r])) for r in order),
        *(("capacity", r, take_capacity(pool_id, r, resources[r])) for r in order),
    ]
    for limit, resource, statement in steps:
        if _rowcount(await uow.session.execute(statement)) != 1:
            raise exhausted(limit, resource)


def archived_refusal(pool_id: str) -> InvalidState:
    return InvalidState(f"pool {pool_id} is archived and takes no new reservations", field="poolId")


async def _refuse_if_archived(session: AsyncSession, pool_id: str) -> None:
    """Read afresh (a new statement sees every commit before it, READ COMMITTED)."""
    if await session.scalar(select(Pool.archived).where(Pool.id == pool_id)):
        raise archived_refusal(pool_id)


def give_back_quota(
    pool_id: Value, tenant_id: Value, resource: Value, amount: int | Value
) -> Update:
    return (
        update(QuotaRow)
        .where(
            QuotaRow.pool_id == pool_id,
            QuotaRow.tenant_id == tenant_id,
            QuotaRow.resource == resource,
        )
        .values(used=QuotaRow.used - amount, usage_tx=UsageStamp())
    )


def give_back_capacity(pool_id: Value, resource: Value, amount: int | Value) -> Update:
    left = CapacityRow.booked - amount
    return (
        update(CapacityRow)
        .where(CapacityRow.pool_id == pool_id, CapacityRow.resource == resource)
        # allocatable was held up at `booked` after a shrink; it follows the bookings
        # back down to `total` as they end (the node takes its new layout once idle).
        .values(
            booked=left,
            allocatable=case((CapacityRow.total > left, CapacityRow.total), else_=left),
            usage_tx=UsageStamp(),
        )
    )


async def _unbook(uow: UnitOfWork, rsv: Reservation) -> None:
    session = uow.session
    order = sorted(rsv.resources)
    for resource in order:
        amount = int(rsv.resources[resource])
        await session.execute(give_back_quota(rsv.pool_id, rsv.quota_tenant_id, resource, amount))
    for resource in order:
        amount = int(rsv.resources[resource])
        await session.execute(give_back_capacity(rsv.pool_id, resource, amount))


async def create_reservation(
    uow: UnitOfWork, principal: Principal, inp: CreateReservationInput
) -> ReservationView:
    session = uow.session
    call = IdempotentCreate(
        method="reservations.create",
        prefix="rsv",
        tenant_id=inp.tenant_id,
        caller_id=principal.caller_id,
        key=inp.idempotency_key,
        fingerprint={"poolId": inp.pool_id, "resources": dict(inp.resources)},
        conflict="idempotencyKey was used with a different pool or resources",
    )
    if await call.is_retry(session):
        return reservation_view(await session.get_one(Reservation, call.resource_id))

    # Decided on the pool: an invisible pool is NOT_FOUND whatever the caller's role.
    actor = await resolve_actor(session, principal, inp.tenant_id, CREATE_RESERVATION)
    pool = await visible_pool(session, actor, inp.pool_id)
    decide_pool(principal, CREATE_RESERVATION.permission, pool.grant.attributes)
    if pool.archived:
        raise archived_refusal(pool.id)
    try:
        await _book(uow, pool.id, pool.grant.tenant_id, dict(inp.resources))
    except ResourceExhausted:
        # An archive that committed meanwhile dropped the rows: its state is the answer.
        await _refuse_if_archived(session, pool.id)
        raise
    # Holding the pool's row now (not archived), so an archive either committed before
    # (refused above) or waits for this booking to commit.
    # Recorded once the rows are held, as the one-statement booking does (booking.py):
    # a twin then waits for the first call at the rows, not while holding the record
    # the other needs, and fails on the key when the first call committed.
    await call.remember(session)
    rsv = Reservation(
        id=call.resource_id,
        pool_id=pool.id,
        tenant_id=actor.tenant_id,
        quota_tenant_id=pool.grant.tenant_id,
        resources=dict(inp.resources),
        state="active",
        created_at=utcnow(),
        ended_at=None,
    )
    session.add(rsv)
    await session.flush()
    return reservation_view(rsv)


async def release_reservation(
    uow: UnitOfWork, principal: Principal, inp: ReleaseReservationInput
) -> ReservationView:
    """Ends a booking; releasing twice is a no-op. Works after an unoffer or archive too."""
    session = uow.session
    actor = await resolve_actor(session, principal, inp.tenant_id, RELEASE_RESERVATION)
    rsv = (
        await session.execute(
            select(Reservation)
            .where(Reservation.id == inp.reservation_id, Reservation.tenant_id == actor.tenant_id)
            .with_for_update()
        )
    ).scalar_one_or_none()
    if rsv is None:
        raise NotFound(f"reservation {inp.reservation_id} not found", field="reservationId")
    # The binding decides on the pool as for a booking, even once the pool is no longer
    # offered (the reservation outlives the authz row).
    attributes = await pool_attributes(session, actor.tenant_id, [rsv.pool_id])
    decide_pool(principal, RELEASE_RESERVATION.permission, attributes[rsv.pool_id])
    if rsv.state == "active":
        rsv.state = "ended"
        rsv.ended_at = utcnow()
        await _unbook(uow, rsv)
        await session.flush()
    return reservation_view(rsv)


async def list_reservations(
    executor: Executor, principal: Principal, inp: ListReservationsInput
) -> list[ReservationView]:
    """One pool's (NOT_FOUND as get, PERMISSION_DENIED outside the binding), or those of
    every pool the binding allows."""
    actor = await resolve_actor(executor, principal, inp.tenant_id, LIST_RESERVATIONS)
    if inp.pool_id is not None:
        pool = await visible_pool(executor, actor, inp.pool_id)
        decide_pool(principal, LIST_RESERVATIONS.permission, pool.grant.attributes)
        return await reservations_of(executor, actor.tenant_id, [pool.id])
    found = await reservations_of(executor, actor.tenant_id)
    if not principal.conditions:
        return found  # an unnarrowed binding allows every pool
    attributes = await pool_attributes(executor, actor.tenant_id, list({r.pool_id for r in found}))
    allowed = {
        pool_id
        for pool_id, pool in attributes.items()
        if allows_pool(principal, LIST_RESERVATIONS.permission, pool)
    }
    return [r for r in found if r.pool_id in allowed]
