"""The test run's databases: one migrated database per dialect, and scratch ones.

PostgreSQL databases are created on the server at BETTERCOMPUTE_TEST_POSTGRES_URL
(`bc_test_<hex>`) and dropped when the run ends; SQLite databases are files in a
temporary directory. Nothing is created for a dialect no test asks for.

With BETTERCOMPUTE_TEST_PGBOUNCER=1 the run starts its own PgBouncer in transaction mode
(tests/pgbouncer.py) and every PostgreSQL URL handed to the code under test points at it
(`?pgbouncer=true`); creating, emptying and dropping databases still go direct.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path
from typing import NoReturn

import pytest
from sqlalchemy import delete, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from app.db.engine import behind_pgbouncer
from app.db.migrate import upgrade
from app.db.models import Base, Tenant
from app.iam.roles import FLEET_TENANT
from tests.pgbouncer import PgBouncer

POSTGRES_URL = os.environ.get(
    "BETTERCOMPUTE_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("BETTERCOMPUTE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
DIALECTS = ("sqlite", "postgresql")
# Long enough for a busy machine; an unreachable server still fails (or skips) quickly.
CONNECT_TIMEOUT_S = 15.0


def pgbouncer_requested() -> bool:
    value = os.environ.get("BETTERCOMPUTE_TEST_PGBOUNCER", "")
    return value.strip().lower() in {"1", "true", "yes", "on"}


def direct_url(url: str) -> str:
    """`url` as a direct connection to the PostgreSQL server, bypassing any PgBouncer: for
    what transaction pooling cannot carry (LISTEN, admin operations)."""
    parsed, pgbouncer = behind_pgbouncer(url)
    if not pgbouncer:
        return url
    server = make_url(POSTGRES_URL)
    return parsed.set(host=server.host, port=server.port).render_as_string(hide_password=False)


def services_required() -> bool:
    value = os.environ.get("BETTERCOMPUTE_TEST_REQUIRE_SERVICES", "")
    return value.strip().lower() in {"1", "true", "yes", "on"}


def service_unavailable(message: str) -> NoReturn:
    """Skip the test, or fail it when the run requires every service (CI)."""
    if services_required():
        pytest.fail(f"{message} (BETTERCOMPUTE_TEST_REQUIRE_SERVICES is set)", pytrace=False)
    pytest.skip(message)


# Idle backends are left alone: a PgBouncer keeps its server connections open between
# clients, and an idle connection holds no lock.
STRAY_BACKENDS = """
SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND backend_type = 'client backend' AND state IS DISTINCT FROM 'idle'
"""


def _plain_engine(url: str) -> AsyncEngine:
    """No pooling, no PRAGMAs: connections live only as long as one statement batch."""
    if make_url(url).get_backend_name() == "postgresql":
        return create_async_engine(
            url, poolclass=NullPool, connect_args={"timeout": CONNECT_TIMEOUT_S}
        )
    return create_async_engine(url, poolclass=NullPool)


async def empty_tables(url: str) -> None:
    """Delete every row of every model table but the built-in fleet tenant, which the
    database refuses to delete (migration 0002); keep alembic_version. Sequences restart."""
    engine = _plain_engine(direct_url(url))
    tables = [t for t in Base.metadata.sorted_tables if t is not Tenant.__table__]
    tenants = delete(Tenant).where(Tenant.id != FLEET_TENANT)
    try:
        async with engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                # A backend still busy here (a transaction left open, a statement running)
                # belongs to an earlier test's leak: end it, so this test starts clean.
                await connection.exec_driver_sql(STRAY_BACKENDS)
                # A test that left a transaction open would otherwise make this hang.
                await connection.exec_driver_sql("SET LOCAL lock_timeout = '10s'")
                names = ", ".join(
                    connection.dialect.identifier_preparer.format_table(t) for t in tables
                )
                await connection.exec_driver_sql(f"TRUNCATE {names} RESTART IDENTITY CASCADE")
                await connection.execute(tenants)
            else:
                for table in reversed(tables):
                    await connection.execute(delete(table))
                await connection.execute(tenants)
                has_sequences = await connection.scalar(
                    text("SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_sequence'")
                )
                if has_sequences:
                    await connection.exec_driver_sql("DELETE FROM sqlite_sequence")
    finally:
        await engine.dispose()


class TestDatabases:
    """Creates databases on demand and drops them all in `close()`."""

    __test__ = False  # not a test class

    def __init__(self, sqlite_dir: Path) -> None:
        self._sqlite_dir = sqlite_dir
        self._migrated: dict[str, str] = {}
        self._postgres_databases: list[str] = []
        self._postgres_error: str | None = None
        self._postgres_checked = False
        self._pgbouncer: PgBouncer | None = None

    async def migrated(self, dialect: str) -> str:
        """The run's database for `dialect`, migrated to head on first use."""
        if dialect not in self._migrated:
            url = await self.create_empty(dialect)
            await upgrade(url)
            self._migrated[dialect] = url
        return self._migrated[dialect]

    async def create_empty(self, dialect: str) -> str:
        """A new database with no tables at all."""
        name = f"bc_test_{secrets.token_hex(8)}"
        if dialect == "sqlite":
            return f"sqlite+aiosqlite:///{self._sqlite_dir / name}.db"
        if dialect != "postgresql":
            raise ValueError(f"unknown dialect {dialect!r}")
        await self._require_postgres()
        admin = self._postgres_admin()
        try:
            async with admin.connect() as connection:
                await connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
        finally:
            await admin.dispose()
        self._postgres_databases.append(name)
        url = make_url(POSTGRES_URL).set(database=name)
        if self._pgbouncer is not None:
            url = url.set(host="127.0.0.1", port=self._pgbouncer.port).update_query_dict(
                {"pgbouncer": "true"}
            )
        return url.render_as_string(hide_password=False)

    async def drop(self, url: str) -> None:
        parsed = make_url(url)
        if parsed.get_backend_name() == "sqlite":
            path = Path(parsed.database or "")
            for suffix in ("", "-wal", "-shm", "-journal"):
                path.with_name(path.name + suffix).unlink(missing_ok=True)
            return
        name = parsed.database or ""
        await self._drop_postgres([name])
        self._postgres_databases.remove(name)

    async def close(self) -> None:
        if self._postgres_databases:
            await self._drop_postgres(self._postgres_databases)
        self._postgres_databases = []
        self._migrated.clear()
        if self._pgbouncer is not None:
            bouncer, self._pgbouncer = self._pgbouncer, None
            code = bouncer.process.poll()
            died = None if code is None else bouncer.log()[-2000:]
            bouncer.stop()
            if died is not None:
                # Every test after it failed to connect: say why, once, with its own log
                # (which stop() deletes with its directory).
                raise RuntimeError(f"pgbouncer exited during the run (code {code}): {died}")

    def _postgres_admin(self) -> AsyncEngine:
        return create_async_engine(
            POSTGRES_URL,
            poolclass=NullPool,
            isolation_level="AUTOCOMMIT",  # CREATE/DROP DATABASE refuse a transaction
            connect_args={"timeout": CONNECT_TIMEOUT_S},
        )

    async def _require_postgres(self) -> None:
        if not self._postgres_checked:
            self._postgres_checked = True
            admin = self._postgres_admin()
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S * 2), admin.connect() as connection:
                    await connection.exec_driver_sql("SELECT 1")
            except Exception as exc:  # any failure to reach the server means "unavailable"
                self._postgres_error = f"{type(exc).__name__}: {exc}"
            finally:
                await admin.dispose()
            if self._postgres_error is None and pgbouncer_requested():
                server = make_url(POSTGRES_URL)
                try:
                    self._pgbouncer = await PgBouncer.start(
                        server.host or "127.0.0.1", server.port or 5432, server.username
                    )
                except Exception as exc:  # no pgbouncer binary, or it would not start
                    self._postgres_error = f"PgBouncer: {type(exc).__name__}: {exc}"
        if self._postgres_error is not None:
            where = make_url(POSTGRES_URL).render_as_string(hide_password=True)
            service_unavailable(f"PostgreSQL unreachable at {where}: {self._postgres_error}")

    async def _drop_postgres(self, names: list[str]) -> None:
        admin = self._postgres_admin()
        try:
            async with admin.connect() as connection:
                for name in names:
                    await connection.exec_driver_sql(
                        f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
                    )
        finally:
            await admin.dispose()
