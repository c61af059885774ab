"""Queries sent over a websocket that also carries a long-lived subscription: each
operation reads through its own scope, so it sees fresh data and returns its connection
when it ends, not when the subscription does."""

from __future__ import annotations

import asyncio
from typing import Any

from gql import Client, GraphQLRequest
from gql.transport.websockets import WebsocketsTransport

from app.config import Settings
from tests.events.conftest import served
from tests.events.support import wait_until
from tests.events.test_websocket import http_api
from tests.rest.scene import Scene
from tests.support import Api, Fleet

VERSION = "query($t: String!, $p: ID!) { pool(tenantId: $t, poolId: $p) { version } }"
EVENTS = "subscription($t: String!) { poolEvents(tenantId: $t) { cursor type } }"


async def test_queries_beside_a_subscription_read_fresh_and_let_go(
    database_url: str, fleet: Fleet
) -> None:
    async with (
        served(Settings(database_url=database_url)) as (app, address),
        http_api(address) as api,
    ):
        s = await Scene.start(api, fleet)
        pool_id = (await s.pool())["id"]
        reader_pool: Any = app.state.capacity.db.reader.pool
        transport = WebsocketsTransport(
            url=f"ws://{address}/graphql",
            init_payload={"authorization": f"Bearer {s.token}"},
            subprotocols=[WebsocketsTransport.GRAPHQLWS_SUBPROTOCOL],
        )
        async with Client(transport=transport) as session:
            events: list[str] = []

            async def follow() -> None:
                async for result in session.subscribe(
                    GraphQLRequest(EVENTS, variable_values={"t": "acme"})
                ):
                    events.append(result["poolEvents"]["type"])

            following = asyncio.create_task(follow())
            try:
                variables = {"t": "acme", "p": pool_id}
                first = await session.execute(GraphQLRequest(VERSION, variable_values=variables))
                assert first["pool"]["version"] == 1
                await wait_until(lambda: reader_pool.checkedout() == 0, within_s=5)

                await update(api, s.token, pool_id)
                await wait_until(lambda: events == ["pool.updated"], within_s=10)
                second = await session.execute(GraphQLRequest(VERSION, variable_values=variables))
                assert second["pool"]["version"] == 2  # not the first query's cached answer
                await wait_until(lambda: reader_pool.checkedout() == 0, within_s=5)
            finally:
                following.cancel()
                await asyncio.gather(following, return_exceptions=True)


async def update(api: Api, token: str, pool_id: str) -> None:
    body = {"tenantId": "acme", "poolId": pool_id, "gpuModel": "H200"}
    await api.ok(token, "pools/update", body)
