"""A throwaway database per benchmark run, migrated to head, dropped after: on PostgreSQL
(`bench_database`) or an SQLite file, the embedded default (`bench_sqlite_database`)."""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.migrate import upgrade

ADMIN_URL = os.environ.get(
    "BENCH_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
)


async def _admin(statement: str) -> None:
    admin = create_async_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.exec_driver_sql(statement)
    finally:
        await admin.dispose()


@asynccontextmanager
async def bench_database() -> AsyncIterator[str]:
    """The URL of a fresh, migrated database, dropped when the block ends."""
    name = f"bc_bench_{secrets.token_hex(6)}"
    await _admin(f'CREATE DATABASE "{name}"')
    try:
        url = make_url(ADMIN_URL).set(database=name).render_as_string(hide_password=False)
        await upgrade(url)
        yield url
    finally:
        await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@asynccontextmanager
async def bench_sqlite_database() -> AsyncIterator[str]:
    """The URL of a fresh, migrated SQLite file (the service's own URL form, app/config.py:
    `sqlite+aiosqlite:///path`), removed with its WAL when the block ends."""
    with tempfile.TemporaryDirectory(prefix="bc-bench-sqlite-") as directory:
        url = f"sqlite+aiosqlite:///{Path(directory) / 'bench.db'}"
        await upgrade(url)
        yield url
