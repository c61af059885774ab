"""Reading the outbox in position order, and the transaction-id horizon.

The relay reads every committed event its delivery state does not cover, above the
horizon too (`read_uncovered`, with the horizon of the same snapshot: what settles L,
cursor.advance); a replay reads what the relay covered (`read_between`). What follows is
what L rests on. `read_events` reads only positions (tx, seq) with `tx` below the horizon
(`PG_HORIZON`: every transaction of this database with a smaller id has ended; no bound
on SQLite, where tx is always 0 and one writer at a time gives commit order). A
transaction still running, or one that gets its id later, writes only positions at or
above the horizon read with it, so "every event after position P" below it, read now, is
complete: nothing can still appear below what was read
(docs/decisions/0012-commit-ordered-positions.md).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import repeat
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    ColumnElement,
    Integer,
    Select,
    bindparam,
    delete,
    exists,
    insert,
    literal,
    literal_column,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.expression import FunctionElement

from app.db.dialect_sql import per_dialect
from app.db.engine import Executor, plan_each_read
from app.db.models import Event, EventAudience, EventsPruned
from app.events.cursor import (
    BIGINT_MAX,
    START,
    DeliveryState,
    Position,
    advance,
    as_position,
    encode_state,
)


class Horizon(FunctionElement[int]):
    """The transaction-id horizon of the statement's snapshot: every transaction with a
    smaller id has ended. On SQLite, larger than any tx."""

    type = BigInteger()
    name = "event_horizon"
    inherit_cache = True


# The horizon of this database's transactions (docs/decisions/0012, "A horizon per
# database"): the smallest id among the snapshot's running transactions, leaving out those
# seen running in another database while the statement runs (a transaction never moves
# between databases, so none of those can write here); with none left, the snapshot's
# xmax. A transaction that ended since the snapshot is seen nowhere and is kept, and so is
# one whose session hides its id (another role's, to a role without pg_read_all_stats):
# the horizon only ever errs low, as pg_snapshot_xmin, the whole server's, always did. A
# 32-bit backend_xid names the same transaction as the xid8's low 32 bits (running
# transactions are far fewer than 2^31 ids apart).
PG_HORIZON = (
    "(SELECT coalesce(min(x::text::bigint),"
    " pg_snapshot_xmax(pg_current_snapshot())::text::bigint)"
    " FROM pg_snapshot_xip(pg_current_snapshot()) AS x"
    " WHERE x::text::bigint % 4294967296 NOT IN ("
    "SELECT backend_xid::text::bigint FROM pg_stat_activity"
    " WHERE backend_xid IS NOT NULL AND datname IS DISTINCT FROM current_database()))"
)
# Every transaction id given out so far is below it: a bound no issued position or usage
# horizon exceeds, whatever the horizon does meanwhile.
PG_NEXT_XID = "pg_snapshot_xmax(pg_current_snapshot())::text::bigint"


per_dialect(Horizon, default=str(BIGINT_MAX), postgresql=PG_HORIZON)


def _position() -> ColumnElement[Any]:
    return tuple_(Event.tx, Event.seq)


def _at(position: Position) -> ColumnElement[Any]:
    return tuple_(position.tx, position.seq)


_VISIBLE = Event.tx < Horizon()


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    """One committed event, shared read-only by every subscriber it is delivered to."""

    seq: int
    type: str
    pool_id: str
    tenant_id: str  # the actor's tenant
    occurred_at: datetime
    data: dict[str, Any]
    audience: frozenset[str]  # the tenants it is for (only those asked about, when filtered)
    tx: int = 0  # the writing transaction (0 on SQLite and before migration 0009)
    # A `pool.usage` event (never in the outbox): the usage horizon its cursor carries;
    # its position is the last outbox event its subscription had delivered (relay.py).
    usage: int | None = None
    # The reader's delivery state just after this event (cursor.py), which its cursor
    # carries; None: (its position, nothing above it).
    state: DeliveryState | None = None
    # What is read for this event once and shared by every subscriber it is shown to
    # (app/capacity/event_reads.py): an init field, so a reduced view made with
    # `dataclasses.replace` shares the same dict.
    reads: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)
    # A transport's renderings of this event object, made once and shared by every
    # subscriber shown this same object with the same request (schema/executor.py).
    # Not an init field: `dataclasses.replace` (a reduced view) starts with none.
    renderings: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def position(self) -> Position:
        return Position(self.tx, self.seq)

    @property
    def cursor(self) -> str:
        state = self.state if self.state is not None else DeliveryState(self.position)
        return encode_state(state, self.usage)


@dataclass(frozen=True, slots=True)
class Bounds:
    oldest: Position | None  # None when no event is visible
    newest: Position  # the newest visible position; `pruned` when none is
    pruned: Position  # retention deleted every event up to here (START: none)

    def expired(self, after: Position) -> bool:
        """Whether an event after `after` was pruned: exact, as pruning deletes a prefix."""
        return after < self.pruned


_NEWEST = (
    select(Event.tx, Event.seq).where(_VISIBLE).order_by(Event.tx.desc(), Event.seq.desc()).limit(1)
)
_OLDEST = select(Event.tx, Event.seq).where(_VISIBLE).order_by(Event.tx, Event.seq).limit(1)
_PRUNED = select(EventsPruned.tx, EventsPruned.seq).where(EventsPruned.id == 1)


async def outbox_bounds(executor: Executor) -> Bounds:
    """The visible outbox's ends and the pruned-through position. Three index probes in one
    statement, so on PostgreSQL one snapshot (one horizon) answers all of them."""
    one = select(literal(1).label("one")).subquery("one")
    newest, oldest, pruned = _NEWEST.subquery("n"), _OLDEST.subquery("o"), _PRUNED.subquery("p")
    row = (
        await executor.execute(
            select(newest.c.tx, newest.c.seq, oldest.c.tx, oldest.c.seq, pruned.c.tx, pruned.c.seq)
            .select_from(one)
            .outerjoin(newest, true())
            .outerjoin(oldest, true())
            .outerjoin(pruned, true())
        )
    ).one()
    pruned_at = START if row[4] is None else Position(row[4], row[5])
    oldest_at = None if row[2] is None else Position(row[2], row[3])
    newest_at = pruned_at if row[0] is None else max(Position(row[0], row[1]), pruned_at)
    return Bounds(oldest=oldest_at, newest=newest_at, pruned=pruned_at)


class NextXid(FunctionElement[int]):
    """Above every transaction id given out so far (PostgreSQL; NULL on SQLite)."""

    type = BigInteger()
    name = "next_xid"
    inherit_cache = True


per_dialect(NextXid, default="NULL", postgresql=PG_NEXT_XID)


_LATEST = select(Event.tx, Event.seq).order_by(Event.tx.desc(), Event.seq.desc()).limit(1)


async def issued_bounds(executor: Executor) -> tuple[Position, int | None]:
    """What no cursor this service issued exceeds: the newest committed position (above the
    horizon too, which may read lower a moment later: a transaction of another database
    that ended is no longer seen to be another's) and the next transaction id (a usage
    horizon is below it; None on SQLite, whose usage horizon never reads lower)."""
    latest = _LATEST.subquery("l")
    one = select(literal(1).label("one")).subquery("one")
    row = (
        await executor.execute(
            select(latest.c.tx, latest.c.seq, NextXid()).select_from(one).outerjoin(latest, true())
        )
    ).one()
    position = START if row[0] is None else Position(row[0], row[1])
    return position, None if row[2] is None else int(row[2])


def _any(where: ColumnElement[bool]) -> ColumnElement[bool]:
    """Whether an event matches `where`, looked for by the index in position order. As
    EXISTS, PostgreSQL's plan scanned the table from its first row, and the rows these
    ask about are the newest: the whole outbox read, per call."""
    first = select(Event.seq).where(where).order_by(Event.tx, Event.seq)
    return first.limit(literal_column("1", Integer)).scalar_subquery().is_not(None)


_PENDING = select(_any(Event.tx >= Horizon()))


async def committed_above_horizon(executor: Executor) -> bool:
    """Whether committed events wait above the horizon (a transaction with a smaller id is
    still running): a reader that has read everything below it should look again soon."""
    return bool((await executor.execute(*committed_above_horizon_query())).scalar_one())


def committed_above_horizon_query() -> tuple[Select[bool], dict[str, Any]]:
    """`committed_above_horizon`'s statement (it binds nothing)."""
    return _PENDING, {}


