"""The relay: one per process, it reads new outbox rows once per wake-up and fans them
out to this process's subscriptions.

- Wake-ups come from this process's commits and, through the broker, from other
  processes; a periodic poll covers any that were lost.
- Each subscription has a bounded mailbox. The relay never waits for a subscriber: when
  a mailbox is full it is emptied and the subscription falls back to reading the outbox
  itself from its own cursor, then rejoins the live stream. Memory per subscriber stays
  bounded however slow its client is.
- A subscription whose client has not taken a message for `stall_timeout_s` while
  one is pending (its socket's buffers are full) is evicted: its stream is cancelled
  and `on_evict` lets the transport close the connection, so the client resumes from
  its last cursor. Time the server spends preparing the message (a read of its own,
  `Subscription.preparing`) or away on other work (a late event loop) is not counted:
  only a client that stopped reading is closed.

Who may read each event, and what of it, is the domain's rule: the relay is given it as
`visibility` (app/events/delivery.py) and asks it once per batch it reads.

Exactly once, every pool's in commit order (docs/decisions/0012-commit-ordered-positions.md,
"Delivery above the horizon"): the relay and each subscription keep a delivery state
(L, D) (cursor.py), and each read takes the visible events that state does not cover, in
position order, above the transaction-id horizon too (at most MAX_AHEAD of them above L;
past that, the rest wait for the horizon). A subscription that is not live replays
behind the relay: only what the relay's state covers and its own does not, and it takes
its mailbox once its state is the relay's (checked with no await before `live = True`),
so every event the relay reads afterwards is mailed to it and none it delivered is. Live,
an event carries the relay's state after it, which is the subscription's too: one cursor
for every subscriber, so rendered frames stay shared.

While the relay's D is not empty (events delivered above the horizon), or its bound
stopped a read, it reads again after a short, growing pause (1 ms doubling to 20 ms, or to
the poll interval if shorter), so L follows the horizon even when no wake-up comes.

`pool.usage` (CONTRACT section 10: state, not history) is not in the outbox. Every
`usage_interval_s` the relay reads a usage horizon and the rows a booking or release
stamped since the last round (app/events/usage.py), at most `usage_round_rows` of them,
oldest stamp first, and mails each live subscription that accepts `pool.usage` one event
per pool, with the rows its own query shows now (the domain's `load_usage`). Each
subscription keeps the mark through which it was offered every change (`usage_at`: a
stamp, and within it a row key); it moves only as far as the round read, so a backlog
is sent over the next rounds. A usage event's cursor carries the last outbox position
the subscription delivered and, on the last event of a round, the stamp of the mark the
round reached (on the others the round's start, so resuming after any of them misses no
pool of the round; a mark inside one stamp's rows is carried as that stamp, so a resume
reads those rows again). A subscription resumed after such a cursor, or one whose
mailbox overflowed, is sent the latest usage of every pool stamped since its horizon once
it is live again; one resumed after an outbox event's cursor (which says nothing of
usage), that of every pool ever booked that it may see, over as many rounds as it takes.
Subscriptions level with the horizon are read for first and those catching up
(`usage_behind`) with what is left of the round's rows, so a reconnecting client costs
no more than the bound and does not hold back the others' usage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable, Collection, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Generic

from app import metrics
from app.config import Settings
from app.db.engine import Database, Executor
from app.db.session_statements import AutocommitStatements
from app.errors import InvalidInput, InvalidState
from app.events.cursor import (
    START,
    DeliveryState,
    Position,
    ResumePoint,
    covered_between,
)
from app.events.delivery import F, ShownEvents, ShownUsage, Visibility
from app.events.reader import (
    OutboxEvent,
    issued_bounds,
    outbox_bounds,
    prune_events,
    read_between,
    read_uncovered,
)
from app.events.tasks import cancel_and_wait
from app.events.usage import (
    USAGE_EVENT,
    USAGE_ROUND_ROWS,
    UsageChanges,
    UsageMark,
    usage_changes,
)

log = logging.getLogger(__name__)

CURSOR_EXPIRED = "CURSOR_EXPIRED"


# Events deleted per pruning transaction: bounds the lock and WAL of each one.
PRUNE_BATCH = 5000
# Re-reads while a committed event is still above the horizon: first pause, longest pause.
HORIZON_RETRY_FIRST_S = 0.001
HORIZON_RETRY_MAX_S = 0.02


def cursor_expired() -> InvalidState:
    return InvalidState(
        "the cursor is older than the event retention window; "
        "refetch the current state, then subscribe without `after`",
        field="after",
        reason=CURSOR_EXPIRED,
    )


class Mailbox:
    """A bounded queue that empties itself instead of growing. Idle, it holds no buffer
    and no waiter beyond one future: a server keeps thousands of these."""

    __slots__ = ("_capacity", "_items", "_waiter", "overflowed")

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._items: deque[OutboxEvent] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.overflowed = False

    def __len__(self) -> int:
        return len(self._items) if self._items is not None else 0

    def put(self, event: OutboxEvent) -> bool:
        """False when full: everything queued is dropped, the owner must resync."""
        if self._items is None:
            self._items = deque()
        if len(self._items) >= self._capacity:
            self._items = None
            self.overflowed = True
            self._wake()
            return False
        self._items.append(event)
        self._wake()
        return True

    async def get(self) -> OutboxEvent | None:
        """The next event, or None after an overflow."""
        while not self._items:
            if self.overflowed:
                self.overflowed = False
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        event = self._items.popleft()
        if not self._items:
            self._items = None
        return event

    def reset(self) -> None:
        self._items = None
        self.overflowed = False

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class Subscription(Generic[F]):
    """One subscriber's stream: from the outbox until level with the relay, then live."""

    def __init__(
        self,
        relay: Relay[F],
        event_filter: F,
        start: DeliveryState,
        usage_from: int | None = None,
        usage_behind: bool = False,
    ) -> None:
        self.filter = event_filter
        # Every event this state covers is delivered or not for us (cursor.py).
        self.state = start
        # `pool.usage`: every change up to the mark `usage_at` was offered to us, every one
        # stamped below `usage_delivered` delivered (module docstring). None: it takes none.
        self.wants_usage = event_filter.types is None or USAGE_EVENT in event_filter.types
        self.usage_delivered = usage_from if self.wants_usage else None
        self.usage_at = None if self.usage_delivered is None else UsageMark(self.usage_delivered)
        # Resumed, or overflowed: catching up on usage until a read reaches the horizon.
        self.usage_behind = usage_behind
        self.live = False
        # Replaying toward a state the relay had: the relay mails what it reads after it
        # (stream, "joining"); cleared by the relay when the mailbox overflows.
        self.joining = False
        self.mailbox = Mailbox(relay.queue_size)
        self.on_evict: Callable[[], None] | None = None
        self.evicted = False
        self.resyncs = 0  # how often the mailbox overflowed and the outbox was read instead
        self._relay = relay
        self._task: asyncio.Task[object] | None = None
        self._waiting_since: float | None = None  # when the client last had to take a message
        self._preparing = 0  # reads of the server's own for the pending message, under way

    async def stream(self) -> AsyncIterator[OutboxEvent]:
        relay = self._relay
        loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        relay.attach(self)
        try:
            while True:
                if not self.live:
                    # Replay behind the relay (ADR 0012, "The handover"): only what the
                    # relay has covered, so that once level the two states are one.
                    target = relay.state
                    if not self.state.within(target):
                        await relay.reach(self.state)  # a cursor ahead of this relay
                        continue
                    # From here the relay mails us every event it reads after `target`
                    # (its fan-out and its state move together, with no await between),
                    # so once the replay has covered `target` we join whatever the relay
                    # did meanwhile: no race to be level with it again, which a relay
                    # that moves on every few milliseconds could win forever.
                    self.mailbox.reset()
                    self.joining = True
                    try:
                        page, complete = await relay.replay_page(self, target)
                        for event, state in page:
                            if event is not None:
                                self._waiting_since = loop.time()
                                yield event
                                self._waiting_since = None
                            self.state = state
                    except BaseException:
                        self.joining = False
                        raise
                    joined, self.joining = self.joining, False
                    if complete:
                        self.state = target  # every event it covers, we have too
                        if joined:  # the mailbox holds every event read after `target`
                            self.live = True
                    continue
                mailed = await self.mailbox.get()
                if mailed is None:
                    continue  # the relay set live = False when it overflowed
                if mailed.usage is not None:
                    # State, not history: positioned at our last outbox event, so its
                    # cursor resumes the outbox exactly; its own reads and renderings,
                    # as the cursor is ours alone.
                    at = self.state.settled
                    usage = replace(mailed, tx=at.tx, seq=at.seq, state=self.state, reads={})
                    self._waiting_since = loop.time()
                    yield usage
                    self._waiting_since = None
                    self.usage_delivered = mailed.usage
                    continue
                if self.state.covers(mailed.position):
                    continue  # never, as the relay reads each event once; kept as a guard
                self._waiting_since = loop.time()
                yield mailed
                self._waiting_since = None
                # The relay's state after it: ours was the relay's when we joined, and
                # since then the relay read only what it mailed or what is not for us.
                self.state = mailed.state or DeliveryState(mailed.position)
        finally:
            relay.detach(self)

    def offer(self, event: OutboxEvent) -> bool:
        """False when the mailbox overflowed (the subscription resyncs)."""
        if self.joining:
            if not self.mailbox.put(event):
                self.joining = False  # dropped: the join starts again from a new target
                return False
            return True
        if self.live and not self.mailbox.put(event):
            self.live = False
            self.resyncs += 1
            # Usage mailed and dropped: sent again from what was delivered, once live.
            if self.usage_delivered is not None:
                self.usage_at = UsageMark(self.usage_delivered)
                self.usage_behind = True
            return False
        return self.live

    @contextlib.contextmanager
    def preparing(self) -> Iterator[None]:
        """The server itself is still preparing the message handed out (a read for it,
        waiting its turn): that time is not the client's, whose stall clock starts again
        once it is ready. Under load such reads take long; counting them closed clients
        that were reading (4413)."""
        self._preparing += 1
        try:
            yield
        finally:
            self._preparing -= 1
            if self._waiting_since is not None:
                self._waiting_since = asyncio.get_running_loop().time()

    def stalled(self, now: float, timeout_s: float) -> bool:
        return (
            self._preparing == 0
            and self._waiting_since is not None
            and now - self._waiting_since > timeout_s
        )

    def excuse(self, seconds: float) -> None:
        """The event loop itself was away this long: not the client's time either."""
        if self._waiting_since is not None:
            self._waiting_since += seconds

    def evict(self) -> None:
        if self.evicted:
            return
        self.evicted = True
        self._relay.detach(self)
        if self.on_evict is not None:
            self.on_evict()
        if self._task is not None:
            self._task.cancel()


