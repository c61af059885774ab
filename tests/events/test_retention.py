"""Outbox retention: pruning in bounded batches, resuming while it prunes, and the
table's size staying bounded under a steady write load (docs/events.md "Retention")."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from app.capacity.service import Capacity
from app.db.engine import Database
from app.db.models import Event
from app.errors import InvalidState
from app.events.cursor import START, Position, encode_cursor
from app.events.reader import outbox_bounds, prune_events, read_events
from tests.events.conftest import AppFactory
from tests.events.support import emit_updates, settle, subscribe, visible_outbox, wait_until
from tests.rest.scene import Scene
from tests.support import Api, Fleet


async def test_pruning_deletes_at_most_a_batch_per_call(
    app_with: AppFactory, api: Api, fleet: Fleet, db: Database
) -> None:
    async with app_with() as app:
        s = await Scene.start(api, fleet)
        capacity: Capacity = app.state.capacity
        pool_id = (await s.pool())["id"]
        await emit_updates(capacity, pool_id, "acme", 30)
    async with visible_outbox(db) as conn:
        before = await outbox_bounds(conn)
        stored = [e.position for e in await read_events(conn, START, limit=100)]
    assert before.oldest == stored[0] and len(stored) == 31  # pool.created, 30 updates
    later = datetime.now(UTC) + timedelta(seconds=60)  # every event is old enough
    async with db.writer.begin() as conn:
        assert await prune_events(conn, later, limit=10) == 10
    async with db.reader.connect() as conn:
        after = await outbox_bounds(conn)
    assert after.oldest == stored[10]
    assert after.pruned == stored[9]
    assert after.newest == before.newest == stored[-1]


async def test_expiry_is_exact_in_position_order(
    app_with: AppFactory, api: Api, fleet: Fleet, db: Database
) -> None:
    """Pruned through position P: a cursor at P or later resumes with everything after it,
    one below P is expired. Two transactions, so positions differ in tx on PostgreSQL."""
    async with app_with() as app:
        s = await Scene.start(api, fleet)
        capacity: Capacity = app.state.capacity
        pool_id = (await s.pool())["id"]
        await emit_updates(capacity, pool_id, "acme", 3)
        await emit_updates(capacity, pool_id, "acme", 3, start=3)
        async with visible_outbox(db) as conn:
            stored = await read_events(conn, START, limit=100)
        assert [e.data.get("n") for e in stored] == [None, 0, 1, 2, 3, 4, 5]
        assert len({e.tx for e in stored[1:]}) == (1 if db.dialect == "sqlite" else 2)
        through = stored[3]  # n = 2, the first transaction's last
        later = datetime.now(UTC) + timedelta(seconds=60)
        async with db.writer.begin() as conn:
            assert await prune_events(conn, later, limit=4) == 4
        async with db.reader.connect() as conn:
            bounds = await outbox_bounds(conn)
        assert bounds.pruned == through.position
        assert bounds.oldest == stored[4].position
        with pytest.raises(InvalidState) as expired:
            await subscribe(app, s.token, "acme", after=stored[2].cursor)
        assert expired.value.details == {"field": "after", "reason": "CURSOR_EXPIRED"}
        for start, expected in ((3, [3, 4, 5]), (4, [4, 5]), (6, [])):
            resumed = await subscribe(app, s.token, "acme", after=stored[start].cursor)
            await settle(app, resumed)
            assert [e.data["n"] for e in resumed.events] == expected
            await resumed.close()


async def test_subscribers_resuming_while_pruning_runs_miss_nothing(
    app_with: AppFactory, api: Api, fleet: Fleet
) -> None:
    """Writes go on, the pruner deletes every second, and resumers keep closing and
    resuming from their last cursor: each either gets every event after its cursor, in
    order, or is told its cursor expired. Never a silent gap."""
    async with app_with(event_retention_s=1) as app:
        s = await Scene.start(api, fleet)
        capacity: Capacity = app.state.capacity
        pool_id = (await s.pool())["id"]
        await emit_updates(capacity, pool_id, "acme", 1)
        stop = asyncio.Event()
        outcomes = {"resumed": 0, "expired": 0}

        async def writer() -> None:
            n = 1
            while not stop.is_set():
                await emit_updates(capacity, pool_id, "acme", 5, start=n)
                n += 5
                await asyncio.sleep(0.02)

        async def resumer() -> None:
            last: Position | None = None
            last_n: int | None = None
            while not stop.is_set():
                arguments = {} if last is None else {"after": encode_cursor(last)}
                try:
                    collector = await subscribe(app, s.token, "acme", **arguments)
                except InvalidState as exc:
                    assert exc.details == {"field": "after", "reason": "CURSOR_EXPIRED"}
                    outcomes["expired"] += 1
                    last = last_n = None
                    continue
                with contextlib.suppress(AssertionError):
                    await wait_until(lambda c=collector: len(c.events) >= 3, within_s=5)
                await collector.close()
                failure = collector.task.exception() if not collector.task.cancelled() else None
                if isinstance(failure, InvalidState):  # expired during the replay
                    outcomes["expired"] += 1
                    last = last_n = None
                    continue
                ns = [int(e.data["n"]) for e in collector.events]
                if last_n is not None and ns:
                    assert ns[0] == last_n + 1, f"a gap after n={last_n}: got {ns[:5]}"
                assert ns == list(range(ns[0], ns[0] + len(ns))) if ns else True
                if collector.events:
                    last, last_n = collector.events[-1].position, ns[-1]
                outcomes["resumed"] += 1
                # Fall behind now and then, so some cursors age past the window.
                # Resume with cursors about as old as the pruner's window, some just
                # inside it and some just out: the edge where a prune can race a replay.
                await asyncio.sleep(0.2 + 0.05 * (outcomes["resumed"] % 6))

        async def pruner() -> None:
            # Far more often than the relay's own pruner, so prunes land between a
            # replay's reads.
            while not stop.is_set():
                older_than = datetime.now(UTC) - timedelta(seconds=0.3)
                async with capacity.db.writer.begin() as conn:
                    await prune_events(conn, older_than, limit=50)
                await asyncio.sleep(0.005)

        tasks = [asyncio.create_task(writer()), asyncio.create_task(pruner())] + [
            asyncio.create_task(resumer()) for _ in range(8)
        ]
        # Bounds a hang: a busy machine (load 13) resumed 137 times in 60 s.
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and (
            outcomes["resumed"] < 150 or outcomes["expired"] < 1
        ):
            await asyncio.sleep(0.1)
            if any(t.done() for t in tasks):
                break
        stop.set()
        await asyncio.gather(*tasks)
        assert outcomes["resumed"] >= 150
        assert outcomes["expired"] >= 1


async def _outbox_rows(db: Database) -> int:
    async with db.reader.connect() as conn:
        return int((await conn.scalar(select(func.count()).select_from(Event))) or 0)


async def _bounded_under_load(
    app_with: AppFactory, api: Api, fleet: Fleet, db: Database, duration_s: float
) -> None:
    """Writes for `duration_s` at a steady rate with a 2-second window: the outbox never
    holds much more than the window's worth (plus one pruning interval's)."""
    async with app_with(event_retention_s=2) as app:
        s = await Scene.start(api, fleet)
        capacity: Capacity = app.state.capacity
        pool_id = (await s.pool())["id"]
        written, peak, n = 0, 0, 0
        started = time.monotonic()
        while time.monotonic() - started < duration_s:
            await emit_updates(capacity, pool_id, "acme", 10, start=n)
            n += 10
            written += 10
            if n % 200 == 0:
                peak = max(peak, await _outbox_rows(db))
            await asyncio.sleep(0.01)
        elapsed = time.monotonic() - started
        rate = written / elapsed
        # Window 2 s + a pruning interval (1 s) + a busy machine's lag: 10 s of writes.
        bound = max(200, int(rate * 10))
        deadline = time.monotonic() + 30
        rows = await _outbox_rows(db)
        while rows > bound and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            rows = await _outbox_rows(db)
        assert peak <= bound, (peak, bound, written)
        assert rows <= bound, (rows, bound, written)


async def test_the_outbox_stays_bounded_under_a_write_load(
    app_with: AppFactory, api: Api, fleet: Fleet, db: Database
) -> None:
    await _bounded_under_load(app_with, api, fleet, db, duration_s=8)


@pytest.mark.soak
@pytest.mark.parametrize("dialect", ["postgresql"])  # production's; the default run has both
async def test_the_outbox_stays_bounded_under_minutes_of_writes(
    app_with: AppFactory, api: Api, fleet: Fleet, db: Database
) -> None:
    """A minute and a half by default, 45 retention windows (CI runs it beside every
    other test, within 30 minutes in all); BETTERCOMPUTE_OUTBOX_SOAK_SECONDS=600 for the
    ten-minute run."""
    duration_s = float(os.environ.get("BETTERCOMPUTE_OUTBOX_SOAK_SECONDS", "90"))
    await _bounded_under_load(app_with, api, fleet, db, duration_s=duration_s)