def _after(prefix: str) -> ColumnElement[bool]:
    """Positions after one bound per call as (`<prefix>_tx`, `<prefix>_seq`)."""
    bound = tuple_(
        bindparam(f"{prefix}_tx", type_=BigInteger()),
        bindparam(f"{prefix}_seq", type_=BigInteger()),
    )
    return _position() > bound


def _bound(prefix: str, position: Position) -> dict[str, int]:
    return {f"{prefix}_tx": position.tx, f"{prefix}_seq": position.seq}


class AudienceArray(FunctionElement[Any]):
    """The tenants of a subquery's audience rows as one JSON array (an aggregate)."""

    type = JSON()
    name = "audience_array"
    inherit_cache = True


per_dialect(AudienceArray, default="json_group_array({0})", postgresql="json_agg({0})")


def _with_audiences(events: Select[Any], tenants: Collection[str] | None) -> Select[Any]:
    """`events` (rows of the events table in position order, limited) with each event's
    audience beside it (`audience`: a JSON array of tenants; NULL or empty for none), in
    the same statement: the limit counts events. With `tenants`, only those tenants of
    each audience. A subquery per event, so each is an index probe: joined instead, a
    generic plan (the limit a parameter, guessed at 2,000 rows) hashed the whole
    audience table on every relay read, a cost that grew with the outbox."""
    e = events.subquery("e")
    audience = select(AudienceArray(EventAudience.tenant_id)).where(EventAudience.seq == e.c.seq)
    if tenants is not None:
        audience = audience.where(EventAudience.tenant_id.in_(bindparam("tenants", expanding=True)))
    return select(e, audience.scalar_subquery().label("audience")).order_by(e.c.tx, e.c.seq)


