"""Positions follow commit order per pool, without a fleet-wide lock
(docs/decisions/0012-commit-ordered-positions.md): a reader resuming after position P never
misses an event that commits later below it, writers of distinct pools never wait for each
other, and per pool the delivery order is the commit order."""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.pool import NullPool

from app.db.engine import Database
from app.db.models import Pool
from app.db.uow import UnitOfWork
from app.events.cursor import START, Position
from app.events.outbox import (
    LockOrderViolation,
    PendingEvent,
    append_events,
    lock_pool_for_events,
)
from app.events.reader import read_events
from tests.databases import direct_url
from tests.events.support import bare_pools, until_lock_waits, visible_outbox
from tests.support import Fleet

WRITERS = 24
POOLS = 8
TRANSACTIONS_PER_WRITER = 12


def _event(pool_id: str, **data: int) -> PendingEvent:
    return PendingEvent(
        type="pool.updated",
        pool_id=pool_id,
        tenant_id="acme",
        data=dict(data),
        audience=frozenset({"acme"}),
    )


async def _readable(db: Database, at_least: int = 0) -> list[Position]:
    """What a reader reads now, while a transaction holds the horizon back. A statement's
    horizon may err low a moment (a transaction of another database ended meanwhile:
    app/events/reader.py), never high, so this reads again until `at_least` are read;
    the caller's assertion is about what must not be read yet."""
    deadline = time.monotonic() + 30
    while True:
        async with db.reader.connect() as conn:
            read = [e.position for e in await read_events(conn, START, limit=10_000)]
        if len(read) >= at_least:
            return read
        assert time.monotonic() < deadline, f"{len(read)} read, {at_least} expected"
        await asyncio.sleep(0.005)


async def _all_visible(db: Database) -> list[Position]:
    """Every committed event, once the horizon has passed them all."""
    async with visible_outbox(db) as conn:
        return [e.position for e in await read_events(conn, START, limit=10_000)]


async def _until_one_waits(db: Database, task: asyncio.Task[bool]) -> None:
    await until_lock_waits(db, 1, task)


async def _bump(session: AsyncSession, pool_id: str) -> int:
    """The pool's next version, written under its lock (as every owner write does)."""
    version = (
        await session.execute(select(Pool.version).where(Pool.id == pool_id))
    ).scalar_one() + 1
    await session.execute(update(Pool).where(Pool.id == pool_id).values(version=version))
    return version


async def test_one_transaction_numbers_its_events_in_the_order_given(
    db: Database, fleet: Fleet
) -> None:
    (pool_id,) = await bare_pools(fleet, db, 1)
    async with UnitOfWork(db) as uow:
        assert await uow.lock_pool(pool_id)
        for n in range(300):
            uow.emit(_event(pool_id, n=n))
    async with visible_outbox(db) as conn:
        read = await read_events(conn, START, limit=1000)
    assert [e.data["n"] for e in read] == list(range(300))
    assert all(e.audience == {"acme"} for e in read)
    assert len({e.tx for e in read}) == 1  # one transaction, one tx
    assert (read[0].tx == 0) is (db.dialect == "sqlite")


async def test_an_event_for_a_pool_its_transaction_did_not_lock_is_refused(
    db: Database, fleet: Fleet
) -> None:
    locked, other = await bare_pools(fleet, db, 2)
    with pytest.raises(LockOrderViolation):
        async with UnitOfWork(db) as uow:
            assert await uow.lock_pool(locked)
            uow.emit(_event(locked, n=0))
            uow.emit(_event(other, n=1))
    assert await _readable(db) == []  # nothing written


@pytest.mark.parametrize("dialect", ["postgresql"])  # SQLite has one writer at a time
async def test_writers_of_distinct_pools_do_not_wait_and_delivery_waits_for_the_horizon(
    db: Database, fleet: Fleet
) -> None:
    """A held-open event transaction on pool A does not block pool B's (lock_timeout makes
    a regression fail fast); B's event is read only once A has ended, after A's."""
    pool_a, pool_b, pool_c = await bare_pools(fleet, db, 3)
    first = AsyncSession(db.writer)
    try:
        await first.execute(text("SET LOCAL lock_timeout = '2s'"))
        assert await lock_pool_for_events(first, pool_a)
        a = await append_events(first, [_event(pool_a, n=1)])
        # B commits at once, in either order relative to A: no lock in common.
        async with UnitOfWork(db) as uow:
            await uow.session.execute(text("SET LOCAL lock_timeout = '2s'"))
            assert await uow.lock_pool(pool_b)
            uow.emit(_event(pool_b, n=2))
        # Committed, but A (a smaller transaction id) is still running: not yet readable.
        assert await _readable(db) == []
        await first.commit()
    finally:
        await first.close()
    positions = await _all_visible(db)
    assert len(positions) == 2 and positions[0] == a and positions == sorted(positions)
    # A transaction that writes no event holds the horizon back just the same.
    idle = AsyncSession(db.writer)
    try:
        await idle.execute(text("CREATE TEMPORARY TABLE holds_an_xid (a int)"))
        async with UnitOfWork(db) as uow:
            assert await uow.lock_pool(pool_c)
            uow.emit(_event(pool_c, n=3))
        assert len(await _readable(db, at_least=2)) == 2
    finally:
        await idle.rollback()
        await idle.close()
    assert len(await _all_visible(db)) == 3


