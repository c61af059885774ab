"""The outbox: pool events written in the same transaction as the change they describe.

Readers deliver in position order, (tx, seq), and only read positions below the
transaction-id horizon (reader.py), so nothing can still appear behind what they read.
That holds for any tx at least the writer's own transaction id. Per pool, position order
must also be commit order. Every transaction that writes a pool's event holds the pool's
row lock (or inserted the pool), so the pool's earlier events have all committed, and the
INSERT itself sets

    tx = GREATEST(pg_current_xact_id(), the pool's newest tx)

in the same statement (no round trip; an index probe on (pool_id, tx)). Its seq is drawn
after theirs, so its position is above all of them. Transaction ids alone would not do:
two sessions waiting for the same pool row can be given their ids in the other order than
they then get the lock (a waiter that follows the row's update chain takes its id while
still waiting), and a transaction that wrote something first (a fleet file applies many
pools in one) has its id from before the wait; tests/events/test_outbox_order.py shows
both. See docs/decisions/0012-commit-ordered-positions.md.

The lock is checked, not hoped: lock sites call `note_pool_lock` (and a create,
`note_pool_created`), and `append_events` refuses (LockOrderViolation, an AssertionError,
logged) an event for a pool its transaction neither locked nor created. SQLite has one
writer at a time, so there tx stays 0 and seq order is commit order.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from sqlalchemy import BigInteger, Table, bindparam, func, insert, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.expression import FunctionElement

from app.db.dialect_sql import per_dialect
from app.db.models import Event, EventAudience, Pool, utcnow
from app.db.session_statements import SessionStatements
from app.events.cursor import Position

log = logging.getLogger(__name__)

EVENT_TYPES: Final = (
    "pool.created",
    "pool.offered",
    "pool.unoffered",
    "pool.updated",
    "pool.archived",
)

# session.info key: the pools whose rows the transaction locked or inserted
_POOLS: Final = "bettercompute.event_pools"


class CurrentTx(FunctionElement[int]):
    """The writing transaction's id as a BIGINT (assigning one if needed); 0 on SQLite."""

    type = BigInteger()
    name = "current_tx"
    inherit_cache = True


per_dialect(CurrentTx, default="0", postgresql="pg_current_xact_id()::text::bigint")


def note_pool_lock(tx: AsyncSession | SessionStatements, pool_id: str) -> None:
    """The transaction holds `pool_id`'s row lock (FOR NO KEY UPDATE, as owner writes take
    it), so it may write the pool's events. Noted in its `info` (a unit of work's
    statements: no session made for it)."""
    tx.info.setdefault(_POOLS, set()).add(pool_id)


def note_pool_created(tx: AsyncSession | SessionStatements, pool_id: str) -> None:
    """The transaction inserts `pool_id`'s row: no one else can write its events before
    this commits, and whoever writes them next locks the row after that."""
    tx.info.setdefault(_POOLS, set()).add(pool_id)


async def lock_pool_for_events(session: AsyncSession, pool_id: str) -> bool:
    """Lock a pool's row as its owner writes do (FOR NO KEY UPDATE) and note it, for a
    writer of events that locks nothing else (tools, tests). False if there is no such pool."""
    found = (
        await session.execute(
            select(Pool.id).where(Pool.id == pool_id).with_for_update(key_share=True)
        )
    ).scalar_one_or_none()
    if found is None:
        return False
    note_pool_lock(session, pool_id)
    return True


@dataclass(frozen=True, slots=True)
class PendingEvent:
    type: str
    pool_id: str
    tenant_id: str  # the actor's tenant
    data: dict[str, Any]
    audience: frozenset[str] = field(default_factory=frozenset)


