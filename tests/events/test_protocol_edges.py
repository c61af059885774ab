"""Protocol edges with a raw websocket client against a real uvicorn server: each gets
its protocol's answer (docs/events.md)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest
import pytest_asyncio
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from app.config import Settings
from tests.databases import empty_tables
from tests.events.conftest import served
from tests.support import Fleet

TRANSPORT_WS = "graphql-transport-ws"
LEGACY_WS = "graphql-ws"
BOTH = [TRANSPORT_WS, LEGACY_WS]
SUBSCRIBE = 'subscription { poolEvents(tenantId: "acme") { cursor type } }'


@pytest_asyncio.fixture(loop_scope="session")
async def server(
    database_url_for: Callable[[str], Awaitable[str]],
) -> AsyncIterator[tuple[str, str]]:
    """One SQLite-backed server with tight limits for every edge: (address, a token)."""
    url = await database_url_for("sqlite")
    await empty_tables(url)
    settings = Settings(
        database_url=url,
        connection_init_timeout_s=0.5,
        max_subscriptions_per_connection=2,
        keepalive_interval_s=0.2,
        allowed_origins=("https://console.example",),
    )
    async with served(settings) as (app, address):
        fleet = Fleet(app.state.capacity.db)
        await fleet.tenant("acme")
        yield address, await fleet.caller("acme", "viewer")


async def send(ws: ClientConnection, message: dict[str, Any]) -> None:
    await ws.send(orjson.dumps(message).decode())


async def receive(ws: ClientConnection, skip_keepalive: bool = True) -> dict[str, Any]:
    async with asyncio.timeout(10):  # keep-alives alone never satisfy it
        while True:
            message: dict[str, Any] = orjson.loads(await ws.recv())
            if not (skip_keepalive and message["type"] in ("ka", "ping", "pong")):
                return message


async def closed_with(ws: ClientConnection) -> int | None:
    """The close code the server sent, reading whatever came before it."""
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await asyncio.wait_for(ws.recv(), 5)
    return closed.value.rcvd.code if closed.value.rcvd else None


def subscribe_message(protocol: str, operation_id: str) -> dict[str, Any]:
    kind = "subscribe" if protocol == TRANSPORT_WS else "start"
    return {"id": operation_id, "type": kind, "payload": {"query": SUBSCRIBE}}


def init(token: str | None) -> dict[str, Any]:
    payload = {"authorization": f"Bearer {token}"} if token else {}
    return {"type": "connection_init", "payload": payload}


@pytest.mark.parametrize("protocol", BOTH)
async def test_no_connection_init_in_time_closes_4408(
    server: tuple[str, str], protocol: str
) -> None:
    address, _ = server
    async with connect(f"ws://{address}/graphql", subprotocols=[protocol]) as ws:
        assert await closed_with(ws) == 4408


@pytest.mark.parametrize("protocol", BOTH)
async def test_a_second_connection_init_closes_4429(server: tuple[str, str], protocol: str) -> None:
    address, token = server
    async with connect(f"ws://{address}/graphql", subprotocols=[protocol]) as ws:
        await send(ws, init(token))
        assert (await receive(ws))["type"] == "connection_ack"
        await send(ws, init(token))
        assert await closed_with(ws) == 4429


@pytest.mark.parametrize("protocol", BOTH)
async def test_subscribing_before_the_ack_closes_4401(
    server: tuple[str, str], protocol: str
) -> None:
    address, _ = server
    async with connect(f"ws://{address}/graphql", subprotocols=[protocol]) as ws:
        await send(ws, subscribe_message(protocol, "1"))
        assert await closed_with(ws) == 4401


@pytest.mark.parametrize("protocol", BOTH)
@pytest.mark.parametrize("token", ["bct_not-a-token", None])
async def test_a_bad_or_missing_token_closes_4403_before_anything_streams(
    server: tuple[str, str], protocol: str, token: str | None
) -> None:
    address, _ = server
    async with connect(f"ws://{address}/graphql", subprotocols=[protocol]) as ws:
        await send(ws, init(token))
        if protocol == LEGACY_WS:  # the legacy protocol says why first
            error = await receive(ws)
            assert error["type"] == "connection_error"
            assert error["payload"]["extensions"]["code"] == "UNAUTHENTICATED"
        assert await closed_with(ws) == 4403


@pytest.mark.parametrize("protocol", BOTH)
async def test_the_token_may_come_in_the_upgrade_header(
    server: tuple[str, str], protocol: str
) -> None:
    address, token = server
    async with connect(
        f"ws://{address}/graphql",
        subprotocols=[protocol],
        additional_headers={"authorization": f"Bearer {token}"},
    ) as ws:
        await send(ws, {"type": "connection_init"})
        assert (await receive(ws))["type"] == "connection_ack"


@pytest.mark.parametrize("protocol", BOTH)
async def test_one_subscription_over_the_limit_is_refused_and_the_others_stay(
    server: tuple[str, str], protocol: str
) -> None:
    address, token = server
    async with connect(f"ws://{address}/graphql", subprotocols=[protocol]) as ws:
        await send(ws, init(token))
        assert (await receive(ws))["type"] == "connection_ack"
        for operation_id in ("1", "2", "3"):
            await send(ws, subscribe_message(protocol, operation_id))
        refused = await receive(ws)
        assert (refused["type"], refused["id"]) == ("error", "3")
        errors = refused["payload"] if protocol == TRANSPORT_WS else [refused["payload"]]
        assert errors[0]["extensions"]["code"] == "RESOURCE_EXHAUSTED"
        # The connection is still up.
        if protocol == TRANSPORT_WS:
            await send(ws, {"type": "ping"})
            assert (await receive(ws, skip_keepalive=False))["type"] == "pong"
        else:
            assert (await receive(ws, skip_keepalive=False))["type"] == "ka"


async def test_the_legacy_protocol_sends_keepalives(server: tuple[str, str]) -> None:
    address, token = server
    async with connect(f"ws://{address}/graphql", subprotocols=[LEGACY_WS]) as ws:
        await send(ws, init(token))
        assert (await receive(ws))["type"] == "connection_ack"
        kinds = [(await receive(ws, skip_keepalive=False))["type"] for _ in range(3)]
        assert kinds == ["ka", "ka", "ka"]


async def test_an_unlisted_browser_origin_is_refused(server: tuple[str, str]) -> None:
    address, _ = server
    with pytest.raises(InvalidStatus) as refused:
        async with connect(
            f"ws://{address}/graphql",
            subprotocols=[TRANSPORT_WS],
            origin="https://evil.example",
        ):
            pass
    assert refused.value.response.status_code == 403
    async with connect(
        f"ws://{address}/graphql",
        subprotocols=[TRANSPORT_WS],
        origin="https://console.example",
    ) as ws:
        await send(ws, {"type": "ping"})
        assert (await receive(ws, skip_keepalive=False))["type"] == "pong"


def malformed(protocol: str) -> dict[str, Any]:
    """Messages of shapes the protocol does not define, by what is wrong with them."""
    kind, stop = ("subscribe", "complete") if protocol == TRANSPORT_WS else ("start", "stop")
    good = {"query": SUBSCRIBE}
    return {
        "array": [{"type": kind, "id": "1", "payload": good}],
        "string": "ping",
        "number": 5,
        "null": None,
        "type-not-a-string": {"type": 5},
        "no-id": {"type": kind, "payload": good},
        "object-id": {"type": kind, "id": {"a": 1}, "payload": good},
        "stop-with-object-id": {"type": stop, "id": {"a": 1}},
        "string-payload": {"type": kind, "id": "1", "payload": "subscription { x }"},
        "no-payload": {"type": kind, "id": "1"},
        "number-query": {"type": kind, "id": "1", "payload": {"query": 5}},
        "string-variables": {"type": kind, "id": "1", "payload": {**good, "variables": "{}"}},
        "number-operation-name": {
            "type": kind,
            "id": "1",
            "payload": {**good, "operationName": 5},
        },
    }


MALFORMED_NAMES = list(malformed(TRANSPORT_WS))


@pytest.mark.parametrize("name", MALFORMED_NAMES)
async def test_a_malformed_message_closes_graphql_transport_ws_with_4400(
    server: tuple[str, str], name: str
) -> None:
    address, token = server
    async with connect(f"ws://{address}/graphql", subprotocols=[TRANSPORT_WS]) as ws:
        await send(ws, init(token))
        assert (await receive(ws))["type"] == "connection_ack"
        await ws.send(orjson.dumps(malformed(TRANSPORT_WS)[name]).decode())
        assert await closed_with(ws) == 4400


@pytest.mark.parametrize("name", [*MALFORMED_NAMES, "unknown-type"])
async def test_a_malformed_message_on_graphql_ws_gets_an_error_and_the_socket_stays(
    server: tuple[str, str], name: str
) -> None:
    address, token = server
    message = malformed(LEGACY_WS).get(name, {"type": "subscribe", "id": "1"})
    async with connect(f"ws://{address}/graphql", subprotocols=[LEGACY_WS]) as ws:
        await send(ws, init(token))
        assert (await receive(ws))["type"] == "connection_ack"
        await ws.send(orjson.dumps(message).decode())
        error = await receive(ws)
        assert error["type"] == "error", error
        assert error["payload"]["extensions"]["code"] == "INVALID_INPUT"
        sent_id = message.get("id") if isinstance(message, dict) else None
        assert error["id"] == (sent_id if isinstance(sent_id, str) else None)
        # The connection carries on: it answers the next message, and keeps alive.
        await ws.send(orjson.dumps(message).decode())
        assert (await receive(ws))["type"] == "error"
        assert (await receive(ws, skip_keepalive=False))["type"] == "ka"


@pytest.mark.parametrize("protocol", BOTH)
async def test_a_document_of_several_operations_runs_the_one_named(
    server: tuple[str, str], protocol: str
) -> None:
    """As over HTTP (GraphQL spec, GetOperation): the named one runs (here A, refused for a
    tenant the caller may not act for), and without a name the document is refused rather
    than its first operation run."""
    address, token = server
    document = (
        'subscription A { poolEvents(tenantId: "elsewhere") { cursor } } '
        'subscription B { poolEvents(tenantId: "acme") { cursor } }'
    )
    kind = "subscribe" if protocol == TRANSPORT_WS else "start"
    async with connect(f"ws://{address}/graphql", subprotocols=[protocol]) as ws:
        await send(ws, init(token))
        assert (await receive(ws))["type"] == "connection_ack"
        named = {"query": document, "operationName": "A"}
        await send(ws, {"id": "named", "type": kind, "payload": named})
        assert _error_codes(await receive(ws)) == [("named", "PERMISSION_DENIED")]
        assert (await receive(ws))["type"] == "complete"

        await send(ws, {"id": "unnamed", "type": kind, "payload": {"query": document}})
        refused = await receive(ws)
        assert _error_codes(refused) == [("unnamed", "INVALID_INPUT")]
        (error,) = _errors(refused)
        assert error["message"] == (
            "Must provide operation name if query contains multiple operations."
        )


def _errors(message: dict[str, Any]) -> list[dict[str, Any]]:
    """An operation's errors: in `error` (a refusal) or in `next`/`data` (a result)."""
    if message["type"] == "error":
        payload = message["payload"]
        return payload if isinstance(payload, list) else [payload]
    errors: list[dict[str, Any]] = message["payload"]["errors"]
    return errors


def _error_codes(message: dict[str, Any]) -> list[tuple[str, str]]:
    return [(message["id"], e["extensions"]["code"]) for e in _errors(message)]


@pytest.mark.parametrize("protocol", BOTH)
async def test_a_query_over_either_protocol_answers_once_and_completes(
    server: tuple[str, str], protocol: str
) -> None:
    """A query (not a subscription) sent over a websocket gets its one result, then
    `complete`; a mutation too: both protocols carry any operation."""
    address, token = server
    kind = "subscribe" if protocol == TRANSPORT_WS else "start"
    data = "next" if protocol == TRANSPORT_WS else "data"
    async with connect(f"ws://{address}/graphql", subprotocols=[protocol]) as ws:
        await send(ws, init(token))
        assert (await receive(ws))["type"] == "connection_ack"
        query = {"query": 'query { pools(tenantId: "acme") { nodes { id } } }'}
        await send(ws, {"id": "q", "type": kind, "payload": query})
        answer = await receive(ws)
        assert answer["type"] == data, answer
        assert answer["payload"] == {"data": {"pools": {"nodes": []}}}, answer
        assert (await receive(ws)) == {"id": "q", "type": "complete"}