def _in_order(query: Select[Any]) -> Select[Any]:
    """`query` in position order, at most `limit` rows. The limit is written into the
    statement's text (one text per limit: a relay's batch size, a page's size): as a
    parameter, PostgreSQL's generic plan guesses it at a tenth of the rows matched, a
    third of the table for a position, and past a few thousand events read the table
    by a parallel scan and a sort on every read; with the number it reads the index
    from the position on."""
    limit = bindparam("limit", type_=BigInteger(), literal_execute=True)
    return query.order_by(Event.tx, Event.seq).limit(limit)


def _uncovered(ahead: bool) -> ColumnElement[bool]:
    """Positions after the state's settled one and not among those it delivered ahead."""
    uncovered = _after("settled")
    if ahead:
        uncovered = uncovered & Event.seq.not_in(bindparam("ahead", expanding=True))
    return uncovered


# The relay's reads, built once (a state with events delivered ahead of its settled
# position, or without); their parameters bound per call (`_uncovered_params`).
_READ_UNCOVERED = {
    ahead: _with_audiences(
        _in_order(
            select(Event.__table__, Horizon().label("read_horizon")).where(_uncovered(ahead))
        ),
        None,
    )
    for ahead in (False, True)
}
_HORIZON_AND_UNCOVERED = select(Horizon(), _any(_uncovered(True)))


def _uncovered_params(state: DeliveryState) -> dict[str, Any]:
    params: dict[str, Any] = _bound("settled", state.settled)
    if state.ahead:
        params["ahead"] = [d.seq for d in state.ahead]
    return params


def read_uncovered_query(state: DeliveryState, *, limit: int) -> tuple[Select[Any], dict[str, Any]]:
    """`read_uncovered`'s statement (built once per shape) and its parameters."""
    return _READ_UNCOVERED[bool(state.ahead)], _uncovered_params(state) | {"limit": limit}


