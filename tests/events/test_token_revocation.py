"""A revoked token stops working on websockets opened before the revocation, on both
protocols, through a real uvicorn server and raw websocket clients (docs/events.md):

- every operation sent over an open socket checks the token again: refused with
  UNAUTHENTICATED, then the socket closes with 4403;
- a socket that only streams is closed with 4403 by its process's revocation watcher
  within a few seconds, whichever process revoked the token (the CLI here);
- across processes: two `bettercompute serve` over PostgreSQL with a Redis or PostgreSQL
  broker, revoked once with the CLI: the sockets on both close at once (the CLI's
  broker wake-up, long before the next poll).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy.engine import make_url
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from app.config import Settings
from app.db.engine import Database, create_database
from app.iam.callers import revoke_token
from tests.databases import direct_url
from tests.events.conftest import served
from tests.events.processes import bettercompute_serve
from tests.events.test_websocket import http_api
from tests.rest.scene import Scene, events
from tests.support import Fleet

TRANSPORT_WS = "graphql-transport-ws"
LEGACY_WS = "graphql-ws"
BOTH = [TRANSPORT_WS, LEGACY_WS]
EVENTS = 'subscription { poolEvents(tenantId: "acme") { cursor type } }'
VERSION = 'query($p: ID!) { pool(tenantId: "acme", poolId: $p) { version } }'
UPDATE = "mutation($i: UpdatePoolInput!) { updatePool(input: $i) { pool { version } } }"
OFFER = "mutation($i: OfferPoolInput!) { offerPool(input: $i) { pool { id } } }"
CLOSE_WITHIN_S = 10.0  # generous: the watcher looks every 0.2 s in these tests


async def send(ws: ClientConnection, message: dict[str, Any]) -> None:
    await ws.send(orjson.dumps(message).decode())


async def receive(ws: ClientConnection, within_s: float = 10.0) -> dict[str, Any]:
    """The next protocol message that is not a keep-alive."""
    while True:
        message: dict[str, Any] = orjson.loads(await asyncio.wait_for(ws.recv(), within_s))
        if message["type"] not in ("ka", "ping", "pong"):
            return message


async def close_code(ws: ClientConnection, within_s: float = CLOSE_WITHIN_S) -> int | None:
    """The close code the server sends within `within_s`, reading whatever comes first."""
    deadline = time.monotonic() + within_s
    try:
        while True:
            await asyncio.wait_for(ws.recv(), max(0.01, deadline - time.monotonic()))
    except ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd else None


@asynccontextmanager
async def initialised(address: str, protocol: str, token: str) -> AsyncIterator[ClientConnection]:
    async with connect(f"ws://{address}/graphql", subprotocols=[protocol]) as ws:
        await send(ws, {"type": "connection_init", "payload": {"authorization": f"Bearer {token}"}})
        assert (await receive(ws))["type"] == "connection_ack"
        yield ws


def operation(protocol: str, operation_id: str, query: str, **variables: Any) -> dict[str, Any]:
    kind = "subscribe" if protocol == TRANSPORT_WS else "start"
    payload = {"query": query, "variables": variables}
    return {"id": operation_id, "type": kind, "payload": payload}


async def cli_revoke(token: str, **env: str) -> None:
    """`bettercompute token revoke`, a process of its own."""
    binary = Path(sys.executable).with_name("bettercompute")
    process = await asyncio.create_subprocess_exec(
        str(binary),
        *("token", "revoke", "--token", token),
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    assert orjson.loads(out) == {"revoked": True}


async def revoke_elsewhere(database_url: str, token: str) -> None:
    """Revoked through a database engine of its own, as another process would."""
    other = create_database(database_url)
    try:
        assert await revoke_token(other, token)
    finally:
        await other.dispose()


# --- every operation checks the token again ---------------------------------------------

TRANSPORT_OPERATIONS: dict[str, Callable[[str], tuple[str, dict[str, Any]]]] = {
    "subscription": lambda pool_id: (EVENTS, {}),
    "query": lambda pool_id: (VERSION, {"p": pool_id}),
    "updatePool": lambda pool_id: (
        UPDATE,
        {"i": {"tenantId": "acme", "poolId": pool_id, "gpuModel": "H200"}},
    ),
    "offerPool": lambda pool_id: (
        OFFER,
        {
            "i": {
                "tenantId": "acme",
                "poolId": pool_id,
                "toTenantId": "globex",
                "quota": [{"resource": "gpu", "max": 1}],
            }
        },
    ),
}
# Legacy graphql-ws runs subscriptions only.
CASES = [(TRANSPORT_WS, name) for name in TRANSPORT_OPERATIONS] + [(LEGACY_WS, "subscription")]


@pytest.mark.parametrize(("protocol", "kind"), CASES)
async def test_an_operation_after_the_revocation_is_refused_and_the_socket_closes(
    database_url: str, db: Database, fleet: Fleet, protocol: str, kind: str
) -> None:
    # The watcher would close the socket too; it looks rarely here, so what refuses the
    # operation is the check every operation makes.
    settings = Settings(database_url=database_url, revocation_poll_interval_s=600)
    async with served(settings) as (_, address), http_api(address) as api:
        s = await Scene.start(api, fleet)
        await s.guest("globex")
        pool_id = (await s.pool())["id"]
        query, variables = TRANSPORT_OPERATIONS[kind](pool_id)
        async with initialised(address, protocol, s.token) as ws:
            if kind != "subscription":  # the same operation works before the revocation
                await send(ws, operation(protocol, "before", query, **variables))
                answer = await receive(ws)
                assert (answer["id"], answer["type"]) == ("before", "next"), answer
                assert "errors" not in answer["payload"], answer
                assert (await receive(ws))["type"] == "complete"
            written = len(await events(db))

            await revoke_elsewhere(database_url, s.token)
            await send(ws, operation(protocol, "after", query, **variables))
            refused = await receive(ws)
            assert (refused["id"], refused["type"]) == ("after", "error"), refused
            errors = refused["payload"] if protocol == TRANSPORT_WS else [refused["payload"]]
            assert errors[0]["extensions"]["code"] == "UNAUTHENTICATED"
            assert await close_code(ws) == 4403

        # Nothing ran: no mutation committed (each would have written an event).
        assert len(await events(db)) == written


# --- sockets that only stream are closed -------------------------------------------------


@pytest.mark.parametrize("protocol", BOTH)
async def test_a_streaming_socket_closes_4403_soon_after_the_cli_revokes_its_token(
    database_url: str, fleet: Fleet, protocol: str
) -> None:
    settings = Settings(database_url=database_url, revocation_poll_interval_s=0.2)
    async with served(settings) as (_, address), http_api(address) as api:
        s = await Scene.start(api, fleet)
        doomed = await fleet.caller("acme", "viewer")
        async with (
            initialised(address, protocol, doomed) as ws,
            initialised(address, protocol, s.token) as other,
        ):
            await send(ws, operation(protocol, "1", EVENTS))
            await send(other, operation(protocol, "1", EVENTS))
            # The default memory:// broker reaches no other process: the watcher's poll
            # finds the revocation the CLI wrote.
            await cli_revoke(doomed, BETTERCOMPUTE_DATABASE_URL=database_url)
            assert await close_code(ws) == 4403

            # The other token's socket still streams.
            await s.pool()
            delivered = await receive(other)
            assert delivered["type"] in ("next", "data"), delivered
            assert delivered["payload"]["data"]["poolEvents"]["type"] == "pool.created"


@pytest.mark.parametrize("broker", ["redis", "postgres"])
@pytest.mark.parametrize("dialect", ["postgresql"])  # several processes share PostgreSQL
async def test_one_revocation_closes_its_sockets_on_every_process(
    database_url: str, db: Database, redis_url: str, broker: str
) -> None:
    if broker == "postgres":  # LISTEN/NOTIFY on the same server, never through PgBouncer
        postgres = make_url(direct_url(database_url)).set(drivername="postgresql")
        broadcast_url = postgres.render_as_string(hide_password=False)
    else:
        broadcast_url = redis_url
    fleet = Fleet(db)
    await fleet.tenant("acme")
    doomed = await fleet.caller("acme", "viewer")
    env = {
        "BETTERCOMPUTE_DATABASE_URL": database_url,
        "BETTERCOMPUTE_BROADCAST_URL": broadcast_url,
        # Far longer than the test waits: what closes the sockets is the CLI's wake-up.
        "BETTERCOMPUTE_REVOCATION_POLL_SECONDS": "120",
    }
    async with AsyncExitStack() as stack:
        servers = await asyncio.gather(
            stack.enter_async_context(bettercompute_serve(**env)),
            stack.enter_async_context(bettercompute_serve(**env)),
        )
        sockets = []
        for served_process in servers:
            for protocol in BOTH:
                ws = await stack.enter_async_context(
                    initialised(served_process.address, protocol, doomed)
                )
                await send(ws, operation(protocol, "1", EVENTS))
                sockets.append(ws)

        await cli_revoke(doomed, **env)
        codes = await asyncio.gather(*(close_code(ws) for ws in sockets))
        assert codes == [4403] * len(sockets)
