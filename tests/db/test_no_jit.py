"""No statement of the service's is JIT-compiled: PostgreSQL compiles one whose estimated
cost passes jit_above_cost on every execution, which cost a relay read 40-70 ms where it
runs in 0.2 ms (app/db/direct.py, NO_JIT). Every way the service reaches PostgreSQL runs
with jit off: the engine's connections (in a transaction and out of one), the direct
reads' pool, and behind PgBouncer each transaction. Real PostgreSQL (and PgBouncer in
that run), the server's own default left on."""

from __future__ import annotations

import asyncpg
import pytest
from sqlalchemy import text

from app.db.engine import Database
from tests.db.faults import postgres_dsn

pytestmark = pytest.mark.parametrize("dialect", ["postgresql"])  # SQLite has no JIT


async def test_the_server_compiles_by_default(database_url: str) -> None:
    """A session without the service's settings JIT-compiles here: what the settings
    below turn off is on (the other test would prove nothing against a server with JIT
    off already)."""
    conn = await asyncpg.connect(postgres_dsn(database_url), timeout=10)
    try:
        assert await conn.fetchval("SELECT current_setting('jit')") == "on"
    finally:
        await conn.close()


async def test_every_service_connection_runs_without_jit(db: Database) -> None:
    async with db.writer.begin() as conn:  # a unit of work's transaction
        assert (await conn.execute(text("SELECT current_setting('jit')"))).scalar_one() == "off"
    if not db.pooled_by_transaction:
        async with db.reader.connect() as conn:
            autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
            found = await autocommit.execute(text("SELECT current_setting('jit')"))
            assert found.scalar_one() == "off"  # statements outside a transaction
    if db.relay is not None:  # the relay's reads, on its own connections
        async with db.relay.connect() as conn:
            assert (await conn.execute(text("SELECT current_setting('jit')"))).scalar_one() == "off"
    if db.direct is not None:
        assert await db.direct.fetchval("SELECT current_setting('jit')", ()) == "off"