def horizon_and_uncovered_query(
    state: DeliveryState,
) -> tuple[Select[int, bool], dict[str, Any]]:
    """`read_uncovered`'s second statement (nothing read, D not empty) and its parameters:
    the horizon, and whether any event `state` does not cover is visible."""
    return _HORIZON_AND_UNCOVERED, _uncovered_params(state)


async def read_events(
    executor: Executor,
    after: Position | int,
    *,
    limit: int,
    upto: Position | None = None,
    tenants: Collection[str] | None = None,
    pool_id: str | None = None,
    types: Collection[str] | None = None,
) -> list[OutboxEvent]:
    """Visible events with `after < position <= upto`, in position order, at most `limit`.

    With `tenants`, only events whose audience holds one of them, and `audience` holds
    only those tenants; `pool_id` and `types` narrow further.
    """
    query, params = read_events_query(
        after, limit=limit, upto=upto, tenants=tenants, pool_id=pool_id, types=types
    )
    return await _events(executor, query, params)


def read_events_query(
    after: Position | int,
    *,
    limit: int,
    upto: Position | None = None,
    tenants: Collection[str] | None = None,
    pool_id: str | None = None,
    types: Collection[str] | None = None,
) -> tuple[Select[Any], dict[str, Any]]:
    """`read_events`' statement and its parameters."""
    query = select(Event.__table__).where(_after("after"), _VISIBLE)
    params: dict[str, Any] = {**_bound("after", as_position(after)), "limit": limit}
    if upto is not None:
        query = query.where(~_after("upto"))
        params.update(_bound("upto", upto))
    query, narrowed = _narrowed(query, tenants, pool_id, types)
    return _with_audiences(_in_order(query), tenants), params | narrowed


@dataclass(frozen=True, slots=True)
class Uncovered:
    """What one relay read delivers: its events, each with the reader's state just after
    it, the state to continue from, and how many events were read (more than delivered
    when D's bound stopped the read)."""

    events: list[OutboxEvent]
    after: DeliveryState
    read: int


async def read_uncovered(executor: Executor, state: DeliveryState, *, limit: int) -> Uncovered:
    """Visible (committed) events not covered by `state`, above the horizon too, in
    position order, at most `limit`, read with the horizon of the same snapshot (one
    statement); `cursor.advance` decides what of it is delivered, and each delivered
    event is built once, with its state.

    With no event read and D not empty, a second statement reads the horizon, and whether
    any uncovered event is visible, in one snapshot of its own: a horizon from another
    snapshot than the read's could pass an event that committed between the two (seen:
    the two-process test lost events so). If one is visible now, the horizon given is 0
    (nothing settles; the next read takes it)."""
    query, params = read_uncovered_query(state, limit=limit)
    rows = (await executor.execute(query, params)).all()
    if rows:
        horizon = int(rows[0].read_horizon)
    elif state.ahead:
        row = (await executor.execute(*horizon_and_uncovered_query(state))).one()
        horizon = 0 if row[1] else int(row[0])
    else:
        horizon = 0  # nothing read, nothing to settle
    positions = [Position(r.tx, r.seq) for r in rows]
    states, after = advance(state, positions, horizon, complete=len(rows) < limit)
    return Uncovered(_outbox_events(rows[: len(states)], states), after, len(rows))


async def read_between(
    conn: AsyncConnection,
    state: DeliveryState,
    target: DeliveryState,
    *,
    limit: int,
    tenants: Collection[str] | None = None,
    pool_id: str | None = None,
    types: Collection[str] | None = None,
) -> list[OutboxEvent]:
    """The events `target` covers and `state` does not, in position order, at most `limit`
    (a replay behind the relay: every one of them is committed, as the relay read it).
    Filtered as `read_events` is. On a shared connection, in a transaction: each read of
    it planned for its position, as the relay's (engine.RELAY_SETTINGS); a generic plan
    made on a small outbox read the whole table as it grew."""
    settled = ~_after("target")
    if target.ahead:
        settled = settled | Event.seq.in_(bindparam("target_ahead", expanding=True))
    query = select(Event.__table__).where(_uncovered(bool(state.ahead)), settled)
    params = _uncovered_params(state) | _bound("target", target.settled) | {"limit": limit}
    if target.ahead:
        params["target_ahead"] = [d.seq for d in target.ahead]
    query, narrowed = _narrowed(query, tenants, pool_id, types)
    await plan_each_read(conn)
    return await _events(conn, _with_audiences(_in_order(query), tenants), params | narrowed)


