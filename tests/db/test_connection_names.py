"""An operator tells the service's connections apart in pg_stat_activity: the pool's, the
relay's own and the compiled reads' each carry their own application_name. Real
PostgreSQL, seen from a session of its own."""

from __future__ import annotations

import asyncpg
import pytest
from sqlalchemy import text

from app.db.direct import DIRECT_APPLICATION_NAME
from app.db.engine import APPLICATION_NAME, RELAY_APPLICATION_NAME, Database
from tests.db.faults import postgres_dsn

pytestmark = pytest.mark.parametrize("dialect", ["postgresql"])


async def test_each_kind_of_connection_is_named_in_pg_stat_activity(
    db: Database, database_url: str
) -> None:
    if db.pooled_by_transaction:
        pytest.skip("behind PgBouncer the server connections are PgBouncer's")
    assert db.relay is not None and db.direct is not None
    async with db.writer.connect() as pooled, db.relay.connect() as relay:
        pids = {
            APPLICATION_NAME: (await pooled.execute(text("SELECT pg_backend_pid()"))).scalar(),
            RELAY_APPLICATION_NAME: (await relay.execute(text("SELECT pg_backend_pid()"))).scalar(),
        }
        pids[DIRECT_APPLICATION_NAME] = await db.direct.fetchval("SELECT pg_backend_pid()", ())
        observer = await asyncpg.connect(postgres_dsn(database_url), timeout=10)
        try:
            rows = await observer.fetch(
                "SELECT pid, application_name FROM pg_stat_activity WHERE pid = ANY($1::int[])",
                list(pids.values()),
            )
        finally:
            await observer.close()
    assert {row["application_name"]: row["pid"] for row in rows} == pids
