"""The per-caller budget: requests and GraphQL cost per window, RESOURCE_EXHAUSTED with
HTTP 429, Retry-After and X-RateLimit-* headers; shared through Redis across processes
(here: two apps on one Redis); `extensions.cost` reports each GraphQL query's cost."""

from __future__ import annotations

from graphql import parse

from app.compat import graphql_core_schema
from app.config import Settings
from app.ids import new_id
from schema.app import build_schema
from schema.limits import cost_errors
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
        database_url=database_url, rate_limit_requests=4, rate_limit_storage_url=redis_url
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
