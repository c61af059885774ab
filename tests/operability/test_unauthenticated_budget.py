"""Requests without a valid token are bounded per client address, before their token
costs a database lookup (app/http/address_budget.py): on by default, a table of bounded
size, IPv6 keyed by /64, `X-Forwarded-For` believed from trusted proxies only. The real
app over ASGI (its peer address set per client), both dialects."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from prometheus_client import REGISTRY
from starlette.applications import Starlette
from websockets.asyncio.client import connect

from app.config import Settings
from app.http.admission import Admission
from app.ids import new_id
from app.server import create_app
from tests.events.conftest import served
from tests.events.test_protocol_edges import LEGACY_WS, init, receive, send
from tests.rest.scene import Scene
from tests.support import Api, Fleet

GET = "/api/compute/pools/get"
BAD = "Bearer bct_" + "x" * 43  # well formed, unknown: each one a lookup before the fix


@asynccontextmanager
async def app_for(settings: Settings) -> AsyncIterator[Starlette]:
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        yield application


@asynccontextmanager
async def client_at(app: Starlette, host: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client whose requests come from `host` (the ASGI peer address)."""
    transport = httpx.ASGITransport(app=app, client=(host, 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        yield client


async def get(
    client: httpx.AsyncClient, authorization: str | None, **headers: str
) -> httpx.Response:
    if authorization is not None:
        headers["authorization"] = authorization
    body = {"tenantId": "acme", "poolId": new_id("pool")}
    return await client.post(GET, json=body, headers=headers)


def rest_statements() -> float:
    found = REGISTRY.get_sample_value("bettercompute_db_statements_total", {"transport": "rest"})
    return found or 0.0


async def test_a_burst_of_bad_tokens_is_refused_before_any_lookup(
    database_url: str, fleet: Fleet
) -> None:
    """The default settings: 50 at once per address, then 429 with no lookup."""
    defaults = Settings()
    assert (defaults.unauthenticated_burst, defaults.unauthenticated_per_s) == (50, 0.5)
    async with app_for(Settings(database_url=database_url)) as app:
        async with client_at(app, "192.0.2.10") as client:
            scene = await Scene.start(Api(client), fleet)
            good = await get(client, f"Bearer {scene.token}")  # known to this process
            assert good.status_code == 404
            statuses: list[int] = []
            refused: list[dict[str, Any]] = []
            looked_up = 0.0
            for _ in range(60):
                before = rest_statements()
                response = await get(client, BAD)
                statuses.append(response.status_code)
                if response.status_code == 429:
                    looked_up += rest_statements() - before
                    refused.append(response.json()["error"])
                    assert int(response.headers["retry-after"]) >= 1
            assert statuses.count(429) >= 5, statuses
            assert set(statuses) == {401, 429}, statuses
            assert statuses.index(429) >= 50 - 2, statuses  # the burst, then refusals
            assert looked_up == 0  # refused before the token cost a statement
            assert {e["code"] for e in refused} == {"RESOURCE_EXHAUSTED"}
            assert {e["details"]["budget"] for e in refused} == {"unauthenticated"}
            # No token at all is refused alike, on GraphQL too (429, its error shape).
            assert (await get(client, None)).status_code == 429
            graphql = await client.post("/graphql", json={"query": "{ __typename }"})
            assert graphql.status_code == 429, graphql.text
            assert graphql.json()["errors"][0]["extensions"]["code"] == "RESOURCE_EXHAUSTED"
            # A token that authenticated lately still works from that address...
            assert (await get(client, f"Bearer {scene.token}")).status_code == 404
        # ...and every other address has its own allowance.
        async with client_at(app, "192.0.2.11") as other:
            assert (await get(other, BAD)).status_code == 401


async def test_the_table_stays_bounded_and_ipv6_counts_by_its_64(database_url: str) -> None:
    settings = Settings(
        database_url=database_url,
        unauthenticated_burst=2,
        unauthenticated_max_addresses=100,
        trusted_proxies=("127.0.0.1",),
    )
    async with app_for(settings) as app:
        admission: Admission = app.state.admission
        async with client_at(app, "127.0.0.1") as proxy:
            for n in range(1000):
                address = f"10.{n // 65536}.{n // 256 % 256}.{n % 256}"
                assert (await get(proxy, None, **{"x-forwarded-for": address})).status_code == 401
        assert len(admission.addresses) <= 100
        # Two hosts of one /64 share an allowance; the next /64 has its own.
        async with (
            client_at(app, "2001:db8:0:1::1") as one,
            client_at(app, "2001:db8:0:1:ffff::2") as same,
            client_at(app, "2001:db8:0:2::1") as next_64,
        ):
            assert [(await get(one, BAD)).status_code for _ in range(2)] == [401, 401]
            assert (await get(same, BAD)).status_code == 429
            assert (await get(next_64, BAD)).status_code == 401
        assert len(admission.addresses) <= 100


async def test_x_forwarded_for_is_believed_from_a_trusted_proxy_only(database_url: str) -> None:
    settings = Settings(
        database_url=database_url, unauthenticated_burst=3, trusted_proxies=("10.0.0.0/24",)
    )
    async with app_for(settings) as app:
        async with client_at(app, "10.0.0.7") as trusted:
            # The client the proxy saw is the rightmost untrusted hop; whatever the
            # client wrote itself further left is not believed.
            for n in range(3):
                chain = f"198.51.100.{n}, 203.0.113.5, 10.0.0.3"
                assert (await get(trusted, BAD, **{"x-forwarded-for": chain})).status_code == 401
            spent = await get(trusted, BAD, **{"x-forwarded-for": "203.0.113.5"})
            assert spent.status_code == 429
            fresh = await get(trusted, BAD, **{"x-forwarded-for": "203.0.113.6"})
            assert fresh.status_code == 401  # another client behind the same proxy
        async with client_at(app, "192.0.2.50") as untrusted:
            statuses = [
                (
                    await get(untrusted, BAD, **{"x-forwarded-for": f"203.0.113.{100 + n}"})
                ).status_code
                for n in range(4)
            ]
            assert statuses == [401, 401, 401, 429]  # its own address, whatever it claims


async def test_a_new_token_from_a_spent_address_waits_but_costs_no_lookup(
    database_url: str, fleet: Fleet
) -> None:
    """The price of the bound: a valid token this process has not seen, from an address
    that spent its allowance, is refused too (and told when to retry)."""
    settings = Settings(database_url=database_url, unauthenticated_burst=1)
    async with app_for(settings) as app, client_at(app, "192.0.2.20") as client:
        await fleet.tenant("acme")
        token = await fleet.caller("acme", "viewer")
        assert (await get(client, BAD)).status_code == 401
        refused = await get(client, f"Bearer {token}")
        assert refused.status_code == 429
        assert refused.json()["error"]["details"]["budget"] == "unauthenticated"
        async with client_at(app, "192.0.2.21") as elsewhere:
            assert (await get(elsewhere, f"Bearer {token}")).status_code == 404


async def test_websocket_connections_with_bad_tokens_spend_the_allowance(
    database_url: str,
) -> None:
    """graphql-ws tells why in its connection_error (graphql-transport-ws closes 4403)."""
    settings = Settings(database_url=database_url, unauthenticated_burst=2)
    async with served(settings) as (_, address):
        codes = []
        for _ in range(3):
            async with connect(f"ws://{address}/graphql", subprotocols=[LEGACY_WS]) as ws:
                await send(ws, init("bct_" + "x" * 43))
                message = await receive(ws)
                assert message["type"] == "connection_error", message
                codes.append(message["payload"]["extensions"]["code"])
        assert codes == ["UNAUTHENTICATED", "UNAUTHENTICATED", "RESOURCE_EXHAUSTED"]
