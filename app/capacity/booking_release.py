"""A release as one data-modifying statement (PostgreSQL): the second execution strategy
of reservations.release_reservation, built from the same builders (give_back_quota,
give_back_capacity), run as booking.py runs a booking.

In order: the caller's token live (booking.caller_live) and the tenant known
(read_rules.lineage_cte); the tenant's reservation locked FOR UPDATE (its newest version, so
of two releases exactly one finds it active); while it is active, its quota rows then its
capacity rows locked in resource order; then the reservation ended and its amounts given
back, each row by the plain path's UPDATE with the amount read from the locked
reservation. The statement answers the reservation as it is after; a reservation the
tenant does not have, or a caller the statement cannot vouch for, is answered by the
plain path (NOT_FOUND, UNAUTHENTICATED, exactly).
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cache
from typing import Any

import orjson
from sqlalchemy import (
    BigInteger,
    Select,
    String,
    bindparam,
    case,
    cast,
    exists,
    func,
    literal,
    select,
    update,
)

from app.capacity import reservations
from app.capacity.booking import (
    BookingStatement,
    caller_live,
    compile_statement,
    param,
    run_statement,
)
from app.capacity.inputs import ReleaseReservationInput
from app.capacity.read_rules import lineage_cte
from app.capacity.views import ReservationView
from app.catalog import RELEASE_RESERVATION
from app.db.engine import Database
from app.db.models import CapacityRow, QuotaRow, Reservation, utcnow
from app.iam.principal import Principal


def _statement() -> Select[Any]:
    tenant_id, reservation_id = param("tenant"), param("rid")
    ended_at = bindparam("ended", type_=Reservation.ended_at.type)
    lineage = lineage_cte(tenant_id, "lineage")
    vouched = caller_live() & exists(select(lineage.c.id))
    found = (
        select(Reservation.__table__)
        .where(Reservation.id == reservation_id, Reservation.tenant_id == tenant_id, vouched)
        .with_for_update()
        .cte("found")
    )
    active = select(found).where(found.c.state == "active").cte("active")
    booked = func.jsonb_each_text(active.c.resources).table_valued("key", "value").alias("booked")

    def amount() -> Any:
        return cast(booked.c.value, BigInteger)

    # Locks in the one order (ADR 0004): quota rows, then capacity rows, by resource.
    quota_lock = (
        select(QuotaRow.resource)
        .select_from(active)
        .join(booked, literal(True))
        .join(
            QuotaRow,
            (QuotaRow.pool_id == active.c.pool_id)
            & (QuotaRow.tenant_id == active.c.quota_tenant_id)
            & (QuotaRow.resource == booked.c.key),
        )
        .order_by(QuotaRow.resource)
        .with_for_update(of=QuotaRow)
        .cte("quota_lock")
    )
    after_quota = select(func.count()).select_from(quota_lock).scalar_subquery() >= 0
    capacity_lock = (
        select(CapacityRow.resource)
        .select_from(active)
        .join(booked, literal(True))
        .join(
            CapacityRow,
            (CapacityRow.pool_id == active.c.pool_id) & (CapacityRow.resource == booked.c.key),
        )
        .where(after_quota)
        .order_by(CapacityRow.resource)
        .with_for_update(of=CapacityRow)
        .cte("capacity_lock")
    )
    held = select(func.count()).select_from(capacity_lock).scalar_subquery() >= 0
    ended = (
        update(Reservation)
        .where(Reservation.id.in_(select(active.c.id)), held)
        .values(state="ended", ended_at=ended_at)
        .returning(Reservation.id)
        .cte("ended")
    )
    writes = [
        ended,
        reservations.give_back_quota(
            active.c.pool_id, active.c.quota_tenant_id, booked.c.key, amount()
        )
        .where(held)
        .returning(literal(1))
        .cte("quota_back"),
        reservations.give_back_capacity(active.c.pool_id, booked.c.key, amount())
        .where(held)
        .returning(literal(1))
        .cte("capacity_back"),
    ]
    now_ended = exists(select(ended.c.id))
    answer = select(
        func.json_build_object(
            literal("id"),
            found.c.id,
            literal("pool_id"),
            found.c.pool_id,
            literal("tenant_id"),
            found.c.tenant_id,
            literal("resources"),
            found.c.resources,
            literal("state"),
            case((now_ended, literal("ended")), else_=found.c.state),
            literal("created_at"),
            found.c.created_at,
            literal("ended_at"),
            case((now_ended, ended_at), else_=found.c.ended_at),
        )
    ).scalar_subquery()
    wrote = [select(func.count()).select_from(w).scalar_subquery() for w in writes]
    return select(
        cast(answer, String).label("answer"), *(w.label(f"w{i}") for i, w in enumerate(wrote))
    )


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


@cache
def release_statement() -> BookingStatement:
    return compile_statement(_statement())


async def release(
    db: Database, principal: Principal, inp: ReleaseReservationInput, token_hash: str | None
) -> ReservationView | None:
    """The release, or None when the plain path must answer (module docstring)."""
    if principal.conditions or not principal.has(RELEASE_RESERVATION.permission):
        return None
    if principal.tenant_id != inp.tenant_id and not principal.is_fleet_admin:
        return None
    statement = release_statement()
    values = {
        "tenant": inp.tenant_id,
        "rid": inp.reservation_id,
        "token": token_hash,
        "role": principal.role,
        "ended": utcnow(),
    }
    text = await run_statement(db, statement, statement.params(values))
    if text is None:
        return None
    row = orjson.loads(text)
    return ReservationView(
        id=row["id"],
        pool_id=row["pool_id"],
        tenant_id=row["tenant_id"],
        resources={k: int(v) for k, v in row["resources"].items()},
        state=row["state"],
        created_at=_utc(row["created_at"]),
        ended_at=None if row["ended_at"] is None else _utc(row["ended_at"]),
    )
