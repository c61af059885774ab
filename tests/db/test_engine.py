"""The engines of app.db.engine: SQLite configured on every connection."""

from __future__ import annotations

import pytest
from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from app.db.engine import Database
from app.db.models import Caller, utcnow


@pytest.mark.parametrize("dialect", ["sqlite"])
async def test_sqlite_connections_are_configured(db: Database) -> None:
    for engine in (db.writer, db.reader):
        async with engine.connect() as connection:

            async def pragma(name: str) -> object:
                return (await connection.exec_driver_sql(f"PRAGMA {name}")).scalar_one()

            assert await pragma("foreign_keys") == 1
            assert str(await pragma("journal_mode")).lower() == "wal"
            busy_timeout = await pragma("busy_timeout")
            assert isinstance(busy_timeout, int)
            assert busy_timeout >= 1000


@pytest.mark.parametrize("dialect", ["sqlite"])
async def test_sqlite_writes_take_the_write_lock_at_begin(db: Database) -> None:
    other = create_async_engine(db.url, poolclass=NullPool, connect_args={"timeout": 0})
    try:
        async with db.writer.begin(), other.connect() as other_connection:
            # BEGIN IMMEDIATE: the writer holds the write lock before its first write.
            with pytest.raises(OperationalError, match="locked"):
                await other_connection.exec_driver_sql("BEGIN IMMEDIATE")
            # Reads are not blocked (WAL).
            await other_connection.exec_driver_sql("SELECT count(*) FROM tenants")
    finally:
        await other.dispose()


@pytest.mark.parametrize("dialect", ["postgresql"])
async def test_postgresql_shares_one_engine(db: Database) -> None:
    assert db.dialect == "postgresql"
    assert db.reader is db.writer


async def test_foreign_keys_are_enforced(db: Database) -> None:
    with pytest.raises(IntegrityError):
        async with db.writer.begin() as connection:
            await connection.execute(
                insert(Caller).values(id="c-1", tenant_id="no-such-tenant", created_at=utcnow())
            )