def _narrowed(
    query: Select[Any],
    tenants: Collection[str] | None,
    pool_id: str | None,
    types: Collection[str] | None,
) -> tuple[Select[Any], dict[str, Any]]:
    params: dict[str, Any] = {}
    if pool_id is not None:
        query = query.where(Event.pool_id == bindparam("pool_id"))
        params["pool_id"] = pool_id
    if types is not None:
        query = query.where(Event.type.in_(bindparam("types", expanding=True)))
        params["types"] = list(types)
    if tenants is not None:
        query = query.where(
            exists().where(
                EventAudience.seq == Event.seq,
                EventAudience.tenant_id.in_(bindparam("tenants", expanding=True)),
            )
        )
        params["tenants"] = list(tenants)
    return query, params


async def _events(
    executor: Executor, query: Select[Any], params: dict[str, Any]
) -> list[OutboxEvent]:
    return _outbox_events((await executor.execute(query, params)).all())


def _outbox_events(
    rows: Sequence[Any], states: Sequence[DeliveryState | None] | None = None
) -> list[OutboxEvent]:
    """The events of rows read with `_with_audiences`, one row each; with `states`, each
    carrying its own (one per row)."""
    return [
        OutboxEvent(
            seq=r.seq,
            type=r.type,
            pool_id=r.pool_id,
            tenant_id=r.tenant_id,
            occurred_at=r.occurred_at,
            data=dict(r.data),
            audience=frozenset(r.audience or ()),
            tx=r.tx,
            state=state,
        )
        for r, state in zip(rows, states or repeat(None, len(rows)), strict=True)
    ]


async def prune_events(executor: Executor, older_than: datetime, limit: int | None = None) -> int:
    """Delete events that occurred before `older_than`, as a prefix of the position order
    below the horizon, and never the newest visible one (SQLite numbers a new row
    max(seq) + 1, so keeping the newest keeps seqs from ever going back; it also keeps
    `Bounds.newest` a real row). At most `limit` events go per call, so one call is one
    short transaction however far behind pruning is. Records the position pruned through,
    so expiry is exact (`Bounds.expired`). Returns how many were deleted."""
    newest = (await executor.execute(_NEWEST)).one_or_none()
    if newest is None:
        return 0
    candidates = (
        select(Event.tx, Event.seq)
        .where(_VISIBLE, _position() < _at(Position(*newest)), Event.occurred_at < older_than)
        .order_by(Event.tx.desc(), Event.seq.desc())
        .limit(1)
    )
    newest_old = (await executor.execute(candidates)).one_or_none()
    if newest_old is None:
        return 0
    upto = Position(*newest_old)
    if limit is not None:
        nth = (
            await executor.execute(
                select(Event.tx, Event.seq).order_by(Event.tx, Event.seq).offset(limit - 1).limit(1)
            )
        ).one_or_none()
        if nth is not None:
            upto = min(upto, Position(*nth))
    prefix = select(Event.seq).where(_position() <= _at(upto))
    await executor.execute(delete(EventAudience).where(EventAudience.seq.in_(prefix)))
    result = await executor.execute(delete(Event).where(_position() <= _at(upto)))
    await _record_pruned(executor, upto)
    return int(getattr(result, "rowcount", 0) or 0)


async def _record_pruned(executor: Executor, upto: Position) -> None:
    done = await executor.execute(
        update(EventsPruned)
        .where(EventsPruned.id == 1, tuple_(EventsPruned.tx, EventsPruned.seq) < _at(upto))
        .values(tx=upto.tx, seq=upto.seq)
    )
    if not getattr(done, "rowcount", 0):
        present = (await executor.execute(_PRUNED)).one_or_none()
        if present is None:
            await executor.execute(insert(EventsPruned).values(id=1, tx=upto.tx, seq=upto.seq))
