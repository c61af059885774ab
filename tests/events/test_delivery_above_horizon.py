"""Delivery above the transaction-id horizon (docs/decisions/0012-commit-ordered-positions.md,
"Delivery above the horizon"): a committed event is delivered without waiting for older
transactions still running; the delivery state (L, D) in each cursor keeps resuming exact;
D holds at most MAX_AHEAD positions, beyond which events wait for the horizon as before.
Real PostgreSQL, the real app's relay, events written through the real outbox writer."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.applications import Starlette

from app.capacity.service import Capacity
from app.events import relay as relay_module
from app.events.cursor import MAX_AHEAD, decode_resume, encode_cursor, encode_usage_cursor
from app.events.outbox import PendingEvent, append_events, lock_pool_for_events
from app.events.reader import OutboxEvent
from app.events.relay import Relay
from tests.events.conftest import AppFactory
from tests.events.support import Collector, emit_updates, settle, subscribe, wait_until
from tests.rest.scene import Scene
from tests.support import Api, Fleet

pytestmark = pytest.mark.parametrize("dialect", ["postgresql"])  # SQLite has no horizon


def _update(pool_id: str, n: int) -> PendingEvent:
    return PendingEvent(
        type="pool.updated",
        pool_id=pool_id,
        tenant_id="acme",
        data={"n": n},
        audience=frozenset({"acme"}),
    )


@asynccontextmanager
async def held_open(capacity: Capacity, pool_id: str, n: int) -> AsyncIterator[asyncio.Task[None]]:
    """A transaction that locks `pool_id` (a write: it holds a transaction id, so the
    horizon stays at or below it) and stays open until the block ends, then commits its
    own event `n` for that pool. Yields its task."""
    release = asyncio.Event()
    locked = asyncio.Event()

    async def run() -> None:
        async with capacity.unit_of_work() as uow:
            assert await uow.lock_pool(pool_id)
            await uow.session.execute(text("SELECT pg_current_xact_id()"))
            locked.set()
            await release.wait()
            uow.emit(_update(pool_id, n))

    task = asyncio.create_task(run())
    await asyncio.wait([task, asyncio.create_task(locked.wait())], return_when="FIRST_COMPLETED")
    assert locked.is_set(), task.result()
    try:
        yield task
    finally:
        release.set()
        await task


def _key(event: OutboxEvent) -> tuple[str, int]:
    return event.pool_id, int(event.data["n"])


def _per_pool(events: Sequence[OutboxEvent]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = defaultdict(list)
    for event in events:
        found[event.pool_id].append(int(event.data["n"]))
    return dict(found)


async def _resume_from_each(
    app: Starlette, token: str, delivered: Sequence[OutboxEvent], cursors: Sequence[int]
) -> None:
    """Resuming after the cursor of each `delivered[i]` gives exactly the events after it,
    each once, every pool's in order."""
    for i in cursors:
        resumed = await subscribe(app, token, "acme", after=delivered[i].cursor)
        later = delivered[i + 1 :]
        count = len(later)
        await wait_until(lambda r=resumed, n=count: len(r.events) >= n)  # type: ignore[misc]
        await settle(app, resumed)
        assert Counter(map(_key, resumed.events)) == Counter(map(_key, later)), i
        assert _per_pool(resumed.events) == _per_pool(later), i
        await resumed.close()


