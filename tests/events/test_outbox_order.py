"""Cursors follow commit order (docs/decisions/0002-commit-ordered-outbox.md): a reader
that resumes after seq N can never miss an event that commits later with a smaller seq."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict

import pytest
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.engine import Database
from app.db.uow import UnitOfWork
from app.events.outbox import PendingEvent, append_events
from app.events.reader import read_events

WRITERS = 24
TRANSACTIONS_PER_WRITER = 12


def _event(writer: int, n: int) -> PendingEvent:
    # One "pool" per writer, so per-pool order is the writer's own order.
    return PendingEvent(
        type="pool.updated",
        pool_id=f"pool_w{writer:02d}",
        tenant_id="acme",
        data={"writer": writer, "n": n},
        audience=frozenset({"acme"}),
    )


async def test_one_transaction_numbers_its_events_in_the_order_given(db: Database) -> None:
    async with UnitOfWork(db) as uow:
        for n in range(300):
            uow.emit(_event(0, n))
    async with db.reader.connect() as conn:
        read = await read_events(conn, 0, limit=1000)
    assert [e.data["n"] for e in read] == list(range(300))
    assert all(e.audience == {"acme"} for e in read)


@pytest.mark.parametrize("dialect", ["postgresql"])  # SQLite has one writer at a time
async def test_a_writer_draws_numbers_only_after_the_previous_one_committed(
    db: Database,
) -> None:
    first = AsyncSession(db.writer)
    second = AsyncSession(db.writer)
    try:
        first_seq = await append_events(first, [_event(1, 0)])
        # The second writer blocks on the lock while the first is uncommitted...
        waiting = asyncio.create_task(append_events(second, [_event(2, 0)]))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        async with db.reader.connect() as conn:
            assert await read_events(conn, 0, limit=10) == []
        await first.commit()
        # ...and numbers its event after the first one, once that is visible.
        second_seq = await asyncio.wait_for(waiting, 60)
        await second.commit()
    finally:
        await first.close()
        await second.close()
    assert first_seq is not None and second_seq is not None and second_seq > first_seq


async def test_concurrent_writers_with_rollbacks_and_a_polling_reader(db: Database) -> None:
    """24 writers, some transactions rolled back after drawing seqs; a reader polling
    all the while sees exactly the committed events, once each, in per-writer order."""
    committed: set[tuple[int, int]] = set()
    delivered: list[tuple[int, int]] = []
    writers_done = asyncio.Event()
    rng = random.Random(7)

    async def writer(w: int) -> None:
        for n in range(TRANSACTIONS_PER_WRITER):
            session = AsyncSession(db.writer)
            try:
                events = [_event(w, n * 10 + k) for k in range(rng.randint(1, 3))]
                await append_events(session, events)
                await asyncio.sleep(rng.random() / 200)  # hold the numbers a while uncommitted
                if rng.random() < 0.25:
                    await session.rollback()
                else:
                    await session.commit()
                    committed.update((w, e.data["n"]) for e in events)
            finally:
                await session.close()

    async def reader() -> None:
        cursor = 0
        while True:
            finished = writers_done.is_set()  # read once more after the last commit
            async with db.reader.connect() as conn:
                events = await read_events(conn, cursor, limit=50)
            for event in events:
                delivered.append((event.data["writer"], event.data["n"]))
                cursor = event.seq
            if finished and not events:
                return
            if not events:
                await asyncio.sleep(0.001)

    # A task group: if one writer fails (a pool timeout on a busy machine), the others and
    # the reader are cancelled here instead of writing on into the next test.
    async with asyncio.timeout(300), asyncio.TaskGroup() as group:
        reading = group.create_task(reader())
        async with asyncio.TaskGroup() as writers:
            for w in range(WRITERS):
                writers.create_task(writer(w))
        writers_done.set()
        await reading

    assert len(delivered) == len(set(delivered)), "an event was delivered twice"
    assert set(delivered) == committed
    per_writer: dict[int, list[int]] = defaultdict(list)
    for w, n in delivered:
        per_writer[w].append(n)
    assert all(ns == sorted(ns) for ns in per_writer.values())
