"""The service behind PgBouncer in transaction mode (`?pgbouncer=true` on the URL).

Each test starts its own PgBouncer (tests/pgbouncer.py) in front of the run's PostgreSQL
with two server connections, so every transaction of the many client connections lands
on a server connection another client used before: a statement prepared under a name
another client also uses, or a startup parameter PgBouncer does not know, fails here.
The whole PostgreSQL suite also runs through one (BETTERCOMPUTE_TEST_PGBOUNCER=1, CI).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from sqlalchemy import select, text
from sqlalchemy.engine import make_url

from app.config import Settings
from app.db.engine import create_database
from app.db.migrate import current_revision, head_revision, migration_engine, upgrade
from app.db.models import Tenant
from app.iam.roles import FLEET_TENANT
from tests.databases import direct_url, service_unavailable
from tests.pgbouncer import PgBouncer


@pytest_asyncio.fixture(loop_scope="session")
async def bouncer(database_url: str) -> AsyncIterator[PgBouncer]:
    server = make_url(direct_url(database_url))
    try:
        started = await PgBouncer.start(
            server.host or "127.0.0.1", server.port or 5432, server.username, pool_size=2
        )
    except FileNotFoundError as exc:
        service_unavailable(str(exc))
    try:
        yield started
    finally:
        started.stop()


def through(bouncer: PgBouncer, url: str) -> str:
    direct = make_url(direct_url(url))
    return (
        direct.set(host="127.0.0.1", port=bouncer.port)
        .update_query_dict({"pgbouncer": "true"})
        .render_as_string(hide_password=False)
    )


@pytest.mark.parametrize("dialect", ["postgresql"])
async def test_many_connections_share_two_server_connections(
    database_url: str, bouncer: PgBouncer
) -> None:
    db = create_database(
        through(bouncer, database_url), Settings(db_pool_size=20, db_statement_timeout_s=7)
    )
    try:

        async def client(n: int) -> list[str]:
            seen = []
            for round_ in range(5):
                async with db.reader.connect() as conn:
                    # A parameterised statement (prepared by asyncpg), one per round.
                    found = await conn.scalar(
                        select(Tenant.id).where(Tenant.id == FLEET_TENANT, Tenant.id != f"{n}")
                    )
                    first = await conn.scalar(select(Tenant.id).limit(round_ + 1))
                    assert first is not None
                    seen.append(str(found))
            return seen

        results = await asyncio.gather(*(client(n) for n in range(20)))
        assert all(r == [FLEET_TENANT] * 5 for r in results)
        # The statement bound, set per transaction since PgBouncer refuses it at startup.
        async with db.writer.begin() as conn:
            assert (await conn.exec_driver_sql("SHOW statement_timeout")).scalar_one() == "7s"
    finally:
        await db.dispose()


@pytest.mark.parametrize("dialect", ["postgresql"])
async def test_no_statement_is_left_for_asyncpg_to_close(
    database_url: str, bouncer: PgBouncer
) -> None:
    """Behind PgBouncer every statement is the unnamed one: a named statement is closed by
    asyncpg before the connection's next one with no timeout, so a database that stopped
    answering held that request until it came back (tests/db/test_unresponsive_database.py).
    After many different statements in one transaction, the server session holds no
    prepared statement and asyncpg has none queued to close."""
    db = create_database(through(bouncer, database_url))
    try:
        async with db.reader.connect() as conn:
            for n in range(10):
                await conn.scalar(select(Tenant.id).where(Tenant.id != f"{n}").limit(n + 1))
            kept = await conn.scalar(text("SELECT count(*) FROM pg_prepared_statements"))
            raw = await conn.get_raw_connection()
            queued = len(getattr(raw.driver_connection, "_stmts_to_close", ()))
        assert (kept, queued) == (0, 0)
    finally:
        await db.dispose()


@pytest.mark.parametrize("dialect", ["postgresql"])
async def test_migrations_run_behind_pgbouncer(fresh_database_url: str, bouncer: PgBouncer) -> None:
    url = through(bouncer, fresh_database_url)
    await upgrade(url)
    engine = migration_engine(url)
    try:
        async with engine.connect() as conn:
            assert await conn.run_sync(current_revision) == head_revision()
    finally:
        await engine.dispose()
