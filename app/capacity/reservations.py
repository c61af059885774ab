"""Reservations: bookings that make quota use real.

Shared counters are guarded in the database with conditional UPDATEs
(`used + n <= max`, `booked + n <= allocatable`) and their rowcount, never a
read-check-write across awaits. Every booking and release touches quota rows
before capacity rows, each in resource order, so concurrent calls cannot deadlock.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import CursorResult, Update, case, select, update

from app.capacity.access import resolve_actor, resolve_pool_actor
from app.capacity.errors import InvalidState, NotFound, ResourceExhausted
from app.capacity.idempotency import IdempotentCreate
from app.capacity.inputs import (
    CreateReservationInput,
    ListReservationsInput,
    ReleaseReservationInput,
)
from app.capacity.reads import Executor, reservation_view, reservations_of, visible_pool
from app.capacity.views import ReservationView
from app.db.models import CapacityRow, Pool, QuotaRow, Reservation, utcnow
from app.db.uow import UnitOfWork
from app.iam.decisions import decide_pool
from app.iam.principal import Principal
from app.iam.roles import RESERVATIONS_READ, RESERVATIONS_WRITE


def _rowcount(result: Any) -> int:
    assert isinstance(result, CursorResult)
    return result.rowcount


def _take_quota(pool_id: str, tenant_id: str, resource: str, amount: int) -> Update:
    return (
        update(QuotaRow)
        .where(
            QuotaRow.pool_id == pool_id,
            QuotaRow.tenant_id == tenant_id,
            QuotaRow.resource == resource,
            QuotaRow.used <= QuotaRow.max - amount,  # no overflow near 2^63
        )
        .values(used=QuotaRow.used + amount)
    )


def _take_capacity(pool_id: str, resource: str, amount: int) -> Update:
    return (
        update(CapacityRow)
        .where(
            CapacityRow.pool_id == pool_id,
            CapacityRow.resource == resource,
            CapacityRow.booked <= CapacityRow.allocatable - amount,
        )
        .values(booked=CapacityRow.booked + amount)
    )


async def _book(
    uow: UnitOfWork, pool_id: str, quota_tenant: str, resources: dict[str, int]
) -> None:
    """Each guarded UPDATE matches its row only while the booking fits."""
    order = sorted(resources)
    steps = [
        *(("quota", r, _take_quota(pool_id, quota_tenant, r, resources[r])) for r in order),
        *(("capacity", r, _take_capacity(pool_id, r, resources[r])) for r in order),
    ]
    for limit, resource, statement in steps:
        if _rowcount(await uow.session.execute(statement)) != 1:
            raise ResourceExhausted(
                f"{limit} for {resource} would be exceeded",
                field=f"resources.{resource}",
                limit=limit,
            )


async def _unbook(uow: UnitOfWork, rsv: Reservation) -> None:
    session = uow.session
    for resource in sorted(rsv.resources):
        await session.execute(
            update(QuotaRow)
            .where(
                QuotaRow.pool_id == rsv.pool_id,
                QuotaRow.tenant_id == rsv.quota_tenant_id,
                QuotaRow.resource == resource,
            )
            .values(used=QuotaRow.used - int(rsv.resources[resource]))
        )
    for resource in sorted(rsv.resources):
        left = CapacityRow.booked - int(rsv.resources[resource])
        await session.execute(
            update(CapacityRow)
            .where(CapacityRow.pool_id == rsv.pool_id, CapacityRow.resource == resource)
            # allocatable was held up at `booked` after a shrink; it follows the bookings
            # back down to `total` as they end (the node takes its new layout once idle).
            .values(
                booked=left,
                allocatable=case((CapacityRow.total > left, CapacityRow.total), else_=left),
            )
        )


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
    actor = await resolve_pool_actor(session, principal, inp.tenant_id)
    pool = await visible_pool(session, actor, inp.pool_id)
    decide_pool(principal, RESERVATIONS_WRITE, pool.grant.attributes)
    # A share lock orders this booking against a concurrent archive of the pool.
    archived = (
        await session.execute(
            select(Pool.archived).where(Pool.id == pool.id).with_for_update(read=True)
        )
    ).scalar_one()
    if archived:
        raise InvalidState(
            f"pool {pool.id} is archived and takes no new reservations", field="poolId"
        )
    await call.remember(session)
    await _book(uow, pool.id, pool.grant.tenant_id, dict(inp.resources))
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
    actor = await resolve_actor(session, principal, inp.tenant_id, RESERVATIONS_WRITE)
    rsv = (
        await session.execute(
            select(Reservation)
            .where(Reservation.id == inp.reservation_id, Reservation.tenant_id == actor.tenant_id)
            .with_for_update()
        )
    ).scalar_one_or_none()
    if rsv is None:
        raise NotFound(f"reservation {inp.reservation_id} not found", field="reservationId")
    if rsv.state == "active":
        rsv.state = "ended"
        rsv.ended_at = utcnow()
        await _unbook(uow, rsv)
        await session.flush()
    return reservation_view(rsv)


async def list_reservations(
    executor: Executor, principal: Principal, inp: ListReservationsInput
) -> list[ReservationView]:
    actor = await resolve_actor(executor, principal, inp.tenant_id, RESERVATIONS_READ)
    if inp.pool_id is None:
        return await reservations_of(executor, actor.tenant_id)
    pool = await visible_pool(executor, actor, inp.pool_id)
    return await reservations_of(executor, actor.tenant_id, [pool.id])
