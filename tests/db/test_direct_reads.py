"""The compiled reads' own asyncpg pool on PostgreSQL (app/db/direct.py): a wait for a
connection is bounded by the acquire timeout (UNAVAILABLE), and every connection lent,
answered, timed out or failed, comes back to the pool."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from app.db.direct import DirectReads
from app.db.errors import connection_fault, to_domain_error
from app.errors import Unavailable
from tests.databases import direct_url
from tests.events.support import wait_until

pytestmark = pytest.mark.parametrize("dialect", ["postgresql"])


def _reads(database_url: str, acquire_timeout_s: float) -> DirectReads:
    dsn = make_url(direct_url(database_url)).set(drivername="postgresql")
    return DirectReads(
        dsn.render_as_string(hide_password=False),
        max_size=1,
        statements_per_connection=10,
        connect_timeout_s=5.0,
        acquire_timeout_s=acquire_timeout_s,
        statement_timeout_ms=10_000,
        command_timeout_s=11.0,
    )


async def _lent(reads: DirectReads) -> asyncpg.Pool:
    """The pool once its one connection is lent."""

    def lent() -> bool:
        pool = reads._pool
        return pool is not None and pool.get_size() == 1 and pool.get_idle_size() == 0

    await wait_until(lent)
    assert reads._pool is not None
    return reads._pool


async def test_no_connection_in_time_is_unavailable_and_none_is_kept(database_url: str) -> None:
    reads = _reads(database_url, acquire_timeout_s=0.1)
    try:
        # The one connection held by a statement that waits on an advisory lock we hold.
        holder = await asyncpg.connect(
            make_url(direct_url(database_url)).set(drivername="postgresql").render_as_string(False)
        )
        await holder.execute("SELECT pg_advisory_lock(2121)")
        running = asyncio.ensure_future(
            reads.fetchval("SELECT pg_advisory_lock_shared(2121)::text || 'held'", ())
        )
        pool = await _lent(reads)
        with pytest.raises(TimeoutError) as waited:
            await reads.fetchval("SELECT 'second'", ())
        assert connection_fault(waited.value)
        assert isinstance(to_domain_error(waited.value), Unavailable)
        await holder.execute("SELECT pg_advisory_unlock(2121)")
        await holder.close()
        assert await running == "held"
        # The connection came back: the next statement is answered on it.
        assert await reads.fetchval("SELECT 'third'", ()) == "third"
        assert pool.get_size() == 1 and pool.get_idle_size() == 1
    finally:
        await reads.close()


async def test_a_failed_statement_gives_its_connection_back(database_url: str) -> None:
    reads = _reads(database_url, acquire_timeout_s=1.0)
    try:
        with pytest.raises(asyncpg.PostgresError):
            await reads.fetchval("SELECT 1 / 0", ())
        assert await reads.fetchval("SELECT 'after'", ()) == "after"
        assert reads._pool is not None and reads._pool.get_idle_size() == 1
    finally:
        await reads.close()
