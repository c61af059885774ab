"""A booking as one data-modifying statement (PostgreSQL): the second execution strategy
of reservations.create_reservation, built from the same SQLAlchemy builders.

Per request only parameters are bound: the statement is built and compiled once per
(number of resources, idempotency key or not) and asyncpg keeps it prepared on the
direct pool (app/db/direct.py), where it runs alone, outside a transaction, so a
booking is one round trip that commits itself. In order, each step gated on the last:

1. the caller's token is live with the role it was remembered with, unnarrowed (as the
   compiled reads check it, app/capacity/json_reads.py); the tenant's lineage
   (read_rules.lineage_cte); the pool visible to it through its own authz row or an
   ancestor's with includeDescendants (read_rules.nearest_grant_tenant, read_rules.pool_seen_by);
   no idempotency record under the key yet;
2. the pool not archived and the booking fitting what is committed now
   (reservations.headroom): a booking that cannot fit is refused here, before it asks
   for any row lock;
3. the pool row locked FOR NO KEY UPDATE where it is still not archived: a lock that
   conflicts with an archive's (access.lock_owned_pool), so once an archive commits, the
   row's newest version is re-checked (EvalPlanQual) and the booking sees it
   (docs/decisions/0004, addendum);
4. the quota rows, then the capacity rows, locked in resource order where each still
   fits, by the guarded UPDATEs' own WHERE clauses (reservations.take_quota,
   take_capacity);
5. only when every row is held and fits: those UPDATEs, the idempotency record and the
   reservation. Nothing is written otherwise, so a refusal changes nothing.

The statement answers which step stopped it. Steps 2 and 4 give the plain path's
RESOURCE_EXHAUSTED or INVALID_STATE here; anything else (a token no longer live, an
unknown tenant, a pool not visible, a retry of an idempotent call) is answered by the
plain path, which gives the exact answer. A twin of an idempotent call that committed
meanwhile fails on the record's key, writing nothing; the plain path then reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

import orjson
from sqlalchemy import (
    CTE,
    ColumnElement,
    Select,
    String,
    and_,
    bindparam,
    case,
    cast,
    exists,
    func,
    insert,
    literal,
    not_,
    or_,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB

from app.capacity import json_sql, read_rules, reservations
from app.capacity.idempotency import IdempotentCreate
from app.capacity.inputs import CreateReservationInput
from app.capacity.json_sql import Statement
from app.capacity.read_rules import lineage_cte, nearest_grant_tenant, pool_seen_by
from app.capacity.views import ReservationView
from app.catalog import CREATE_RESERVATION
from app.db.engine import Database
from app.db.errors import sqlstate
from app.db.models import (
    CapacityRow,
    IdempotencyRecord,
    Pool,
    QuotaRow,
    Reservation,
    utcnow,
)
from app.errors import ResourceExhausted
from app.iam.principal import Principal

UNIQUE_VIOLATION = "23505"


# Compiled SQL text with its positional parameters' names (json_sql.Statement).
BookingStatement = Statement


def param(name: str, type_: Any = None) -> Any:
    return bindparam(name, type_=type_ if type_ is not None else String())


def _count(cte: CTE) -> Any:
    return select(func.count()).select_from(cte).scalar_subquery()


def caller_live() -> ColumnElement[bool]:
    """The remembered caller's token still live, its binding the role it was remembered
    with and not narrowed (read_rules.token_live); no token (a caller looked up for this
    request): true."""
    return read_rules.caller_live(param("token"), param("role"))


def _statement(count: int, keyed: bool) -> Select[Any]:
    names = [param(f"resource_{i}") for i in range(count)]
    amounts = [bindparam(f"amount_{i}", type_=QuotaRow.used.type) for i in range(count)]
    asked = list(zip(names, amounts, strict=True))
    pool_id, tenant_id = param("pool"), param("tenant")

    lineage = lineage_cte(tenant_id, "lineage")
    grant = select(nearest_grant_tenant(lineage, pool_id).label("tenant_id")).cte("grant_row")
    quota_tenant = select(grant.c.tenant_id).scalar_subquery()
    target = (
        select(Pool.id, Pool.archived)
        .where(Pool.id == pool_id, pool_seen_by(tenant_id), quota_tenant.is_not(None))
        .cte("target")
    )
    room = reservations.headroom(pool_id, quota_tenant, names).cte("room")
    fits = [and_(room.c.resource == n, room.c.room >= a) for n, a in asked]
    fitting = select(func.count()).select_from(room).where(or_(*fits)).scalar_subquery()
    seen = exists().where(IdempotencyRecord.resource_id == param("rid")) if keyed else None
    declined = or_(
        not_(caller_live()),
        not_(exists(select(lineage.c.id))),
        not_(exists(select(target.c.id))),
        *([seen] if seen is not None else []),
    )
    step = select(
        case(
            (declined, "declined"),
            (select(target.c.archived).scalar_subquery(), "archived"),
            (fitting < 2 * count, "full"),
            else_="go",
        ).label("step")
    ).cte("step")
    go = select(step.c.step).scalar_subquery() == "go"

    # Locks, in the one order (ADR 0004): the pool row, quota rows, capacity rows.
    pool_lock = reservations.lock_unarchived_pool(pool_id).where(go).cte("pool_lock")
    takes_quota = [reservations.take_quota(pool_id, quota_tenant, n, a) for n, a in asked]
    takes_capacity = [reservations.take_capacity(pool_id, n, a) for n, a in asked]
    quota_lock = (
        select(QuotaRow.resource)
        .where(or_(*(t.whereclause for t in takes_quota if t.whereclause is not None)))
        .where(exists(select(pool_lock.c.id)))
        .order_by(QuotaRow.resource)
        .with_for_update()
        .cte("quota_lock")
    )
    capacity_lock = (
        select(CapacityRow.resource)
        .where(or_(*(t.whereclause for t in takes_capacity if t.whereclause is not None)))
        .where(_count(quota_lock) == count)
        .order_by(CapacityRow.resource)
        .with_for_update()
        .cte("capacity_lock")
    )
    held = _count(capacity_lock) == count  # and so every quota row too

    writes: list[CTE] = [
        t.where(held).returning(literal(1)).cte(f"quota_{i}") for i, t in enumerate(takes_quota)
    ]
    writes += [
        t.where(held).returning(literal(1)).cte(f"capacity_{i}")
        for i, t in enumerate(takes_capacity)
    ]
    if keyed:
        writes.append(
            insert(IdempotencyRecord)
            .from_select(
                [
                    "resource_id",
                    "method",
                    "tenant_id",
                    "caller_id",
                    "key",
                    "fingerprint",
                    "created_at",
                ],
                select(
                    param("rid"),
                    literal("reservations.create"),
                    tenant_id,
                    param("caller_of"),
                    param("idem_key"),
                    bindparam("print", type_=JSONB()),
                    bindparam("booked_at", type_=Reservation.created_at.type),
                ).where(held),
            )
            .returning(literal(1))
            .cte("remembered")
        )
    writes.append(
        insert(Reservation)
        .from_select(
            [
                "id",
                "pool_id",
                "tenant_id",
                "quota_tenant_id",
                "resources",
                "state",
                "created_at",
                "ended_at",
            ],
            select(
                param("rid"),
                pool_id,
                tenant_id,
                quota_tenant,
                bindparam("booked", type_=JSONB()),
                literal("active"),
                bindparam("booked_at", type_=Reservation.created_at.type),
                literal(None),
            ).where(held),
        )
        .returning(literal(1))
        .cte("inserted")
    )
    answer = func.json_build_object(
        literal("step"),
        case(
            (held, "booked"),
            (select(step.c.step).scalar_subquery() != "go", select(step.c.step).scalar_subquery()),
            (not_(exists(select(pool_lock.c.id))), "archived"),
            else_="raced",
        ),
        literal("room"),
        select(func.json_agg(func.json_build_array(room.c.limit, room.c.resource, room.c.room)))
        .select_from(room)
        .scalar_subquery(),
        literal("quota"),
        select(func.json_agg(quota_lock.c.resource)).scalar_subquery(),
        literal("capacity"),
        select(func.json_agg(capacity_lock.c.resource)).scalar_subquery(),
    )
    # Every data-modifying CTE runs to completion whether or not it is read; reading
    # them here makes the one statement carry them all.
    wrote = [select(func.count()).select_from(w).scalar_subquery() for w in writes]
    return select(
        cast(answer, String).label("answer"), *(w.label(f"w{i}") for i, w in enumerate(wrote))
    )


@cache
def booking_statement(count: int, keyed: bool) -> BookingStatement:
    """Built once per (number of resources, with an idempotency key or not)."""
    return compile_statement(_statement(count, keyed))


def compile_statement(statement: Select[Any]) -> BookingStatement:
    """PostgreSQL text with asyncpg's positional parameters."""
    return json_sql.compile_statement(statement, "postgresql")


