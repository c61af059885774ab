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
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
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


def _upgrade_to_0008(connection: Connection) -> None:
    command.upgrade(alembic_config(connection), "0008")


def _events_before_0009(connection: Connection) -> None:
    """What a service at 0008 left: six events (seq 1..6), the first two pruned."""
    connection.execute(
        text("INSERT INTO tenants (id, created_at) VALUES ('acme', CURRENT_TIMESTAMP)")
    )
    connection.execute(
        text(
            "INSERT INTO sites (id, tenant_id, kind, region, agent_revision, created_at) "
            "VALUES ('site_old', 'acme', 'custom', 'eu-west', 1, CURRENT_TIMESTAMP)"
        )
    )
    connection.execute(
        text(
            "INSERT INTO pools (id, tenant_id, site_id, class, sharing, agent, policy, region,"
            " archived, version, created_at, updated_at) VALUES ('pool_old', 'acme', 'site_old',"
            " 'metal-host', 'exclusive', 'none', '{}', 'eu-west', false, 1, CURRENT_TIMESTAMP,"
            " CURRENT_TIMESTAMP)"
        )
    )
    for n in range(6):
        connection.execute(
            text(
                "INSERT INTO events (type, pool_id, tenant_id, occurred_at, data) VALUES"
                " ('pool.updated', 'pool_old', 'acme', CURRENT_TIMESTAMP, :data)"
            ),
            {"data": f'{{"n": {n}}}'},
        )
        connection.execute(
            text("INSERT INTO event_audience (seq, tenant_id) VALUES (:seq, 'acme')"),
            {"seq": n + 1},
        )
    connection.execute(text("DELETE FROM event_audience WHERE seq <= 2"))
    connection.execute(text("DELETE FROM events WHERE seq <= 2"))  # as 0008's pruner did


async def test_cursors_handed_out_before_0009_resume_exactly_after_it(
    fresh_database_url: str,
) -> None:
    """ev1 cursors taken at 0008 mean the same events at 0009: resuming after one gives
    exactly the later old events, then the ones written since; expiry reads the same."""
    from app.db.engine import create_database
    from app.events.cursor import START, decode_cursor, encode_cursor
    from app.events.outbox import PendingEvent, append_events, lock_pool_for_events
    from app.events.reader import outbox_bounds, read_events
    from tests.events.support import visible_outbox

    await _run(fresh_database_url, _upgrade_to_0008)
    await _run(fresh_database_url, _events_before_0009)
    # Cursors as 0008 handed them out: base64url of "ev1:<seq>".
    taken = {seq: encode_cursor(seq) for seq in (1, 2, 4, 6)}
    assert taken[4] == "ZXYxOjQ"
    assert await upgrade(fresh_database_url) == head_revision()

    db = create_database(fresh_database_url)
    try:
        async with AsyncSession(db.writer) as session:
            assert await lock_pool_for_events(session, "pool_old")
            await append_events(
                session,
                [PendingEvent("pool.updated", "pool_old", "acme", {"n": n}) for n in (6, 7)],
            )
            await session.commit()
        async with visible_outbox(db) as conn:
            bounds = await outbox_bounds(conn)
            resumed = {
                seq: [e.data["n"] for e in await read_events(conn, decode_cursor(c), limit=50)]
                for seq, c in taken.items()
            }
            everything = await read_events(conn, START, limit=100)
        assert resumed[2] == [2, 3, 4, 5, 6, 7]
        assert resumed[4] == [4, 5, 6, 7]
        assert resumed[6] == [6, 7]
        # Expired exactly as before: ev1:1's successor (seq 2) was pruned, ev1:2's was not.
        assert bounds.expired(decode_cursor(taken[1]))
        assert not bounds.expired(decode_cursor(taken[2]))
        new_tx = {e.tx for e in everything} - {0}
        assert len(new_tx) == (0 if db.dialect == "sqlite" else 1)
    finally:
        await db.dispose()
