"""Engines for both dialects, with SQLite configured for a server.

SQLite allows one writer at a time. A deferred transaction that reads and then
writes can fail with SQLITE_BUSY instead of waiting, so writes start with
BEGIN IMMEDIATE on their own engine; reads stay deferred and run beside them (WAL).
On PostgreSQL both roles share one engine.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine


@dataclass(frozen=True)
class Database:
    url: str
    writer: AsyncEngine
    reader: AsyncEngine

    @property
    def dialect(self) -> str:
        return self.writer.dialect.name

    async def dispose(self) -> None:
        await self.writer.dispose()
        if self.reader is not self.writer:
            await self.reader.dispose()


def _configure_sqlite(engine: AsyncEngine, begin: str) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's BEGIN below, not the driver, open transactions.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql(begin)


def create_database(url: str, *, pool_size: int = 10) -> Database:
    # hide_parameters: bound values (a pool policy's join token among them) never reach a
    # log line or an exception's message, even with SQL logging on.
    if make_url(url).get_backend_name() == "sqlite":
        # aiosqlite logs every statement with its bound values at DEBUG; keep that off.
        logging.getLogger("aiosqlite").setLevel(logging.INFO)
        writer = create_async_engine(
            url, pool_size=1, max_overflow=0, pool_timeout=60, hide_parameters=True
        )
        reader = create_async_engine(url, pool_size=4, max_overflow=4, hide_parameters=True)
        _configure_sqlite(writer, "BEGIN IMMEDIATE")
        _configure_sqlite(reader, "BEGIN")
        return Database(url, writer, reader)
    engine = create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size * 2,
        pool_pre_ping=True,
        hide_parameters=True,
    )
    return Database(url, engine, engine)
