"""`/metrics`: after REST, GraphQL and websocket traffic the figures moved as they should."""

from __future__ import annotations

import json

import httpx
import websockets

from app.config import Settings
from app.ids import new_id
from tests.events.conftest import served
from tests.events.support import wait_until
from tests.operability.scrape import scrape, value
from tests.rest.scene import Scene
from tests.support import Api, Fleet

REQUESTS = "bettercompute_request_duration_seconds_count"
ERRORS = "bettercompute_errors_total"


async def test_metrics_move_with_traffic(database_url: str, fleet: Fleet) -> None:
    async with (
        served(Settings(database_url=database_url)) as (app, address),
        httpx.AsyncClient(base_url=f"http://{address}") as client,
    ):
        api = Api(client)
        scene = await Scene.start(api, fleet)
        before = await scrape(client)
        pool = await scene.pool()
        await api.ok(scene.token, "pools/get", scene.body(pool["id"]))
        _, error = await api.fails(scene.token, "pools/get", scene.body(new_id("pool")))
        assert error["code"] == "NOT_FOUND"
        for _ in range(3):
            answer = await client.post(
                "/graphql",
                json={"query": "query Dashboard { __typename }"},
                headers={"authorization": f"Bearer {scene.token}"},
            )
            assert answer.json()["data"] == {"__typename": "Query"}
        refused = await client.post(
            "/graphql", json={"query": "{ __typename }"}, headers={"authorization": "Bearer x"}
        )
        assert refused.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"

        # A websocket with one live subscription.
        async with websockets.connect(
            f"ws://{address}/graphql", subprotocols=["graphql-transport-ws"]
        ) as ws:
            payload = {"authorization": f"Bearer {scene.token}"}
            await ws.send(json.dumps({"type": "connection_init", "payload": payload}))
            assert json.loads(await ws.recv())["type"] == "connection_ack"
            query = 'subscription { poolEvents(tenantId: "acme") { type } }'
            await ws.send(json.dumps({"id": "1", "type": "subscribe", "payload": {"query": query}}))
            await wait_until(lambda: app.state.relay.subscriptions == 1)
            during = await scrape(client)
            assert value(during, "bettercompute_websockets_open") >= 1
            assert value(during, "bettercompute_subscriptions_open") == 1
        relay = app.state.relay
        await wait_until(lambda: relay.lag == 0 and relay.subscriptions == 0)
        after = await scrape(client)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved(REQUESTS, transport="rest", operation="pools/create") == 1
    assert moved(REQUESTS, transport="rest", operation="pools/get") == 2
    assert moved(REQUESTS, transport="graphql", operation="Dashboard") == 3
    assert moved(ERRORS, transport="rest", code="NOT_FOUND") == 1
    assert moved(ERRORS, transport="graphql", code="UNAUTHENTICATED") == 1
    assert moved("bettercompute_db_transactions_total", outcome="commit") >= 1  # the create
    # The create and the two gets each read or write their pool, under their transport.
    assert moved("bettercompute_db_statements_total", transport="rest") >= 3
    assert moved("bettercompute_relay_delivery_seconds_count") >= 1  # its event
    assert value(after, "bettercompute_outbox_lag_events") == 0
    assert value(after, "bettercompute_broker_connected") == 1
    assert value(after, "bettercompute_subscriptions_open") == 0
    assert ("bettercompute_db_connections_in_use", frozenset({("role", "writer")})) in after
    duration = "bettercompute_request_duration_seconds_sum"
    assert moved(duration, transport="rest", operation="pools/get") > 0
