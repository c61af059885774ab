"""Schema migrations: `alembic upgrade head` on a database URL, from inside an event loop.

The chain lives in the top-level `migrations` package, which is installed with the
service, so a migration finds its scripts from a checkout or a wheel alike. The whole
upgrade runs in one transaction: on PostgreSQL under an advisory lock, on SQLite
behind BEGIN IMMEDIATE, so processes that start together migrate one after another.

Alembic keeps its running context in module globals (`alembic.context`, `alembic.op`),
so within one process upgrades also take turns on an asyncio lock: two interleaved on
one event loop would overwrite each other's context.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from weakref import WeakKeyDictionary

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

import migrations
from app.db.engine import behind_pgbouncer, configure_sqlite, pgbouncer_connect_args

# Held for the migrating transaction (pg_advisory_xact_lock); any constant works,
# it only has to be the same in every process of the service.
POSTGRES_MIGRATION_LOCK = 0x6263_706F_6F6C  # "bcpool"

_alembic_turns: WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = WeakKeyDictionary()


def script_location() -> Path:
    return Path(migrations.__file__).resolve().parent


def alembic_config(connection: Connection | None = None) -> Config:
    """The Alembic config of the chain; with `connection`, env.py migrates through it."""
    config = Config()
    # configparser interpolates '%' in option values.
    config.set_main_option("script_location", str(script_location()).replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise RuntimeError(f"no migration scripts under {script_location()}")
    return head


def migration_engine(url: str) -> AsyncEngine:
    """An engine for migrating. SQLite keeps foreign keys OFF (batch operations
    recreate tables) and takes the write lock up front, waiting for it if busy."""
    target, pgbouncer = behind_pgbouncer(url)
    connect_args = pgbouncer_connect_args() if pgbouncer else {}
    engine = create_async_engine(target, poolclass=NullPool, connect_args=connect_args)
    if engine.dialect.name == "sqlite":
        configure_sqlite(engine, "BEGIN IMMEDIATE", 30_000, server=False)
    return engine


def lock_schema(connection: Connection) -> None:
    """On PostgreSQL, wait for other migrations; released when the transaction ends.
    (SQLite's BEGIN IMMEDIATE already did this.)"""
    if connection.dialect.name == "postgresql":
        connection.execute(
            text("SELECT pg_advisory_xact_lock(:key)"), {"key": POSTGRES_MIGRATION_LOCK}
        )


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def _upgrade_to_head(connection: Connection) -> str:
    lock_schema(connection)  # wait here, before Alembic sets up its global context
    command.upgrade(alembic_config(connection), "head")
    revision = current_revision(connection)
    if revision is None:
        raise RuntimeError("alembic upgrade head left no revision stamped")
    return revision


async def upgrade(url: str) -> str:
    """Migrate the database at `url` to the head revision and return that revision."""
    loop = asyncio.get_running_loop()
    turn = _alembic_turns.setdefault(loop, asyncio.Lock())
    engine = migration_engine(url)
    try:
        async with turn, engine.begin() as connection:
            return await connection.run_sync(_upgrade_to_head)
    finally:
        await engine.dispose()