# Core statements on the tables (not the ORM's bulk insert): built once, as the unit of
# work's statements run them (app/db/session_statements.py).
_EVENTS: Table = Event.__table__  # type: ignore[assignment]
_AUDIENCE_TABLE: Table = EventAudience.__table__  # type: ignore[assignment]
# The pool's newest tx, read under its lock: every earlier event of the pool has committed.
_PRIOR = _EVENTS.alias("prior")
_POOL_NEWEST_TX = (
    select(func.coalesce(func.max(_PRIOR.c.tx), 0))
    .where(_PRIOR.c.pool_id == bindparam("tx_pool"))
    .scalar_subquery()
)
_INSERT = (
    insert(_EVENTS)
    .values(tx=func.greatest(CurrentTx(), _POOL_NEWEST_TX))
    .returning(_EVENTS.c.tx, _EVENTS.c.seq, sort_by_parameter_order=True)
)
_INSERT_SQLITE = insert(_EVENTS).returning(
    _EVENTS.c.tx, _EVENTS.c.seq, sort_by_parameter_order=True
)
# An event's audience in one statement whatever its size (PostgreSQL: arrays bound).
_AUDIENCE = insert(_AUDIENCE_TABLE).from_select(
    ["seq", "tenant_id"],
    select(
        func.unnest(bindparam("seqs", type_=postgresql.ARRAY(BigInteger()))),
        func.unnest(bindparam("tenants", type_=postgresql.ARRAY(EventAudience.tenant_id.type))),
    ),
)


# One event with its audience in one statement (PostgreSQL: the audience's INSERT a
# data-modifying CTE over the event's returned seq): a write's one event, one round trip.
_EVENT = (
    insert(_EVENTS)
    .values(
        tx=func.greatest(CurrentTx(), _POOL_NEWEST_TX),
        # Named: an INSERT in a CTE takes no values from the execution's parameters.
        **{
            key: bindparam(key, type_=_EVENTS.c[key].type)
            for key in ("type", "pool_id", "tenant_id", "occurred_at", "data")
        },
    )
    .returning(_EVENTS.c.tx, _EVENTS.c.seq)
    .cte("event")
)
_EVENT_AUDIENCE = insert(_AUDIENCE_TABLE).from_select(
    ["seq", "tenant_id"],
    select(
        _EVENT.c.seq,
        func.unnest(bindparam("tenants", type_=postgresql.ARRAY(EventAudience.tenant_id.type))),
    ),
)
_INSERT_ONE = select(_EVENT.c.tx, _EVENT.c.seq).add_cte(_EVENT_AUDIENCE.cte("audience"))


class LockOrderViolation(AssertionError):
    """An event for a pool whose row the transaction did not lock: its place in the pool's
    order would be a race, so the write is refused."""


async def append_events(
    statements: SessionStatements | AsyncSession, events: Iterable[PendingEvent]
) -> Position | None:
    """Insert the events; returns the newest position. Call last, right before commit.
    A unit of work passes its statements; a session alone runs them on the plain path."""
    pending = list(events)
    if not pending:
        return None
    if isinstance(statements, AsyncSession):
        statements = SessionStatements(statements, None)
    pools: set[str] = statements.info.get(_POOLS, set())
    unlocked = sorted({e.pool_id for e in pending} - pools)
    if unlocked:
        log.error("events refused: pools %s were not locked by their transaction", unlocked)
        raise LockOrderViolation(f"events for pools their transaction did not lock: {unlocked}")
    now = utcnow()
    rows = [
        {
            "type": item.type,
            "pool_id": item.pool_id,
            "tenant_id": item.tenant_id,
            "occurred_at": now,
            "data": item.data,
        }
        for item in pending
    ]
    postgres = statements.dialect == "postgresql"
    if postgres:
        for row in rows:
            row["tx_pool"] = row["pool_id"]
    if postgres and len(rows) == 1:  # a write's one event: with its audience, one statement
        # The write's blind writes still held ride in it (app/db/carried_writes.py).
        statement, params = statements.carrying(
            _INSERT_ONE, {**rows[0], "tenants": sorted(pending[0].audience)}
        )
        tx, seq = (await statements.execute(statement, params)).one()
        return Position(tx, seq)
    # One statement however many events; positions come back in the order of `pending`.
    inserted = _INSERT if postgres else _INSERT_SQLITE
    found = (
        await statements.execute(inserted, rows[0])
        if len(rows) == 1
        else await statements.session.execute(inserted, rows)
    )
    positions = [Position(tx, seq) for tx, seq in found.all()]
    audience = [
        (position.seq, tenant)
        for position, item in zip(positions, pending, strict=True)
        for tenant in sorted(item.audience)
    ]
    if audience and postgres:
        seqs, tenants = zip(*audience, strict=True)
        await statements.execute(_AUDIENCE, {"seqs": list(seqs), "tenants": list(tenants)})
    elif audience:
        await statements.session.execute(
            insert(_AUDIENCE_TABLE),
            [{"seq": seq, "tenant_id": t} for seq, t in audience],
        )
    return max(positions)