async def test_an_event_is_delivered_while_an_older_transaction_holds_the_horizon(
    app: Starlette, api: Api, fleet: Fleet
) -> None:
    """Pool A's transaction starts first and stays open; B's and C's events commit and are
    delivered at once. A's own event (a smaller position than theirs) arrives once when A
    commits, and a resume after any cursor handed out gives exactly the later events."""
    s = await Scene.start(api, fleet)
    capacity: Capacity = app.state.capacity
    relay: Relay = app.state.relay
    pool_a, pool_b, pool_c = [(await s.pool())["id"] for _ in range(3)]
    watching = await subscribe(app, s.token, "acme")
    async with held_open(capacity, pool_a, 0) as long:
        await emit_updates(capacity, pool_b, "acme", 1, start=1)
        await wait_until(lambda: [_key(e) for e in watching.events] == [(pool_b, 1)])
        await emit_updates(capacity, pool_c, "acme", 2, start=1)  # one transaction, two events
        await emit_updates(capacity, pool_b, "acme", 1, start=2)
        await wait_until(lambda: len(watching.events) == 4)
        assert not long.done()  # all of it while A was still running
        # Above the horizon, delivered: the cursors carry them as D (ev4).
        held = [decode_resume(e.cursor) for e in watching.events]
        assert [len(p.ahead) for p in held] == [1, 2, 3, 4]
        assert {p.position for p in held} == {held[0].position}  # L waits for the horizon
    await emit_updates(capacity, pool_b, "acme", 1, start=3)
    await settle(app, watching)
    delivered = watching.events
    assert [_key(e) for e in delivered] == [
        (pool_b, 1),
        (pool_c, 1),
        (pool_c, 2),
        (pool_b, 2),
        (pool_a, 0),
        (pool_b, 3),
    ]
    # A's event has the smallest position of all: the transaction id it got first.
    assert delivered[4].position < min(e.position for e in delivered[:4])
    assert not relay.state.ahead  # the horizon has passed them all: L alone again
    await _resume_from_each(app, s.token, delivered, range(len(delivered)))
    await watching.close()


async def test_past_its_bound_d_waits_for_the_horizon_and_nothing_is_lost_or_repeated(
    app: Starlette, api: Api, fleet: Fleet
) -> None:
    """MAX_AHEAD + 3 transactions on pool B commit while A holds the horizon: the relay
    delivers MAX_AHEAD of them (B's first ones, in order) and the rest wait, even after a
    read begun once they had all committed; when A ends, the rest arrive, each once."""
    s = await Scene.start(api, fleet)
    capacity: Capacity = app.state.capacity
    relay: Relay = app.state.relay
    pool_a, pool_b = [(await s.pool())["id"] for _ in range(2)]
    watching = await subscribe(app, s.token, "acme")
    total = MAX_AHEAD + 3
    async with held_open(capacity, pool_a, 0):
        for n in range(1, total + 1):
            await emit_updates(capacity, pool_b, "acme", 1, start=n)
        await relay.fresh_drain()  # a read that began after every commit above
        await wait_until(lambda: watching.idle and len(watching.events) == MAX_AHEAD)
        assert [_key(e) for e in watching.events] == [(pool_b, n) for n in range(1, MAX_AHEAD + 1)]
        assert len(relay.state.ahead) == MAX_AHEAD
        assert len(decode_resume(watching.events[-1].cursor).ahead) == MAX_AHEAD
        # A resume from a cursor with a full D, while the horizon is still held: it joins
        # the relay, which has nothing more to give yet.
        early = await subscribe(app, s.token, "acme", after=watching.events[3].cursor)
        await wait_until(lambda: early.idle and len(early.events) == MAX_AHEAD - 4)
    await settle(app, watching, early)
    expected = [(pool_b, n) for n in range(1, total + 1)] + [(pool_a, 0)]
    assert Counter(map(_key, watching.events)) == Counter(expected)
    assert _per_pool(watching.events)[pool_b] == list(range(1, total + 1))
    assert Counter(map(_key, early.events)) == Counter(expected[4:])
    await _resume_from_each(app, s.token, watching.events, [0, MAX_AHEAD - 1, MAX_AHEAD])
    await early.close()
    await watching.close()


async def test_cursors_spelled_before_d_still_resume_exactly(
    app: Starlette, api: Api, fleet: Fleet
) -> None:
    """ev1 (tx 0), ev2 (a position) and ev3 (a `pool.usage` event's: a position and a usage
    horizon) mean what they meant: every later event, each once."""
    s = await Scene.start(api, fleet)
    capacity: Capacity = app.state.capacity
    pool_id = (await s.pool())["id"]
    watching = await subscribe(app, s.token, "acme")
    await emit_updates(capacity, pool_id, "acme", 6)
    await settle(app, watching)
    events: list[OutboxEvent] = watching.events
    third = events[2].position
    cases = {
        "ev1": (encode_cursor(0), None),  # before every event: the pool's creation first
        "ev2": (encode_cursor(third), 3),
        "ev3": (encode_usage_cursor(third, 1), 3),
    }
    for name, (cursor, start) in cases.items():
        resumed: Collector = await subscribe(
            app, s.token, "acme", types=["pool.updated"], after=cursor
        )
        if start is not None:
            await wait_until(lambda r=resumed: len(r.events) >= 3)  # type: ignore[misc]
        await settle(app, resumed)
        got = [e.data["n"] for e in resumed.events]
        assert got == list(range(start or 0, 6)), name
        await resumed.close()
    await watching.close()


