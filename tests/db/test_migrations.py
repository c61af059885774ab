"""The Alembic chain and the models agree, on both dialects."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from app.db.migrate import alembic_config, current_revision, head_revision, upgrade
from app.db.models import Base, Tenant
from tests.databases import direct_url

T = TypeVar("T")


async def _run(url: str, fn: Callable[[Connection], T]) -> T:
    # The test's own look at the schema goes direct; the migrations under test do not.
    engine = create_async_engine(direct_url(url), poolclass=NullPool)
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


def _upgrade_to_initial_schema(connection: Connection) -> None:
    command.upgrade(alembic_config(connection), "0001")


def _tenants(connection: Connection) -> list[tuple[str, str | None]]:
    rows = connection.execute(select(Tenant.id, Tenant.parent_id).order_by(Tenant.id))
    return [(row.id, row.parent_id) for row in rows]


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


async def test_upgrade_creates_the_fleet_tenant(fresh_database_url: str) -> None:
    """CONTRACT 2's built-in tenant comes with the schema, not with `demo`."""
    await upgrade(fresh_database_url)
    assert await _run(fresh_database_url, _tenants) == [("fleet", None)]

    def created_at(connection: Connection) -> datetime | None:
        return connection.scalar(select(Tenant.created_at).where(Tenant.id == "fleet"))

    created = await _run(fresh_database_url, created_at)
    assert created is not None and abs(datetime.now(UTC) - created) < timedelta(hours=1)


async def test_upgrade_keeps_a_fleet_tenant_that_demo_made(fresh_database_url: str) -> None:
    """Before 0002, `demo` created fleet (and an operator could give it a parent): the
    upgrade keeps the row and what refers to it, and makes it a root."""
    await _run(fresh_database_url, _upgrade_to_initial_schema)

    def made_by_demo(connection: Connection) -> None:
        connection.execute(
            text(
                "INSERT INTO tenants (id, parent_id, created_at) VALUES "
                "('acme', NULL, CURRENT_TIMESTAMP), ('fleet', 'acme', CURRENT_TIMESTAMP)"
            )
        )
        connection.execute(
            text(
                "INSERT INTO callers (id, tenant_id, created_at) "
                "VALUES ('caller_1', 'fleet', CURRENT_TIMESTAMP)"
            )
        )

    await _run(fresh_database_url, made_by_demo)
    assert await upgrade(fresh_database_url) == head_revision()
    assert await _run(fresh_database_url, _tenants) == [("acme", None), ("fleet", None)]

    def fleet_callers(connection: Connection) -> list[str]:
        return list(connection.scalars(text("SELECT id FROM callers WHERE tenant_id = 'fleet'")))

    assert await _run(fresh_database_url, fleet_callers) == ["caller_1"]


def test_the_cli_head_constant_is_the_chain_head() -> None:
    """The CLI skips migrating the embedded default when it is at app.db.head's revision."""
    from app.db.head import HEAD_REVISION

    assert head_revision() == HEAD_REVISION
