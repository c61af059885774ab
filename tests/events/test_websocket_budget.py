"""The caller's request budget (app/rate_limit.py) reaches websocket operations: each
subscribe/start, query or mutation over either protocol is one request of the caller,
as over HTTP (app/http/admission.py). Past the budget an operation gets an `error`
message for its id with RESOURCE_EXHAUSTED (CONTRACT section 3) and the socket stays
open. A real uvicorn server, raw websocket clients, both dialects."""

from __future__ import annotations

from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from app.config import Settings
from app.ids import new_id
from tests.events.conftest import served
from tests.events.test_protocol_edges import BOTH, LEGACY_WS, TRANSPORT_WS, init, receive, send
from tests.events.test_websocket import http_api
from tests.rest.scene import Scene
from tests.support import Fleet

POOLS = 'query { pools(tenantId: "acme", first: 1) { nodes { id } } }'
EVENTS = 'subscription { poolEvents(tenantId: "acme") { cursor type } }'


def operation(protocol: str, operation_id: str, query: str) -> dict[str, Any]:
    kind = "subscribe" if protocol == TRANSPORT_WS else "start"
    return {"id": operation_id, "type": kind, "payload": {"query": query}}


async def answer(ws: ClientConnection, operation_id: str) -> dict[str, Any]:
    """The first message for `operation_id` (`next`/`data` or `error`)."""
    while True:
        message = await receive(ws)
        if message.get("id") == operation_id:
            return message


def refusal(protocol: str, message: dict[str, Any]) -> dict[str, Any]:
    assert message["type"] == "error", message
    payload = message["payload"]
    error: dict[str, Any] = payload[0] if protocol == TRANSPORT_WS else payload
    return error


async def still_open(ws: ClientConnection, protocol: str) -> None:
    """The socket answers: a ping's pong (graphql-transport-ws); an unknown message's
    `error` (graphql-ws, which has no ping)."""
    if protocol == TRANSPORT_WS:
        await send(ws, {"type": "ping"})
        assert (await receive(ws, skip_keepalive=False))["type"] == "pong"
    else:
        await send(ws, {"type": "nonsense"})
        assert (await receive(ws))["type"] == "error"


@pytest.mark.parametrize("protocol", BOTH)
async def test_a_caller_answered_429_over_http_is_refused_over_websockets(
    database_url: str, fleet: Fleet, protocol: str
) -> None:
    settings = Settings(database_url=database_url, rate_limit_requests=3)
    async with served(settings) as (_, address), http_api(address) as api:
        scene = await Scene.start(api, fleet)
        body = scene.body(new_id("pool"))
        statuses = [(await api.post(scene.token, "pools/get", body)).status_code for _ in range(4)]
        assert statuses == [404, 404, 404, 429]
        async with connect(f"ws://{address}/graphql", subprotocols=[protocol]) as ws:
            await send(ws, init(scene.token))  # not an operation: not charged, not refused
            assert (await receive(ws))["type"] == "connection_ack"
            for n, query in enumerate((POOLS, EVENTS, POOLS)):
                await send(ws, operation(protocol, f"op{n}", query))
                error = refusal(protocol, await answer(ws, f"op{n}"))
                assert error["extensions"]["code"] == "RESOURCE_EXHAUSTED", error
                assert error["extensions"]["limit"] == "rate"
                assert error["extensions"]["budget"] == "requests"
                assert error["extensions"]["retryAfterSeconds"] >= 1
                await still_open(ws, protocol)


async def test_operations_over_websockets_spend_the_budget_http_requests_spend(
    database_url: str, fleet: Fleet
) -> None:
    """One budget per caller, whatever the transport: operations over both protocols
    spend it, and HTTP is then refused."""
    settings = Settings(database_url=database_url, rate_limit_requests=4)
    async with served(settings) as (_, address), http_api(address) as api:
        scene = await Scene.start(api, fleet)
        token = await fleet.caller("acme", "viewer")  # a budget of its own
        answers: list[str] = []
        for protocol in (TRANSPORT_WS, LEGACY_WS):
            async with connect(f"ws://{address}/graphql", subprotocols=[protocol]) as ws:
                await send(ws, init(token))
                assert (await receive(ws))["type"] == "connection_ack"
                for n in range(3 if protocol == TRANSPORT_WS else 2):
                    await send(ws, operation(protocol, f"q{n}", POOLS))
                    message = await answer(ws, f"q{n}")
                    answers.append(
                        "data"
                        if message["type"] in ("next", "data")
                        else refusal(protocol, message)["extensions"]["code"]
                    )
        assert answers == ["data", "data", "data", "data", "RESOURCE_EXHAUSTED"]
        refused = await api.post(token, "pools/get", scene.body(new_id("pool")))
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "RESOURCE_EXHAUSTED"


@pytest.mark.parametrize("protocol", BOTH)
async def test_the_cost_budget_spent_over_http_refuses_websocket_operations(
    database_url: str, fleet: Fleet, protocol: str
) -> None:
    settings = Settings(database_url=database_url, rate_limit_cost=20)
    async with served(settings) as (_, address), http_api(address) as api:
        await Scene.start(api, fleet)
        token = await fleet.caller("acme", "viewer")
        headers = {"authorization": f"Bearer {token}"}
        statuses: list[int] = []
        while not statuses or statuses[-1] != 429:
            assert len(statuses) < 25, statuses
            response = await api.client.post("/graphql", json={"query": POOLS}, headers=headers)
            statuses.append(response.status_code)
        async with connect(f"ws://{address}/graphql", subprotocols=[protocol]) as ws:
            await send(ws, init(token))
            assert (await receive(ws))["type"] == "connection_ack"
            await send(ws, operation(protocol, "q", POOLS))
            error = refusal(protocol, await answer(ws, "q"))
            assert error["extensions"]["code"] == "RESOURCE_EXHAUSTED", error
            assert error["extensions"]["budget"] == "cost"
            await still_open(ws, protocol)