async def test_a_resumed_subscription_goes_live_while_writes_keep_coming(
    app: Starlette, api: Api, fleet: Fleet
) -> None:
    """A subscription resumed while a writer commits without pause joins the relay (it is
    mailed what the relay reads during its replay) and goes live while the writes go on,
    then receives every later event exactly once, in each pool's order. Before, a resumed
    subscription went live only if the relay had not moved during its last replay read,
    which a relay fed every few milliseconds could keep from happening."""
    s = await Scene.start(api, fleet)
    capacity: Capacity = app.state.capacity
    relay: Relay = app.state.relay
    pools = [(await s.pool())["id"] for _ in range(3)]
    watching = await subscribe(app, s.token, "acme")
    writing = asyncio.Event()
    written = [0]

    async def writer() -> None:
        while not writing.is_set():
            pool_id = pools[written[0] % len(pools)]
            await emit_updates(capacity, pool_id, "acme", 1, start=written[0])
            written[0] += 1

    task = asyncio.create_task(writer())
    try:
        await wait_until(lambda: len(watching.events) >= 5)
        resumed = await subscribe(app, s.token, "acme", after=watching.events[2].cursor)
        # Live while the writer goes on: two subscriptions level with the relay.
        await wait_until(lambda: relay.live_subscriptions == 2, within_s=60)
        at_join = written[0]
        await wait_until(lambda: written[0] >= at_join + 20, within_s=60)
        assert relay.live_subscriptions == 2
    finally:
        writing.set()
        await task
    await settle(app, watching, resumed)
    later = watching.events[3:]
    assert Counter(map(_key, resumed.events)) == Counter(map(_key, later))
    assert _per_pool(resumed.events) == _per_pool(later)
    await resumed.close()
    await watching.close()


async def test_the_poll_interval_bounds_the_wait_while_events_sit_above_the_horizon(
    app_with: AppFactory, api: Api, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While D holds events (an older transaction still open) the relay retries after a
    growing pause, for the horizon to pass; an event committed meanwhile with no wake-up
    (another process's, its broadcast lost, or a writer outside the service) is still read
    within the poll interval ("at least this often"), not after the longest pause. The
    pauses made long here, the poll short, so the difference is seconds."""
    monkeypatch.setattr(relay_module, "HORIZON_RETRY_FIRST_S", 60.0)
    monkeypatch.setattr(relay_module, "HORIZON_RETRY_MAX_S", 60.0)
    async with app_with(event_poll_interval_s=0.05) as app:
        s = await Scene.start(api, fleet)
        capacity: Capacity = app.state.capacity
        relay: Relay = app.state.relay
        pool_a, pool_b, pool_c = [(await s.pool())["id"] for _ in range(3)]
        watching = await subscribe(app, s.token, "acme")
        try:
            async with held_open(capacity, pool_a, 0):
                await emit_updates(capacity, pool_b, "acme", 1, start=1)  # woken: read at once
                await wait_until(lambda: [_key(e) for e in watching.events] == [(pool_b, 1)])
                assert relay.state.ahead  # above the horizon: the relay now pauses to retry
                session = AsyncSession(capacity.db.writer)
                try:  # the outbox writer without the service's wake-up
                    assert await lock_pool_for_events(session, pool_c)
                    await append_events(session, [_update(pool_c, 1)])
                    await session.commit()
                finally:
                    await session.close()
                await wait_until(lambda: len(watching.events) == 2, within_s=20.0)
                assert _key(watching.events[1]) == (pool_c, 1)
        finally:
            await watching.close()
