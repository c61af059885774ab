"""PostgreSQL refusing connections answers 503 UNAVAILABLE with Retry-After on REST and
GraphQL, never 500, and the service answers 200 again as soon as the database does.

Each fault is a real one, made by the test on a database or role of its own: a database
that does not accept connections (55000), a role over its connection limit (53300), a
server shutting down (57P03, on a private server). Clients call REST and GraphQL in a
loop throughout; the test prints their answers by status during the fault and the time
from the fault ending to the first 200.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import httpx
import orjson
import pytest
from sqlalchemy.engine import make_url
from websockets.asyncio.client import connect as websockets_connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from app.config import Settings
from app.db.engine import Database, create_database
from app.db.migrate import upgrade
from tests.databases import direct_url
from tests.db.faults import (
    Load,
    admin,
    private_postgres,
    refuse_database,
    report,
    terminate_backends,
)
from tests.events.conftest import running, served
from tests.support import Api, Fleet

POSTGRESQL = pytest.mark.parametrize("dialect", ["postgresql"])  # PostgreSQL's SQLSTATEs
LIST_POOLS = 'query { pools(tenantId: "acme", first: 10) { nodes { id } } }'
ANSWERS_DURING_FAULT = 20  # per surface


def _calls(api: Api, token: str) -> tuple[Callable[[], Awaitable[httpx.Response]], ...]:
    headers = {"authorization": f"Bearer {token}"}

    def rest() -> Awaitable[httpx.Response]:
        return api.client.post(
            "/api/compute/pools/list", json={"tenantId": "acme"}, headers=headers
        )

    def graphql() -> Awaitable[httpx.Response]:
        return api.client.post("/graphql", json={"query": LIST_POOLS}, headers=headers)

    return rest, graphql


def _assert_unavailable(rest: httpx.Response, graphql: httpx.Response) -> None:
    assert rest.status_code == 503, rest.text
    assert rest.json()["error"]["code"] == "UNAVAILABLE"
    assert int(rest.headers["retry-after"]) > 0
    assert graphql.status_code == 503, graphql.text
    body: dict[str, Any] = graphql.json()
    assert body["data"] is None
    assert [e["extensions"]["code"] for e in body["errors"]] == ["UNAVAILABLE"]
    assert int(graphql.headers["retry-after"]) > 0


async def _outage(
    name: str,
    api: Api,
    token: str,
    fault: Callable[[], Awaitable[None]],
    heal: Callable[[], Awaitable[None]],
) -> None:
    """Load on both surfaces; the fault; answers by status until it heals; recovery."""
    rest_call, graphql_call = _calls(api, token)
    async with Load(rest_call, clients=3) as rest, Load(graphql_call, clients=3) as graphql:
        await rest.first_success_after(0.0, 30)
        await graphql.first_success_after(0.0, 30)

        await fault()
        faulted = time.monotonic()
        await rest.answered(ANSWERS_DURING_FAULT, faulted, 60)
        await graphql.answered(ANSWERS_DURING_FAULT, faulted, 60)
        samples = (await rest_call(), await graphql_call())

        # The fault window ends when healing starts: a restarted server may answer 200
        # before heal() returns.
        healing = time.monotonic()
        await heal()
        healed = time.monotonic()
        recovery = max(
            await rest.first_success_after(healed, 30),
            await graphql.first_success_after(healed, 30),
        )
    during = rest.statuses(faulted, healing) + graphql.statuses(faulted, healing)
    report(name, during, recovery)
    assert set(during) == {503}, during
    _assert_unavailable(*samples)


@POSTGRESQL
async def test_a_database_not_accepting_connections_is_503(database_url: str, db: Database) -> None:
    """55000: `ALTER DATABASE … ALLOW_CONNECTIONS false`, its sessions ended."""
    fleet = Fleet(db)
    await fleet.tenant("acme")
    token = await fleet.caller("acme", "viewer")
    await db.dispose()
    name = make_url(database_url).database
    assert name is not None

    async def fault() -> None:
        await refuse_database(name)

    async def heal() -> None:
        await admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')

    try:
        async with running(Settings(database_url=database_url)) as (_, api):
            await _outage("55000 database not accepting connections", api, token, fault, heal)
    finally:
        await heal()


@POSTGRESQL
async def test_a_role_over_its_connection_limit_is_503(database_url: str, db: Database) -> None:
    """53300: the service's role gets `CONNECTION LIMIT 0`, its sessions ended."""
    fleet = Fleet(db)
    await fleet.tenant("acme")
    token = await fleet.caller("acme", "viewer")
    await db.dispose()
    database = make_url(database_url).database
    role = f"bc_app_{secrets.token_hex(6)}"
    await admin(f'CREATE ROLE "{role}" LOGIN')
    await admin(
        f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{role}"',
        f'GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "{role}"',
        database=database,
    )
    # The server's own refusal of the role, so direct even in a run through PgBouncer
    # (whose auth file knows no such role).
    as_role = (
        make_url(direct_url(database_url)).set(username=role).render_as_string(hide_password=False)
    )

    async def fault() -> None:
        await admin(
            f'ALTER ROLE "{role}" CONNECTION LIMIT 0', terminate_backends(f"usename = '{role}'")
        )

    async def heal() -> None:
        await admin(f'ALTER ROLE "{role}" CONNECTION LIMIT -1')

    try:
        async with running(Settings(database_url=as_role)) as (_, api):
            await _outage("53300 too many connections for the role", api, token, fault, heal)
    finally:
        await admin(terminate_backends(f"usename = '{role}'"))
        await admin(f'DROP OWNED BY "{role}"', database=database)
        await admin(f'DROP ROLE "{role}"')