class Relay(Generic[F]):
    def __init__(
        self,
        db: Database,
        visibility: Visibility[F],
        *,
        queue_size: int = 1000,
        poll_interval_s: float = 2.0,
        stall_timeout_s: float = 8.0,
        retention_s: float = 0,
        batch_size: int = 500,
        usage_interval_s: float = 0.1,
        usage_round_rows: int = USAGE_ROUND_ROWS,
    ) -> None:
        self.queue_size = queue_size
        self.usage_interval_s = usage_interval_s
        self.usage_round_rows = usage_round_rows  # rows one usage round reads at most
        self.usage_rounds = 0  # usage rounds that read changes (for tests)
        self.usage_rows_read = 0  # rows the usage rounds read, in all
        self.usage_rows_most = 0  # the most rows one usage round read
        # What the relay has offered to the subscriptions (cursor.py): (L, D).
        self.state = DeliveryState(START)
        self.db = db
        self._visibility = visibility
        # The relay's reads, one wake-up at a time: on PostgreSQL without a transaction
        # (each statement sees what had committed when it ran, as under READ COMMITTED
        # in one), which saves a BEGIN and a ROLLBACK round trip per wake-up. Not behind
        # PgBouncer's transaction pooling, where only a transaction keeps a statement on
        # the server connection that prepared it. On connections of the relay's own where
        # the database has them (engine.RELAY_SETTINGS: each read planned for its position).
        self._drain_reader = (
            (db.relay or db.reader).execution_options(isolation_level="AUTOCOMMIT")
            if db.dialect == "postgresql" and not db.pooled_by_transaction
            else db.reader
        )
        # Its statements built once run on the driver where the database compiles them
        # (app/db/session_statements.py): a relay read's own CPU is what delays delivery
        # when writers keep every core busy (bench.outbox_contention).
        self._driver = db.driver if self._drain_reader is not db.reader else None
        self._held: AutocommitStatements | None = None  # its connection, held (_drain_reads)
        self._poll_interval_s = poll_interval_s
        self._stall_timeout_s = stall_timeout_s
        self._retention_s = retention_s
        self._batch_size = batch_size
        self._wanted = asyncio.Event()
        self._subscriptions: set[Subscription[F]] = set()
        self._by_tenant: dict[str, set[Subscription[F]]] = defaultdict(set)
        self._tasks: list[asyncio.Task[None]] = []
        self._cursor_ready = False
        self._cursor_lock = asyncio.Lock()
        # One drain at a time: the loop's, and those asked for by `fresh_drain`.
        self._drain_lock = asyncio.Lock()
        self._drains_started = 0
        self._last_good_drain = 0  # the number of the last drain that ended without error
        # The last drain left committed events above the horizon (in D, waiting for it to
        # pass them, or beyond D's bound): look again soon.
        self._above_horizon = False
        self.blocked_reads = 0  # reads D's bound stopped (the rest waited for the horizon)
        self.newest_known = START  # the newest committed position a wake-up or a read told of
        self.caught_up_at: float | None = None  # loop time the relay last read to the end

    @property
    def cursor(self) -> Position:
        """The newest position the relay has offered."""
        return self.state.newest

    @property
    def cursor_ready(self) -> bool:
        return self._cursor_ready

    @property
    def subscriptions(self) -> int:
        return len(self._subscriptions)

    @property
    def live_subscriptions(self) -> int:
        """Subscriptions level with the relay (reading their mailbox, not the outbox)."""
        return sum(1 for s in self._subscriptions if s.live)

    async def start(self) -> None:
        try:
            await self._ensure_cursor()
        except Exception as exc:  # the database is away: the API still starts (UNAVAILABLE)
            log.warning("event relay: no cursor yet: %s: %s", type(exc).__name__, exc)
        self._tasks = [
            asyncio.create_task(self._relay_loop(), name="event-relay"),
            asyncio.create_task(self._watch_stalls(), name="event-relay-stalls"),
            asyncio.create_task(self._usage_loop(), name="event-relay-usage"),
        ]
        if self._retention_s > 0:
            self._tasks.append(asyncio.create_task(self._prune_loop(), name="event-pruner"))

    async def stop(self) -> None:
        # Between drains (one under way ends first, within the statement timeout): the
        # held connection goes back to its pool whole, not cut off mid-statement.
        async with self._drain_lock:
            await cancel_and_wait(self._tasks)
            self._tasks = []
            await self._discard_held(failed=False)

    def wake(self, position: Position | None) -> None:
        """A wake-up: the newest position committed somewhere, None means "check"."""
        if position is None or not self.state.covers(position):
            self._wanted.set()
        if position is not None and position > self.newest_known:
            self.newest_known = position
            metrics.OUTBOX_LAG.set(self.lag)

    @property
    def lag(self) -> int:
        """Events committed (as far as this process knows) that it has not relayed yet:
        0 when level, else at least 1 (seqs are drawn before commit, so the count is
        approximate)."""
        if self.state.covers(self.newest_known):
            return 0
        return max(1, self.newest_known.seq - self.cursor.seq)

    async def _ensure_cursor(self) -> None:
        """Start the relay's cursor at the newest event, once; retried until the database
        answers. Under the lock, every subscription opens after it is set."""
        if self._cursor_ready:
            return
        async with self._cursor_lock:
            if self._cursor_ready:
                return
            async with self.db.reader.connect() as conn:
                self.state = DeliveryState((await outbox_bounds(conn)).newest)
            self.newest_known = max(self.newest_known, self.cursor)
            self._cursor_ready = True

    async def open(self, event_filter: F, after: ResumePoint | Position | None) -> Subscription[F]:
        """A subscription starting now, or right after the `after` state (and, for a
        `pool.usage` cursor, its usage horizon). Now means after every event committed
        before it opened, those above the horizon too: the relay reads once more (a read
        that starts after this call) and the subscription starts from its state."""
        await self._ensure_cursor()
        async with self.db.reader.connect() as conn:
            # From now, for `pool.usage` too: every change a transaction still running (or
            # a later one) makes is stamped at or above this horizon (app/events/usage.py).
            horizon = (await usage_changes(conn, None)).horizon
            if after is not None:
                bounds = await outbox_bounds(conn)
                issued, next_xid = await issued_bounds(conn)
        if after is None:
            await self.fresh_drain()
            return Subscription(self, event_filter, self.state, usage_from=horizon)
        point = after if isinstance(after, ResumePoint) else ResumePoint(after)
        issued = max(issued, bounds.newest)  # `newest` counts what retention pruned
        usage_bound = horizon if next_xid is None else next_xid
        if point.state.newest > issued or (point.usage is not None and point.usage > usage_bound):
            raise InvalidInput("the cursor is not one this service issued", field="after")
        if bounds.expired(point.position):
            raise cursor_expired()
        # An outbox event's cursor says nothing of usage: every pool ever booked (stamps
        # start at 1; 0 is a row no booking touched).
        usage_from = point.usage if point.usage is not None else 1
        return Subscription(
            self, event_filter, point.state, usage_from=usage_from, usage_behind=True
        )

    def attach(self, subscription: Subscription[F]) -> None:
        self._subscriptions.add(subscription)
        metrics.SUBSCRIPTIONS.set(len(self._subscriptions))
        for tenant in subscription.filter.tenants:
            self._by_tenant[tenant].add(subscription)

    def detach(self, subscription: Subscription[F]) -> None:
        self._subscriptions.discard(subscription)
        metrics.SUBSCRIPTIONS.set(len(self._subscriptions))
        for tenant in subscription.filter.tenants:
            members = self._by_tenant.get(tenant)
            if members is not None:
                members.discard(subscription)
                if not members:
                    del self._by_tenant[tenant]

    async def replay_page(
        self, subscription: Subscription[F], target: DeliveryState
    ) -> tuple[list[tuple[OutboxEvent | None, DeliveryState]], bool]:
        """The subscription's next page of what `target` (the relay's state) covers and its
        own state does not: each event as it may read it (None: not for it) with the state
        after it, and whether that was all of it."""
        flt = subscription.filter
        state = subscription.state
        async with self.db.reader.connect() as conn:
            bounds = await outbox_bounds(conn)
            if bounds.expired(state.settled):
                raise cursor_expired()
            events = await read_between(
                conn,
                state,
                target,
                limit=self._batch_size,
                tenants=flt.tenants,
                pool_id=flt.pool_id,
                types=flt.types,
            )
            # Pruning may have committed between the two reads (each statement sees its
            # own snapshot on PostgreSQL): if it has now pruned past the cursor, the read
            # may have missed an event. Pruning only deletes a prefix and records how far,
            # so if it has not, nothing the read needed was gone.
            if (await outbox_bounds(conn)).expired(state.settled):
                raise cursor_expired()
            shown_events = await self._visibility.load(conn, events)
        page: list[tuple[OutboxEvent | None, DeliveryState]] = []
        for event in events:
            state = covered_between(state, target, event.position)
            shown = shown_events.readable(event, flt)
            page.append((None if shown is None else replace(shown, state=state), state))
        return page, len(events) < self._batch_size

    async def reach(self, state: DeliveryState) -> None:
        """Until the relay covers `state` (a resumed cursor ahead of this relay: another
        process's relay had read further, or D held an event this one has not read yet)."""
        pause = HORIZON_RETRY_FIRST_S
        while True:
            await self.fresh_drain()
            if state.within(self.state):
                return
            await asyncio.sleep(pause)
            pause = min(2 * pause, HORIZON_RETRY_MAX_S)

    async def fresh_drain(self) -> None:
        """Return once a drain that started after this call has ended without error: one
        shared by every caller waiting meanwhile. Raises what the database raised."""
        called = self._drains_started
        async with self._drain_lock:
            if self._last_good_drain > called:
                return
            await self._drain_locked()

    # -- the loops ------------------------------------------------------------------------

    async def _relay_loop(self) -> None:
        retry_s = 0.0  # > 0 while a committed event is still above the horizon
        while True:
            # The poll interval bounds every wait ("at least this often"): a retry's
            # pause for the horizon grows past it only when the poll is longer still.
            wait_s = min(retry_s, self._poll_interval_s) if retry_s else self._poll_interval_s
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._wanted.wait()
            self._wanted.clear()
            try:
                await self._drain()
            except Exception as exc:  # the database is away: the next round retries
                log.warning("event relay: %s: %s", type(exc).__name__, exc)
                retry_s = 0.0
                continue
            if not self.state.covers(self.newest_known) or self._above_horizon:
                retry_s = min(2 * retry_s or HORIZON_RETRY_FIRST_S, HORIZON_RETRY_MAX_S)
            else:
                retry_s = 0.0

    async def _drain(self) -> None:
        async with self._drain_lock:
            await self._drain_locked()

    async def _drain_locked(self) -> None:
        await self._ensure_cursor()
        self._drains_started += 1
        number = self._drains_started
        while True:
            async with self._drain_reads() as reads:
                uncovered = await read_uncovered(reads, self.state, limit=self._batch_size)
                taken, after = uncovered.events, uncovered.after
                shown_events = await self._shown(reads, taken)
                # No await from the last audience check to the new state: a subscription
                # that joins takes a state and is mailed every event read after it.
                self._fan_out(taken, shown_events)
                self.state = after
            blocked = len(taken) < uncovered.read  # D is full: the rest waits for the horizon
            self.blocked_reads += blocked
            self._above_horizon = bool(after.ahead) or blocked
            if uncovered.read < self._batch_size or blocked:
                self._last_good_drain = number
                self._caught_up()
                return

    @contextlib.asynccontextmanager
    async def _drain_reads(self) -> AsyncIterator[AutocommitStatements]:
        """A drain's statements. On the relay's own connections (PostgreSQL, no
        PgBouncer: each statement its own snapshot), one connection held from drain to
        drain, as checking one out and back in cost about a quarter of a relay read's
        CPU; after any failure it is discarded and the next drain opens another. Where
        the relay shares the requests' pool, a connection per drain, so that it never
        keeps one from them."""
        if self.db.relay is None:
            async with self._drain_reader.connect() as conn:
                yield AutocommitStatements(conn, self._driver)
            return
        if self._held is None:
            self._held = AutocommitStatements(await self._drain_reader.connect(), self._driver)
        reads = self._held
        try:
            yield reads
            await reads.connection.rollback()  # no round trip (AUTOCOMMIT): its own state
        except BaseException:
            await self._discard_held()
            raise

    async def _discard_held(self, *, failed: bool = True) -> None:
        """Let go of the held connection: after a failure it is invalidated (the pool
        opens another), else it goes back to its pool."""
        held, self._held = self._held, None
        if held is not None:
            with contextlib.suppress(Exception):
                if failed:
                    await held.connection.invalidate()
                await held.connection.close()

    def _caught_up(self) -> None:
        self.newest_known = max(self.newest_known, self.cursor)
        self.caught_up_at = asyncio.get_running_loop().time()
        metrics.OUTBOX_LAG.set(self.lag)

    async def _shown(self, conn: Executor, events: list[OutboxEvent]) -> ShownEvents[F] | None:
        """What deciding the events needs, loaded for those with a subscription in their
        audience only (a process with none reads no visibility for them). Loaded again
        if a subscription opened during the load wants an event outside it."""
        shown: ShownEvents[F] | None = None
        loaded: set[Position] = set()
        while True:
            wanted = [e for e in events if self._has_audience(e)]
            if {e.position for e in wanted} <= loaded:
                return shown
            shown = await self._visibility.load(conn, wanted)
            loaded = {e.position for e in wanted}

    def _has_audience(self, event: OutboxEvent) -> bool:
        # Any subscription attached for a tenant of the audience (a replaying one too: a
        # load too many is harmless); linear in the audience, no set built per event.
        return any(tenant in self._by_tenant for tenant in event.audience)

    def _fan_out(
        self, events: Collection[OutboxEvent], shown_events: ShownEvents[F] | None
    ) -> None:
        for event in events:
            metrics.relay_delivered(event.occurred_at.timestamp())
            if shown_events is None:
                continue
            for subscription in self._audience_subscriptions(event):
                if not (subscription.live or subscription.joining):
                    continue
                # Each subscription gets the event as its caller may read it.
                shown = shown_events.readable(event, subscription.filter)
                if shown is not None:
                    subscription.offer(shown)

    def _audience_subscriptions(self, event: OutboxEvent) -> Collection[Subscription[F]]:
        """Subscriptions whose tenant, or one of its ancestors, is in the audience."""
        found = [self._by_tenant.get(tenant) for tenant in event.audience]
        groups = [g for g in found if g]
        if len(groups) == 1:
            return list(groups[0])
        return set().union(*groups)

    async def _usage_loop(self) -> None:
        while True:
            await asyncio.sleep(self.usage_interval_s)
            try:
                await self.usage_round()
            except Exception as exc:  # the database is away: the next round retries
                log.warning("usage relay: %s: %s", type(exc).__name__, exc)

    async def usage_round(self) -> None:
        """One coalescing window's `pool.usage` events: one per changed pool to each live
        subscription that accepts them and may see it. It reads at most `usage_round_rows`
        rows, the oldest stamps first, and each subscription's `usage_at` moves only as far
        as they reach: the rest is read in the next rounds.

        Subscriptions level with the horizon are read for first; those catching up
        (`usage_behind`: resumed after a cursor, or after an overflow, until a read of
        theirs reaches the horizon) with what is left of the bound, from the oldest of
        their marks. So a client catching up (a resume after an outbox cursor starts at
        stamp 1) neither reads more than the bound nor holds back the others' usage."""
        takers = [
            (s, s.usage_at)
            for s in self._subscriptions
            if s.live and s.usage_at is not None and not s.evicted
        ]
        if not takers:
            return
        groups = [
            group
            for group in (
                [(s, at) for s, at in takers if not s.usage_behind],
                [(s, at) for s, at in takers if s.usage_behind],
            )
            if group
        ]
        budget = self.usage_round_rows
        reads: list[tuple[list[Subscription[F]], UsageChanges]] = []
        async with self._drain_reader.connect() as conn:
            reads_on = AutocommitStatements(conn, self._driver)
            for group in groups:
                if budget < 1:
                    break  # the rest waits for the next round, their marks unchanged
                since = min(at for _, at in group)
                found = await usage_changes(reads_on, since, limit=budget)
                budget -= found.rows
                reads.append(([s for s, _ in group], found))
            read = self.usage_round_rows - budget
            self.usage_rows_read += read
            self.usage_rows_most = max(self.usage_rows_most, read)
            moved: dict[str, set[str | None]] = defaultdict(set)
            for _, found in reads:
                for change in found.changes:
                    moved[change.pool_id].add(change.tenant_id)
            if not moved:
                for subscriptions, found in reads:
                    for s in subscriptions:
                        if s.usage_at is not None:
                            s.usage_at = max(s.usage_at, found.reach)
                            s.usage_behind = s.usage_behind and not found.complete
                return
            self.usage_rounds += 1
            shown = await self._visibility.load_usage(
                reads_on, {pool_id: frozenset(t) for pool_id, t in moved.items()}
            )
            for subscriptions, found in reads:
                for subscription in subscriptions:
                    await self._offer_usage(subscription, found, shown)

    async def _offer_usage(
        self,
        subscription: Subscription[F],
        found: UsageChanges,
        shown: ShownUsage[F],
    ) -> None:
        start = subscription.usage_at
        if start is None:
            return
        moved: dict[str, set[str | None]] = defaultdict(set)
        for change in found.changes:
            if change.mark > start:
                moved[change.pool_id].add(change.tenant_id)
        events = []
        for pool_id in sorted(moved):
            event = await shown.readable(pool_id, frozenset(moved[pool_id]), subscription.filter)
            if event is not None:
                events.append(event)
        # Only the round's last event says "everything stamped below this": resuming after
        # an earlier one must still get the pools after it. A cursor carries a stamp alone,
        # so a mark inside one stamp's rows says "below that stamp" (a resume reads those
        # rows again: state, not history).
        upto = max(start, found.reach)
        for i, event in enumerate(events):
            usage = upto.stamp if i == len(events) - 1 else start.stamp
            if not subscription.offer(replace(event, usage=usage)):
                return  # overflowed: usage_at went back to what was delivered
        if subscription.live:
            subscription.usage_at = upto
            subscription.usage_behind = subscription.usage_behind and not found.complete

    async def _watch_stalls(self) -> None:
        loop = asyncio.get_running_loop()
        period = min(1.0, self._stall_timeout_s / 4)
        while True:
            before = loop.time()
            await asyncio.sleep(period)
            now = loop.time()
            # A busy loop woke us late: no client could be served meanwhile, however
            # fast it reads, so that time is taken off every client's stall clock.
            late = now - before - period
            if late > period:
                for subscription in self._subscriptions:
                    subscription.excuse(late)
            for subscription in list(self._subscriptions):
                if subscription.stalled(now, self._stall_timeout_s):
                    log.warning("evicting a subscription: its client stopped reading")
                    subscription.evict()

    async def _prune_loop(self) -> None:
        while True:
            try:
                older_than = datetime.now(UTC) - timedelta(seconds=self._retention_s)
                pruned = 0
                while True:  # short transactions until caught up
                    async with self.db.writer.begin() as conn:
                        batch = await prune_events(conn, older_than, limit=PRUNE_BATCH)
                    pruned += batch
                    if batch < PRUNE_BATCH:
                        break
                if pruned:
                    log.info("pruned %d events older than %s", pruned, older_than.isoformat())
            except Exception as exc:  # try again next round
                log.warning("event pruning: %s: %s", type(exc).__name__, exc)
            await asyncio.sleep(min(60.0, max(1.0, self._retention_s / 10)))


def relay_for(db: Database, settings: Settings, visibility: Visibility[F]) -> Relay[F]:
    return Relay(
        db,
        visibility,
        queue_size=settings.subscriber_queue_size,
        poll_interval_s=settings.event_poll_interval_s,
        stall_timeout_s=settings.subscriber_stall_timeout_s,
        retention_s=settings.event_retention_s,
        usage_interval_s=max(1, settings.usage_coalesce_ms) / 1000,
        usage_round_rows=settings.usage_round_rows,
    )
