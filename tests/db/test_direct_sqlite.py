"""The compiled reads' own connections to the embedded SQLite file (app/db/direct_sqlite.py):
one hand-off a statement, counted and bounded, read-only, closed on dispose, a held lock
or a wait for a connection UNAVAILABLE, and the engine's read pool when aiosqlite is not
as expected (the fence)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading

import pytest
from sqlalchemy.engine import make_url

from app.config import Settings
from app.db import direct_sqlite
from app.db.direct_sqlite import DirectSQLiteReads
from app.db.engine import create_database
from app.db.errors import connection_fault, to_domain_error
from app.errors import Unavailable
from app.metrics import DB_STATEMENTS
from tests.support import Fleet

pytestmark = pytest.mark.parametrize("dialect", ["sqlite"])


def _path(url: str) -> str:
    return make_url(url).database or ""


def _threads() -> int:
    return threading.active_count()


async def test_one_statement_counted_and_answered(database_url: str) -> None:
    reads = DirectSQLiteReads(
        _path(database_url), max_size=2, busy_timeout_ms=1000, acquire_timeout_s=1.0
    )
    counted = DB_STATEMENTS.labels("none")
    before = counted._value.get()
    try:
        assert await reads.fetchval("SELECT json_object('a', ?)", (1,)) == '{"a":1}'
        assert await reads.fetchval("SELECT 1 WHERE 0", ()) is None
    finally:
        await reads.close()
    assert counted._value.get() - before == 2
    assert reads.connections == 0


async def test_bounded_and_closed(database_url: str) -> None:
    threads = _threads()
    reads = DirectSQLiteReads(
        _path(database_url), max_size=2, busy_timeout_ms=1000, acquire_timeout_s=5.0
    )
    values = await asyncio.gather(*(reads.fetchval("SELECT ?", (i,)) for i in range(12)))
    assert values == list(range(12))
    assert reads.connections == 2
    await reads.close()
    assert reads.connections == 0
    for _ in range(100):  # each connection's thread ends once closed
        if _threads() <= threads:
            break
        await asyncio.sleep(0.01)
    assert _threads() <= threads


async def test_read_only(database_url: str) -> None:
    reads = DirectSQLiteReads(
        _path(database_url), max_size=1, busy_timeout_ms=1000, acquire_timeout_s=1.0
    )
    try:
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            await reads.fetchval("DELETE FROM tenants", ())
        assert await reads.fetchval("SELECT 2", ()) == 2  # a new connection serves
        assert await reads.fetchval("PRAGMA journal_mode", ()) == "wal"
        assert await reads.fetchval("PRAGMA foreign_keys", ()) == 1
        assert await reads.fetchval("PRAGMA busy_timeout", ()) == 1000
        assert await reads.fetchval("PRAGMA automatic_index", ()) == 0
    finally:
        await reads.close()


async def test_no_connection_in_time_is_unavailable(database_url: str) -> None:
    reads = DirectSQLiteReads(
        _path(database_url), max_size=1, busy_timeout_ms=1000, acquire_timeout_s=0.05
    )
    slow = (
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000000)"
        " SELECT max(i) FROM n"
    )
    try:
        running = asyncio.ensure_future(reads.fetchval(slow, ()))
        await asyncio.sleep(0.01)
        with pytest.raises(TimeoutError) as waited:
            await reads.fetchval("SELECT 1", ())
        assert connection_fault(waited.value)
        assert isinstance(to_domain_error(waited.value), Unavailable)
        assert await running == 3000000
    finally:
        await reads.close()


async def test_a_held_lock_is_unavailable(database_url: str) -> None:
    """A session holding the exclusive lock (WAL readers wait for it only then): the read
    gives up after the busy timeout, as the engine's would."""
    reads = DirectSQLiteReads(
        _path(database_url), max_size=1, busy_timeout_ms=100, acquire_timeout_s=1.0
    )
    holder = sqlite3.connect(_path(database_url), isolation_level=None)
    try:
        holder.execute("PRAGMA locking_mode=EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")
        holder.execute("UPDATE tenants SET parent_id = parent_id")
        holder.execute("COMMIT")  # EXCLUSIVE mode: the lock stays held
        with pytest.raises(sqlite3.OperationalError) as locked:
            await reads.fetchval("SELECT count(*) FROM tenants", ())
        assert connection_fault(locked.value)
        assert isinstance(to_domain_error(locked.value), Unavailable)
    finally:
        holder.close()
    try:
        assert await reads.fetchval("SELECT count(*) > 0 FROM tenants", ()) == 1
        assert reads.connections == 1  # kept: the connection was fine
    finally:
        await reads.close()


async def test_the_engine_makes_them_unless_told_not_to(database_url: str) -> None:
    db = create_database(database_url, Settings(db_direct_pool_size=10))
    none = create_database(database_url, Settings(db_direct_pool_size=0))
    try:
        assert db.sqlite_reads is not None and none.sqlite_reads is None
        assert db.sqlite_reads._max_size == 4  # the reader's pool size at most
    finally:
        for each in (db, none):
            await each.dispose()


async def test_fenced_the_read_pool_answers(
    database_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """aiosqlite not as expected: one warning, and the compiled read answers on the
    engine's read pool, the same bytes."""
    import httpx

    from app.server import create_app
    from tests.support import Api

    db = create_database(database_url)
    fleet = Fleet(db)
    await fleet.tenant("acme")
    token = await fleet.caller("acme", "viewer")
    await db.dispose()
    query = 'query { pools(tenantId: "acme", first: 5) { nodes { id } } }'
    answers = []
    for fenced in (False, True):
        if fenced:
            monkeypatch.setattr(direct_sqlite, "problem", lambda: "moved")
        with caplog.at_level(logging.WARNING, logger="app.db.engine"):
            app = create_app(Settings(database_url=database_url, db_direct_pool_size=4))
        async with app.router.lifespan_context(app):
            assert (app.state.db.sqlite_reads is None) is fenced
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                api = Api(client)
                for _ in range(3):  # planned after a clean plain run, then compiled
                    answers.append(await api.graphql(token, query))
    assert all(
        a == {"data": {"pools": {"nodes": []}}, "extensions": a["extensions"]} for a in answers
    )
    assert "direct SQLite reads cannot run (moved)" in caplog.text
