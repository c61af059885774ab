"""The Alembic chain and the models agree, on both dialects."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from app.db.migrate import alembic_config, current_revision, head_revision, upgrade
from app.db.models import Base

T = TypeVar("T")


async def _run(url: str, fn: Callable[[Connection], T]) -> T:
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.begin() as connection:
            return await connection.run_sync(fn)
    finally:
        await engine.dispose()


def _differences(connection: Connection) -> list[Any]:
    context = MigrationContext.configure(connection, opts={"compare_type": True})
    return list(compare_metadata(context, Base.metadata))


def _table_names(connection: Connection) -> set[str]:
    return set(inspect(connection).get_table_names())


def _downgrade_to_base(connection: Connection) -> None:
    command.downgrade(alembic_config(connection), "base")


def test_the_chain_has_one_head() -> None:
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    assert heads == [head_revision()]


async def test_migrated_database_matches_the_models(database_url: str) -> None:
    assert await _run(database_url, _differences) == []
    assert await _run(database_url, current_revision) == head_revision()


async def test_upgrade_returns_the_head_and_is_idempotent(fresh_database_url: str) -> None:
    assert await _run(fresh_database_url, _table_names) == set()
    assert await upgrade(fresh_database_url) == head_revision()
    assert await upgrade(fresh_database_url) == head_revision()
    tables = await _run(fresh_database_url, _table_names)
    assert tables == set(Base.metadata.tables) | {"alembic_version"}


async def test_concurrent_upgrades_take_turns(fresh_database_url: str) -> None:
    revisions = await asyncio.gather(*(upgrade(fresh_database_url) for _ in range(3)))
    assert revisions == [head_revision()] * 3
    assert await _run(fresh_database_url, _differences) == []


async def test_downgrade_to_base_and_upgrade_again(fresh_database_url: str) -> None:
    await upgrade(fresh_database_url)
    await _run(fresh_database_url, _downgrade_to_base)
    assert await _run(fresh_database_url, _table_names) <= {"alembic_version"}
    assert await _run(fresh_database_url, current_revision) is None

    assert await upgrade(fresh_database_url) == head_revision()
    assert await _run(fresh_database_url, _differences) == []
