"""A unit of work cancelled while its statement runs on the server (a deadline, a
shutdown) ends its transaction and hands back a connection fit for the next: the next
unit of work on the same one-connection pool runs at once, and the cancelled statement
no longer runs on the server. Real PostgreSQL, the service's own engine and units of
work (a leased connection on the driver path, else an ORM session)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg
import pytest
from sqlalchemy import text

from app.config import Settings
from app.db.engine import Database, behind_pgbouncer, create_database
from app.db.uow import UnitOfWork
from tests import pgbouncer
from tests.db.faults import postgres_dsn

pytestmark = pytest.mark.parametrize("dialect", ["postgresql"])  # a statement to cancel

SLEEP = "SELECT pg_sleep(60) -- cancelled work"
MAX_TURNS = 20_000


@pytest.fixture
async def one_connection(database_url: str) -> AsyncIterator[Database]:
    database = create_database(
        database_url, Settings(db_pool_size=1, db_max_overflow=0, db_acquire_timeout_s=10)
    )
    try:
        yield database
    finally:
        await database.dispose()


async def _running(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        found = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE query = $1 AND state = 'active'", SLEEP
        )
        return int(found)
    finally:
        await conn.close()


async def test_a_unit_of_work_cancelled_mid_statement_leaves_its_connection_fit(
    one_connection: Database, database_url: str
) -> None:
    dsn = postgres_dsn(database_url)  # the server itself, never through a PgBouncer

    async def sleeps() -> None:
        async with UnitOfWork(one_connection) as uow:
            await uow.statements.execute(text(SLEEP))

    task = asyncio.create_task(sleeps())
    seen = [0]

    async def look() -> None:
        seen[0] = await _running(dsn)

    deadline = asyncio.get_running_loop().time() + 20
    while not seen[0]:
        assert asyncio.get_running_loop().time() < deadline, "the statement never ran"
        assert not task.done(), task
        await look()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled()

    async with asyncio.timeout(10):  # the pool's one connection, handed back fit
        for _ in range(3):
            async with UnitOfWork(one_connection) as uow:
                found = await uow.statements.execute(text("SELECT 1"))
                assert found.scalar_one() == 1
    async with asyncio.timeout(20):
        await look()
        while seen[0]:  # the cancelled statement stopped on the server
            await look()


async def test_a_unit_of_work_cancelled_at_any_step_leaves_its_connection_fit(
    one_connection: Database, database_url: str
) -> None:
    """Cancelled after 0, 1, 2, ... turns of the event loop, until one runs to its end
    first: at checkout, during BEGIN, a statement, COMMIT; each time the next unit of
    work runs at once."""
    # Some step's cancel lands on PgBouncer's own SETs, and an older PgBouncer exits
    # (tests/pgbouncer.py): the run's later tests would fail on its absence.
    hazard = pgbouncer.cancel_hazard() if behind_pgbouncer(database_url)[1] else None
    if hazard is not None:
        pytest.skip(hazard)
    cancelled = 0
    for turns in range(MAX_TURNS):

        async def writes() -> None:
            async with UnitOfWork(one_connection) as uow:
                await uow.statements.execute(text("CREATE TEMP TABLE IF NOT EXISTS t (n int)"))
                await uow.statements.execute(text("INSERT INTO t VALUES (1)"))

        task = asyncio.create_task(writes())
        for _ in range(turns):
            await asyncio.sleep(0)
        finished = task.done()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        cancelled += task.cancelled()
        async with asyncio.timeout(10), UnitOfWork(one_connection) as uow:
            found = await uow.statements.execute(text("SELECT 1"))
            assert found.scalar_one() == 1, turns
        if finished:
            break
    else:
        raise AssertionError(f"not done after {MAX_TURNS} turns")
    assert cancelled >= 10, f"cancelled only {cancelled} times: the sweep missed the work"