@dataclass(frozen=True, slots=True)
class BookingCall:
    """One booking's parameters, by name."""

    tenant_id: str
    pool_id: str
    resources: dict[str, int]
    reservation_id: str
    caller_id: str
    role: str
    token_hash: str | None
    created_at: datetime
    key: str | None
    fingerprint: dict[str, Any]

    def values(self) -> dict[str, Any]:
        order = sorted(self.resources)
        values: dict[str, Any] = {
            "tenant": self.tenant_id,
            "pool": self.pool_id,
            "rid": self.reservation_id,
            "token": self.token_hash,
            "role": self.role,
            "caller_of": self.caller_id,
            "idem_key": self.key,
            "print": orjson.dumps(self.fingerprint).decode(),
            "booked": orjson.dumps(self.resources).decode(),
            "booked_at": self.created_at,
        }
        for i, resource in enumerate(order):
            values[f"resource_{i}"] = resource
            values[f"amount_{i}"] = self.resources[resource]
        return values


async def run_statement(
    db: Database, statement: BookingStatement, params: tuple[Any, ...]
) -> str | None:
    """One round trip on the direct pool, committed by itself; behind PgBouncer, in a
    transaction of the writer's (its statement timeout is SET LOCAL there)."""
    if db.direct is not None:
        value = await db.direct.fetchval(statement.sql, params)
    else:
        async with db.writer.begin() as conn:
            value = (await conn.exec_driver_sql(statement.sql, params)).scalar()
    return value if isinstance(value, str) else None


