"""The relay's reads (app/events/relay.py, `_drain_reads`): on its own connections one is
held from read to read, and a connection the server ends is replaced with nothing lost or
repeated; between reads the relay holds no transaction open (no snapshot that would hold
back the horizon on PostgreSQL, or a checkpoint on SQLite, where it reads on the
requests' pool a connection per read). Where the relay shares the requests' pool it keeps
none from them (tests/graphql: a pool of 2, a reader pool emptied between queries)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from starlette.applications import Starlette

from app.db.engine import RELAY_APPLICATION_NAME
from app.events.relay import Relay
from tests.databases import pgbouncer_requested
from tests.db.faults import admin, terminate_backends
from tests.events.support import emit_updates, settle, subscribe, wait_until
from tests.rest.scene import Scene
from tests.support import Api, Fleet


def _checkpoint_to_the_end(path: str) -> int:
    """SQLite's TRUNCATE checkpoint, waiting up to 2 s for readers: 1 if one still held a
    read transaction then, else 0."""
    with contextlib.closing(sqlite3.connect(path, timeout=2.0)) as conn:
        busy: int = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
    return busy


@pytest.mark.parametrize("dialect", ["postgresql"])  # a server to end the session
async def test_a_relay_connection_the_server_ends_is_replaced_and_nothing_is_lost(
    app: Starlette, api: Api, fleet: Fleet
) -> None:
    if pgbouncer_requested():
        pytest.skip("the relay reads through PgBouncer there: no session of its own to end")
    s = await Scene.start(api, fleet)
    pool_id = (await s.pool())["id"]
    watching = await subscribe(app, s.token, "acme")
    capacity = app.state.capacity
    relay: Relay = app.state.relay
    await emit_updates(capacity, pool_id, "acme", 5)
    await wait_until(lambda: len(watching.events) == 5)
    database = make_url(capacity.db.url).database
    await admin(
        terminate_backends(
            f"datname = '{database}' AND application_name = '{RELAY_APPLICATION_NAME}'"
        )
    )
    for start in (5, 10, 15):  # the first read after the kill fails; the relay reads again
        await emit_updates(capacity, pool_id, "acme", 5, start=start)
    await settle(app, watching)
    assert [e.data["n"] for e in watching.events] == list(range(20))
    assert relay.cursor >= watching.events[-1].position
    await watching.close()


async def test_between_reads_the_relay_holds_no_transaction(
    app: Starlette, api: Api, fleet: Fleet, dialect: str
) -> None:
    if dialect == "postgresql" and pgbouncer_requested():
        pytest.skip("the relay reads through PgBouncer there, in transactions of the pool")
    s = await Scene.start(api, fleet)
    pool_id = (await s.pool())["id"]
    watching = await subscribe(app, s.token, "acme")
    capacity = app.state.capacity
    await emit_updates(capacity, pool_id, "acme", 3)
    await settle(app, watching)
    if dialect == "sqlite":
        # A read transaction left open keeps a checkpoint from reaching the WAL's end.
        path = make_url(capacity.db.url).database
        assert path is not None
        # In a thread: a relay read under way finishes meanwhile (it needs the loop).
        assert await asyncio.to_thread(_checkpoint_to_the_end, path) == 0
    else:
        async with capacity.db.writer.connect() as conn:
            held = (
                await conn.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND application_name = :relay AND state LIKE 'idle in transaction%'"
                    ),
                    {"relay": RELAY_APPLICATION_NAME},
                )
            ).scalar_one()
        assert held == 0
    await watching.close()
