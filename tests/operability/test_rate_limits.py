"""The per-caller budget: requests and GraphQL cost per window, RESOURCE_EXHAUSTED with
HTTP 429, Retry-After and X-RateLimit-* headers; shared through Redis across processes
(here: two apps on one Redis); `extensions.cost` reports each GraphQL query's cost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from graphql import parse
from prometheus_client import REGISTRY

from app.compat import graphql_core_schema
from app.config import Settings
from app.ids import new_id
from schema.app import build_schema
from schema.limits import cost_errors
from tests.events.brokers import PrivateRedis
from tests.events.conftest import running
from tests.rest.scene import Scene
from tests.support import Fleet

POOLS = "query Pools($t: String!) { pools(tenantId: $t, first: 5) { nodes { id } } }"


async def test_a_caller_past_its_request_budget_is_refused_on_both_transports(
    database_url: str, fleet: Fleet
) -> None:
    settings = Settings(database_url=database_url, rate_limit_requests=3)
    async with running(settings) as (_, api):
        scene = await Scene.start(api, fleet)
        other = await fleet.caller("acme", "admin")
        body = scene.body(new_id("pool"))
        for used in range(1, 4):
            response = await api.post(scene.token, "pools/get", body)
            assert response.status_code == 404  # answered, and counted
            assert response.headers["x-ratelimit-limit"] == "3"
            assert response.headers["x-ratelimit-remaining"] == str(3 - used)
            assert response.headers["x-ratelimit-used"] == str(used)
            assert int(response.headers["x-ratelimit-reset"]) > 0
        refused = await api.post(scene.token, "pools/get", body)
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert error["code"] == "RESOURCE_EXHAUSTED"
        assert error["details"]["limit"] == "rate"
        assert 1 <= int(refused.headers["retry-after"]) <= 61
        assert refused.headers["x-ratelimit-remaining"] == "0"
        graphql = await api.client.post(
            "/graphql",
            json={"query": POOLS, "variables": {"t": "acme"}},
            headers={"authorization": f"Bearer {scene.token}"},
        )
        assert graphql.status_code == 429
        assert graphql.json()["errors"][0]["extensions"]["code"] == "RESOURCE_EXHAUSTED"
        assert "retry-after" in graphql.headers
        # Per caller: another caller of the same tenant still has its budget.
        assert (await api.post(other, "pools/get", body)).status_code == 404


def _estimated(query: str, variables: dict[str, object]) -> int:
    costs: dict[str | None, int] = {}
    schema = graphql_core_schema(build_schema(Settings()))
    cost_errors(schema, parse(query), variables, 10**9, costs)
    (cost,) = costs.values()
    return cost


async def test_graphql_reports_cost_and_spends_the_cost_budget(
    database_url: str, fleet: Fleet
) -> None:
    settings = Settings(database_url=database_url, rate_limit_cost=100)
    async with running(settings) as (_, api):
        scene = await Scene.start(api, fleet)
        headers = {"authorization": f"Bearer {scene.token}"}

        async def pools() -> tuple[int, dict[str, object], dict[str, str]]:
            response = await api.client.post(
                "/graphql", json={"query": POOLS, "variables": {"t": "acme"}}, headers=headers
            )
            return response.status_code, response.json(), dict(response.headers)

        status, first, head = await pools()
        assert status == 200 and "errors" not in first
        cost = first["extensions"]["cost"]  # type: ignore[index]
        assert cost == _estimated(POOLS, {"t": "acme"}) > 1  # the limits' own figure
        assert head["x-ratelimit-resource"] == "cost"
        assert head["x-ratelimit-used"] == str(cost)
        spent = cost
        while spent + cost <= 100:
            status, _, _ = await pools()
            assert status == 200
            spent += cost
        status, refused, head = await pools()
        assert status == 429
        assert refused["data"] is None
        assert refused["errors"][0]["extensions"]["code"] == "RESOURCE_EXHAUSTED"  # type: ignore[index]
        assert int(head["retry-after"]) >= 1
        # REST is not charged cost (no budget of requests is set).
        assert (await api.post(scene.token, "pools/list", {"tenantId": "acme"})).status_code == 200


async def test_budgets_are_shared_through_redis(
    database_url: str, redis_url: str, fleet: Fleet
) -> None:
    # Each run's caller is new: its own key in Redis.
    settings = Settings(
        database_url=database_url,
        rate_limit_requests=4,
        rate_limit_storage_url=redis_url,
        rate_limit_store_timeout_s=2.0,  # the shared Redis on a busy machine: no fail-open here
    )
    async with running(settings) as (_, one), running(settings) as (_, two):
        scene = await Scene.start(one, fleet)
        token = scene.token
        body = {"tenantId": "acme", "poolId": new_id("pool")}
        answers = [
            (await api.post(token, "pools/get", body)).status_code
            for api in (one, two, one, two, one, two)
        ]
        assert answers == [404, 404, 404, 404, 429, 429]


@asynccontextmanager
async def silent_listener() -> AsyncIterator[int]:
    """A port that accepts connections and never answers: a Redis that stalls."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # read nothing, answer nothing

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