def _first_missing(
    resources: dict[str, int], quota: list[str] | None, capacity: list[str] | None
) -> ResourceExhausted:
    """A booking that fitted the committed rows but not the rows once held: the first row
    the guarded UPDATEs would have found full."""
    held = {"quota": set(quota or ()), "capacity": set(capacity or ())}
    for limit in ("quota", "capacity"):
        for resource in sorted(resources):
            if resource not in held[limit]:
                return reservations.exhausted(limit, resource)
    raise AssertionError("every row held, yet not booked")


async def book(
    db: Database, principal: Principal, inp: CreateReservationInput, token_hash: str | None
) -> ReservationView | None:
    """The booking, or None when the plain path must answer (module docstring). With
    `token_hash`, `principal` was remembered by admission and the statement checks the
    token; without it, the caller was looked up for this request."""
    if principal.conditions or not principal.has(CREATE_RESERVATION.permission):
        return None  # a per-pool decision over the grant's attributes: the plain path
    if principal.tenant_id != inp.tenant_id and not principal.is_fleet_admin:
        return None  # PERMISSION_DENIED, once the token is known to be good
    resources = dict(inp.resources)
    fingerprint = {"poolId": inp.pool_id, "resources": resources}
    call = IdempotentCreate(
        method="reservations.create",
        prefix="rsv",
        tenant_id=inp.tenant_id,
        caller_id=principal.caller_id,
        key=inp.idempotency_key,
        fingerprint=fingerprint,
        conflict="",
    )
    created_at = utcnow()
    booking = BookingCall(
        tenant_id=inp.tenant_id,
        pool_id=inp.pool_id,
        resources=resources,
        reservation_id=call.resource_id,
        caller_id=principal.caller_id,
        role=principal.role,
        token_hash=token_hash,
        created_at=created_at,
        key=inp.idempotency_key,
        fingerprint=fingerprint,
    )
    statement = booking_statement(len(resources), inp.idempotency_key is not None)
    try:
        text = await run_statement(db, statement, statement.params(booking.values()))
    except Exception as exc:
        if sqlstate(exc) == UNIQUE_VIOLATION:
            return None  # a twin committed first: the plain path reads what it made
        raise
    if text is None:
        return None
    answer = orjson.loads(text)
    step = answer["step"]
    if step == "booked":
        return ReservationView(
            id=call.resource_id,
            pool_id=inp.pool_id,
            tenant_id=inp.tenant_id,
            resources=resources,
            state="active",
            created_at=created_at,
            ended_at=None,
        )
    if step == "archived":
        raise reservations.archived_refusal(inp.pool_id)
    if step == "full":
        room = {(limit, resource): int(left) for limit, resource, left in answer["room"] or ()}
        refused = reservations.first_exhausted(room, resources)
        if refused is None:
            raise AssertionError("refused for room, yet every row has room")
        raise refused
    if step == "raced":
        raise _first_missing(resources, answer["quota"], answer["capacity"])
    return None  # declined: the plain path gives the exact answer