@pytest.mark.parametrize("dialect", ["postgresql"])
async def test_a_transaction_of_another_database_does_not_hold_delivery_back(
    db: Database, fleet: Fleet
) -> None:
    """The horizon is this database's: a transaction of another database on the same server
    (here one holding a transaction id in `postgres`) does not keep a committed event from
    being read, while one of this database does (the test above)."""
    (pool,) = await bare_pools(fleet, db, 1)
    server = make_url(direct_url(db.url)).set(database="postgres")
    other = create_async_engine(server.render_as_string(hide_password=False), poolclass=NullPool)
    try:
        async with other.connect() as elsewhere:
            await elsewhere.execute(text("SELECT pg_current_xact_id()"))  # holds an id
            async with UnitOfWork(db) as uow:
                assert await uow.lock_pool(pool)
                uow.emit(_event(pool, n=1))
            # Were `elsewhere` held against this database's horizon, this would time out.
            async with visible_outbox(db) as conn:
                assert len(await read_events(conn, START, limit=10)) == 1
            await elsewhere.rollback()
    finally:
        await other.dispose()


@pytest.mark.parametrize("dialect", ["postgresql"])
async def test_a_pool_locked_after_a_first_write_still_orders_after_its_previous_holder(
    db: Database, fleet: Fleet
) -> None:
    """`late` has its transaction id before `early` (it wrote something first, as a fleet
    file's one transaction does before each pool), then waits for the pool `early` holds:
    its event must still come after `early`'s, which committed first."""
    (pool_id,) = await bare_pools(fleet, db, 1)
    late = AsyncSession(db.writer)
    early = AsyncSession(db.writer)
    try:
        await late.execute(text("CREATE TEMPORARY TABLE takes_an_xid (a int)"))
        assert await lock_pool_for_events(early, pool_id)
        early_version = await _bump(early, pool_id)
        await append_events(early, [_event(pool_id, version=early_version)])
        waiting = asyncio.create_task(lock_pool_for_events(late, pool_id))
        await _until_one_waits(db, waiting)
        await early.commit()
        assert await asyncio.wait_for(waiting, 30)
        late_version = await _bump(late, pool_id)
        await append_events(late, [_event(pool_id, version=late_version)])
        await late.commit()
    finally:
        await early.close()
        await late.close()
    async with visible_outbox(db) as conn:
        read = await read_events(conn, START, limit=10)
    assert [e.data["version"] for e in read] == [early_version, late_version]
    assert read[0].tx > 0 and read[1].tx >= read[0].tx


async def test_concurrent_writers_with_rollbacks_and_a_polling_reader(
    db: Database, fleet: Fleet
) -> None:
    """24 writers over 8 pools, each transaction locking its pool and bumping its version,
    some rolled back after writing their events; a reader polling all the while sees
    exactly the committed events, once each, and per pool every version in order."""
    pools = await bare_pools(fleet, db, POOLS)
    committed: set[tuple[str, int]] = set()
    delivered: list[tuple[str, int]] = []
    seen: list[tuple[str, int, Position]] = []
    writers_done = asyncio.Event()
    rng = random.Random(7)

    async def writer(w: int) -> None:
        for _ in range(TRANSACTIONS_PER_WRITER):
            pool_id = pools[rng.randrange(POOLS)]
            session = AsyncSession(db.writer)
            try:
                assert await lock_pool_for_events(session, pool_id)
                version = await _bump(session, pool_id)
                await append_events(session, [_event(pool_id, version=version)])
                await asyncio.sleep(rng.random() / 200)  # hold them a while uncommitted
                if rng.random() < 0.25:
                    await session.rollback()
                else:
                    await session.commit()
                    committed.add((pool_id, version))
            finally:
                await session.close()

    async def reader() -> None:
        cursor = START
        while True:
            finished = writers_done.is_set()  # read once more after the last commit
            reads = visible_outbox(db) if finished else db.reader.connect()
            async with reads as conn:
                events = await read_events(conn, cursor, limit=50)
            for event in events:
                delivered.append((event.pool_id, event.data["version"]))
                seen.append((event.pool_id, event.data["version"], event.position))
                assert event.position > cursor
                cursor = event.position
            if finished and not events:
                return
            if not events:
                await asyncio.sleep(0.001)

    async with asyncio.timeout(300), asyncio.TaskGroup() as group:
        reading = group.create_task(reader())
        async with asyncio.TaskGroup() as writers:
            for w in range(WRITERS):
                writers.create_task(writer(w))
        writers_done.set()  # the reader's next empty read, all visible, is its last
        await reading

    assert len(delivered) == len(set(delivered)), "an event was delivered twice"
    assert set(delivered) == committed
    per_pool: dict[str, list[int]] = defaultdict(list)
    for pool_id, version in delivered:
        per_pool[pool_id].append(version)
    for pool_id, versions in per_pool.items():
        # Versions in commit order, no gap: 2, 3, 4, ... (1 is the pool's own).
        order = [(v, p) for pid, v, p in seen if pid == pool_id]
        assert versions == list(range(2, 2 + len(versions))), order