def enforced_gauge() -> float | None:
    return REGISTRY.get_sample_value("bettercompute_rate_limits_enforced")


async def test_a_silent_store_costs_a_request_tens_of_milliseconds_and_readyz_says_off(
    database_url: str, fleet: Fleet
) -> None:
    """Fail-open, bounded: the default wait for the store is 50 ms, and once it has been
    silent no request waits for it (it waited 1 s per request before)."""
    assert Settings().rate_limit_store_timeout_s == 0.05
    async with silent_listener() as port:
        settings = Settings(
            database_url=database_url,
            rate_limit_requests=2,
            rate_limit_storage_url=f"redis://127.0.0.1:{port}/0",
        )
        async with running(settings) as (_, api):
            scene = await Scene.start(api, fleet)
            body = scene.body(new_id("pool"))
            began = time.monotonic()
            statuses = [
                (await api.post(scene.token, "pools/get", body)).status_code for _ in range(5)
            ]
            elapsed = time.monotonic() - began
            assert statuses == [404] * 5  # let through: the budget is off
            assert elapsed < 2.5, elapsed  # 5 s and more before
            ready = await api.client.get("/readyz")
            assert ready.status_code == 200, ready.text
            assert ready.json()["rateLimits"] == "off"
            assert enforced_gauge() == 0
            scraped = (await api.client.get("/metrics")).text
            assert "bettercompute_rate_limits_enforced 0.0" in scraped


async def test_limits_are_enforced_again_once_the_store_answers(
    database_url: str, fleet: Fleet
) -> None:
    """A private Redis (never the shared one) paused with SIGSTOP, then resumed."""
    redis = PrivateRedis()
    await redis.start()
    try:
        settings = Settings(
            database_url=database_url,
            rate_limit_requests=3,
            rate_limit_storage_url=redis.url,
            rate_limit_store_timeout_s=0.5,  # a real Redis on a busy machine
        )
        async with running(settings) as (_, api):
            scene = await Scene.start(api, fleet)
            body = scene.body(new_id("pool"))
            first = await api.post(scene.token, "pools/get", body)
            assert first.headers["x-ratelimit-remaining"] == "2"
            assert (await api.client.get("/readyz")).json()["rateLimits"] == "on"
            assert enforced_gauge() == 1
            redis.pause()
            for _ in range(5):
                answer = await api.post(scene.token, "pools/get", body)
                assert answer.status_code == 404
            assert "x-ratelimit-remaining" not in answer.headers  # not counted
            assert (await api.client.get("/readyz")).json()["rateLimits"] == "off"
            redis.resume()
            deadline = time.monotonic() + 30
            while (await api.client.get("/readyz")).json()["rateLimits"] != "on":
                assert time.monotonic() < deadline, "the limits never came back"
                await asyncio.sleep(0.05)
            assert enforced_gauge() == 1
            statuses = [
                (await api.post(scene.token, "pools/get", body)).status_code for _ in range(9)
            ]
            assert 429 in statuses, statuses  # counted again
    finally:
        redis.resume()
        await redis.stop()