async def test_a_server_shutting_down_and_restarting_is_503() -> None:
    """57P03 while a smart shutdown waits for the last session, then connections refused
    while the server is down, then its restart."""
    async with private_postgres() as server:
        await server.execute("CREATE DATABASE bc")
        url = server.url("bc")
        await upgrade(url)
        seeding = create_database(url)
        fleet = Fleet(seeding)
        await fleet.tenant("acme")
        token = await fleet.caller("acme", "viewer")
        await seeding.dispose()
        held = await asyncpg.connect(server.dsn(), timeout=10)  # keeps the shutdown waiting

        async def fault() -> None:
            await server.stop("smart", wait=False)
            await server.refusing()  # no session of the service's starts after this
            await held.execute(terminate_backends("datname = 'bc'"))

        async def heal() -> None:
            # A session that was still starting when the ones of `bc` were ended had no
            # database name yet; whatever is left but `held` ends now, or the smart
            # shutdown waits for it.
            await held.execute(terminate_backends("backend_type = 'client backend'"))
            await held.close()
            await server.wait_stopped()
            await server.start()

        try:
            async with running(Settings(database_url=url)) as (_, api):
                await _outage("57P03 shutting down, down, restarted", api, token, fault, heal)
        finally:
            if not held.is_closed():
                await held.close()


@POSTGRESQL
@pytest.mark.parametrize("protocol", ["graphql-transport-ws", "graphql-ws"])
async def test_a_websocket_opened_while_the_database_refuses_closes_1013(
    database_url: str, db: Database, protocol: str
) -> None:
    """connection_init cannot be authenticated while the database refuses connections
    (55000): the socket closes with 1013 (try again later), not 4403 (which tells a client
    its token is bad) nor a crash; once the database is back the same token connects."""
    fleet = Fleet(db)
    await fleet.tenant("acme")
    token = await fleet.caller("acme", "viewer")
    await db.dispose()
    name = make_url(database_url).database
    assert name is not None

    async def connect_once(address: str) -> tuple[int | None, list[dict[str, Any]]]:
        async with websockets_connect(
            f"ws://{address}/graphql", subprotocols=[Subprotocol(protocol)], open_timeout=60
        ) as ws:
            init = {"type": "connection_init", "payload": {"authorization": f"Bearer {token}"}}
            await ws.send(orjson.dumps(init).decode())
            seen: list[dict[str, Any]] = []
            try:
                async with asyncio.timeout(60):
                    while True:
                        message = orjson.loads(await ws.recv())
                        seen.append(message)
                        if message["type"] == "connection_ack":
                            return None, seen
            except ConnectionClosed as closed:
                return (closed.rcvd.code if closed.rcvd else None), seen

    async def heal() -> None:
        await admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')

    try:
        # Direct: behind PgBouncer the refusal is PgBouncer's login retry, not 55000.
        async with served(Settings(database_url=direct_url(database_url))) as (_, address):
            await refuse_database(name)
            code, seen = await connect_once(address)
            assert code == 1013, (code, seen)
            if protocol == "graphql-ws":  # the legacy protocol says why before closing
                assert seen[-1]["type"] == "connection_error"
                assert seen[-1]["payload"]["extensions"]["code"] == "UNAVAILABLE"
            await heal()
            code, seen = await connect_once(address)
            assert code is None and seen[-1]["type"] == "connection_ack"
    finally:
        await heal()
