"""A pooled connection that died is never a 500, with no ping on checkout (app/db/engine.py).

The faults are real: the server ends the service's backends while their connections sit
idle in the pool (`pg_terminate_backend`, as a restart does), or a connection is closed
between its checkout and its first statement (a checkout listener of the test, after the
service's own, closes it). Every database round trip of the service's connections is
seen by asyncpg's query logger (its public `add_query_logger`): a checkout sends none.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import asyncpg
import asyncpg.transaction
import pytest
from sqlalchemy import event, func, select
from starlette.applications import Starlette

from app.db.engine import Database
from app.db.models import Pool
from app.metrics import request_transport
from tests.databases import pgbouncer_requested
from tests.db.faults import admin, terminate_backends
from tests.support import Api, Fleet

POSTGRESQL = pytest.mark.parametrize("dialect", ["postgresql"])  # no pooled sockets on SQLite


@asynccontextmanager
async def round_trips(db: Database) -> AsyncIterator[Callable[[], list[str]]]:
    """Every statement the service's engine sends for REST requests, as asyncpg logs them
    (BEGIN included, not COMMIT), on connections made afresh for the block: yields a
    function that starts the count and returns the list it fills."""
    sent: list[str] = []
    counting = False

    def logged(query: Any) -> None:
        if counting and request_transport.get() == "rest":
            sent.append(query.query)

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.driver_connection.add_query_logger(logged)

    def start() -> list[str]:
        nonlocal counting
        counting = True
        return sent

    event.listen(db.writer.sync_engine, "connect", on_connect)
    await db.writer.dispose()  # the pool's connections are made again, each logged
    try:
        yield start
    finally:
        event.remove(db.writer.sync_engine, "connect", on_connect)


@contextmanager
def closed_after_checkout(db: Database, times: int) -> Iterator[list[int]]:
    """The next `times` checkouts hand out a connection closed after the service's own
    checkout check passed it: dead before its first statement. Yields the count closed."""
    closed: list[int] = []

    def on_checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        if len(closed) < times:
            dbapi_connection.driver_connection.terminate()
            closed.append(1)

    event.listen(db.writer.sync_engine, "checkout", on_checkout)
    try:
        yield closed
    finally:
        event.remove(db.writer.sync_engine, "checkout", on_checkout)


# The engine's pool pings behind PgBouncer (a connection was now and then
# garbage-collected unclosed there without it: not yet understood): these are the
# direct server's.
DIRECT = pytest.mark.skipif(
    pgbouncer_requested(), reason="an intermittent unclosed-connection warning behind PgBouncer"
)


def _create(site: str) -> dict[str, str]:
    return {"tenantId": "acme", "siteId": site, "class": "metal-host"}


async def _pool(api: Api, fleet: Fleet) -> tuple[str, str]:
    await fleet.tenant("acme")
    site = await fleet.site("acme")
    token = await fleet.caller("acme", "admin")
    made = await api.ok(token, "pools/create", _create(site))
    return token, made["pool"]["id"]


async def _pools(db: Database) -> int:
    async with db.reader.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(Pool))).scalar_one())


@POSTGRESQL
@DIRECT
async def test_a_checkout_sends_nothing(app: Starlette, api: Api, fleet: Fleet) -> None:
    """A write's round trips are BEGIN, its statements and COMMIT: no ping (pre-ping sent
    BEGIN, an empty statement and ROLLBACK at each checkout)."""
    token, pool_id = await _pool(api, fleet)
    body = {"tenantId": "acme", "poolId": pool_id, "gpuModel": "L40S"}
    async with round_trips(app.state.db) as start:
        await api.ok(token, "pools/update", body)  # on a new connection: never pinged
        sent = start()
        await api.ok(token, "pools/update", {**body, "gpuModel": "H100"})  # a pooled one
    # The pre-ping was BEGIN, an empty statement and ROLLBACK on each checkout. (The
    # relay's reads the write wakes are logged too: they carry the request's context.)
    assert "COMMIT;" in sent, sent  # the write's transaction was logged
    assert all(q.strip(" ;") for q in sent), sent
    assert "ROLLBACK;" not in sent, sent


@POSTGRESQL
async def test_connections_the_server_ended_while_idle_are_replaced(
    database_url: str, app: Starlette, api: Api, fleet: Fleet
) -> None:
    """The server ends every backend of the service (a restart, an operator): the next
    write and read answer 200 on new connections, with no error and no ping."""
    token, pool_id = await _pool(api, fleet)
    name = database_url.rsplit("/", 1)[-1].split("?", 1)[0]
    await admin(terminate_backends(f"datname = '{name}'"))
    updated = await api.ok(
        token, "pools/update", {"tenantId": "acme", "poolId": pool_id, "gpuModel": "L40S"}
    )
    assert updated["pool"]["gpuModel"] == "L40S"
    listed = await api.ok(token, "pools/list", {"tenantId": "acme"})
    assert [p["id"] for p in listed["pools"]] == [pool_id]


@POSTGRESQL
@DIRECT
@pytest.mark.parametrize("dead", [1, 2])
async def test_a_write_whose_connection_died_before_its_first_statement_runs_again_once(
    app: Starlette, api: Api, fleet: Fleet, dead: int
) -> None:
    """Dead between checkout and the first statement: nothing was written, so the write
    runs once more on a new connection and answers 200, writing once. Once only: a
    second dead connection answers UNAVAILABLE (503, Retry-After), having written
    nothing."""
    token, _ = await _pool(api, fleet)
    site = await fleet.site("acme")
    db: Database = app.state.db
    before = await _pools(db)
    with closed_after_checkout(db, times=dead) as closed:
        response = await api.post(token, "pools/create", _create(site))
    assert closed == [1] * dead
    if dead == 1:
        assert response.status_code == 200, response.text
        assert response.json()["pool"]["siteId"] == site
        assert await _pools(db) == before + 1
    else:
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "UNAVAILABLE"
        assert int(response.headers["retry-after"]) > 0
        assert await _pools(db) == before


@POSTGRESQL
@DIRECT
async def test_a_write_whose_connection_died_at_commit_is_not_run_again(
    app: Starlette, api: Api, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dead as COMMIT is sent: the server may have committed it (an answer lost on the
    way), so the write is not run again, whatever its statements were (a create runs on
    the unit of work's driver statements, on a leased connection: app/db/lease.py):
    UNAVAILABLE, and here, where the connection died before COMMIT reached the server,
    nothing was written. The connection dies in asyncpg's COMMIT, which every path sends."""
    token, _ = await _pool(api, fleet)
    site = await fleet.site("acme")
    db: Database = app.state.db
    before = await _pools(db)
    closed: list[int] = []
    commit = asyncpg.transaction.Transaction.commit

    async def dying_commit(self: asyncpg.transaction.Transaction) -> None:
        if not closed:
            self._connection.terminate()
            closed.append(1)
        await commit(self)

    monkeypatch.setattr(asyncpg.transaction.Transaction, "commit", dying_commit)
    response = await api.post(token, "pools/create", _create(site))
    monkeypatch.undo()
    assert closed == [1]
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "UNAVAILABLE"
    assert await _pools(db) == before
