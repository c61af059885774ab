"""Limits refuse a query before it runs (RESOURCE_EXHAUSTED); errors always carry a code;
unexpected failures are masked; GraphiQL and introspection follow the configuration."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from graphql import GraphQLObjectType, get_nullable_type, is_list_type
from starlette.applications import Starlette

from app.compat import graphql_core_schema
from app.config import Settings
from app.server import create_app
from schema.app import schema
from schema.limits import LIST_BOUNDS
from tests.events.processes import bettercompute_serve
from tests.support import Api, Fleet

# Each pool's offers with their quota rows and its reservations with their resources:
# 100 x (100 x 16 + 100 x 16) rows at the domain's bounds (app/capacity/bounds.py).
NESTED_RESERVATIONS = """{ pools(tenantId: "acme", first: 100) {
  nodes { offers { tenantId quotas { resource max used } }
          reservations(first: 100) { nodes { id resources { resource amount } } } } } }"""


@pytest.fixture
async def token(fleet: Fleet) -> str:
    await fleet.tenant("acme")
    return await fleet.caller("acme", "admin")


def code_of(answer: dict[str, object]) -> object:
    errors = answer["errors"]
    assert isinstance(errors, list)
    return errors[0]["extensions"]["code"]


async def test_an_over_budget_query_is_refused_before_it_runs(api: Api, token: str) -> None:
    answer = await api.graphql(token, NESTED_RESERVATIONS)
    assert answer["data"] is None
    extensions = answer["errors"][0]["extensions"]
    assert extensions["code"] == "RESOURCE_EXHAUSTED" and extensions["limit"] == "cost"
    assert extensions["cost"] > extensions["budget"]
    # The same shape with small pages fits; `first` from variables counts as sent.
    small = NESTED_RESERVATIONS.replace("first: 100) {\n", "first: $p) {\n").replace(
        "reservations(first: 100)", "reservations(first: 5)"
    )
    small = "query($p: Int) " + small
    assert "errors" not in await api.graphql(token, small, {"p": 10})
    assert code_of(await api.graphql(token, small, {"p": 100_000})) == "RESOURCE_EXHAUSTED"
    # A cost past 64 bits is refused too (its figure in extensions was not encodable: 500).
    huge = NESTED_RESERVATIONS.replace("first: 100)", "first: 99999999999999999999)")
    extensions = (await api.graphql(token, huge))["errors"][0]["extensions"]
    assert extensions["code"] == "RESOURCE_EXHAUSTED" and extensions["cost"] == 2**63 - 1


async def test_depth_aliases_and_tokens_are_limited_through_fragments(
    api: Api, token: str, database_url: str
) -> None:
    too_deep = (
        "fragment A on PoolConnection { edges { node { reservations { edges { node { ...B } } } "
        "} } }"
        " fragment B on Reservation { resources { resource } } "
        '{ pools(tenantId: "acme") { ...A } }'
    )
    assert "errors" not in await api.graphql(token, too_deep)  # depth 7 fits the default
    shallow = Settings(database_url=database_url, max_query_depth=5)
    refused = await _answer(shallow, token, too_deep)
    assert refused["errors"][0]["extensions"] == {"code": "RESOURCE_EXHAUSTED", "limit": "depth"}

    aliases = "fragment C on Method { " + " ".join(f"a{i}: name" for i in range(20)) + " } "
    aliases += "{ x: catalog { ...C } y: catalog { ...C } }"
    refused = await _answer(Settings(database_url=database_url), token, aliases)
    assert refused["errors"][0]["extensions"] == {"code": "RESOURCE_EXHAUSTED", "limit": "aliases"}

    tokens = "{ catalog { " + "name " * 3000 + "} }"
    refused = await api.graphql(token, tokens)
    assert refused["errors"][0]["extensions"]["code"] == "RESOURCE_EXHAUSTED"


async def _answer(settings: Settings, token: str, query: str) -> dict[str, object]:
    """The query against an app built with these settings."""
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://testserver"
        ) as client,
    ):
        response = await client.post(
            "/graphql", json={"query": query}, headers={"authorization": f"Bearer {token}"}
        )
        answer: dict[str, object] = response.json()
        return answer


async def test_every_error_has_a_code(api: Api, token: str) -> None:
    assert code_of(await api.graphql(token, "{ nope }")) == "INVALID_INPUT"
    assert code_of(await api.graphql(token, "{ catalog { name ")) == "INVALID_INPUT"
    assert code_of(await api.graphql(None, "{ catalog { name } }")) == "UNAUTHENTICATED"
    assert code_of(await api.graphql("bogus", "{ catalog { name } }")) == "UNAUTHENTICATED"
    bad_first = await api.graphql(token, '{ pools(tenantId: "acme", first: 101) { nodes { id } } }')
    assert bad_first["errors"][0]["extensions"] == {"code": "INVALID_INPUT", "field": "first"}
    bad_cursor = await api.graphql(
        token, '{ pools(tenantId: "acme", after: "zz") { nodes { id } } }'
    )
    assert bad_cursor["errors"][0]["extensions"] == {"code": "INVALID_INPUT", "field": "after"}
    missing = await api.graphql(
        token,
        "mutation($i: CreatePoolInput!) { createPool(input: $i) { pool { id } } }",
        {"i": {"tenantId": "acme", "class": "VPS_HOST"}},
    )
    assert missing["errors"][0]["extensions"] == {"code": "INVALID_INPUT", "field": "siteId"}
    headers = {"authorization": f"Bearer {token}"}
    batch = await api.client.post(
        "/graphql", json=[{"query": "{ catalog { name } }"}] * 2, headers=headers
    )
    assert batch.status_code == 400
    assert batch.json()["errors"][0]["extensions"]["code"] == "INVALID_INPUT"
    mutation_by_get = await api.client.get(
        "/graphql",
        params={"query": "mutation { unofferPool(input: {}) { removed } }"},
        headers=headers,
    )
    assert mutation_by_get.json()["errors"][0]["extensions"]["code"] == "INVALID_INPUT"


async def test_unexpected_failures_are_masked_as_internal(
    api: Api, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.catalog import Method

    def broken(self: Method) -> dict[str, object]:
        raise RuntimeError("secret detail")

    monkeypatch.setattr(Method, "describe", broken)
    answer = await api.graphql(token, "{ catalog { name } }")
    error = answer["errors"][0]
    assert error["extensions"] == {"code": "INTERNAL"}
    assert "secret" not in error["message"]


@pytest.fixture
async def closed_app(database_url: str) -> AsyncIterator[httpx.AsyncClient]:
    app: Starlette = create_app(
        Settings(database_url=database_url, graphiql=False, introspection=False)
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://testserver"
        ) as client,
    ):
        yield client


async def test_graphiql_and_introspection_follow_the_configuration(
    api: Api, closed_app: httpx.AsyncClient, token: str
) -> None:
    page = await api.client.get("/graphql", headers={"accept": "text/html"})
    assert page.status_code == 200 and "graphiql" in page.text.lower()
    introspect = {"query": "{ __schema { queryType { name } } }"}
    headers = {"authorization": f"Bearer {token}"}
    assert (await api.client.post("/graphql", json=introspect, headers=headers)).json()["data"]

    closed_page = await closed_app.get("/graphql", headers={"accept": "text/html"})
    assert closed_page.status_code == 404
    refused = (await closed_app.post("/graphql", json=introspect, headers=headers)).json()
    assert refused["errors"][0]["extensions"]["code"] == "INVALID_INPUT"


def doubling_chain(levels: int, width: int = 2, leaf: str = "catalog { name }") -> str:
    """`fragment F0 on Query { ...F1 ...F1 }` and so on: `width`^`levels` fields once
    expanded, from a document of a few hundred bytes."""
    spreads = [
        f"fragment F{i} on Query {{ {' '.join([f'...F{i + 1}'] * width)} }}" for i in range(levels)
    ]
    return " ".join(["query { ...F0 }", *spreads, f"fragment F{levels} on Query {{ {leaf} }}"])


# "At once" on a busy machine: well under what an exponential expansion would take.
AT_ONCE_S = 5.0
EXPONENTIAL = {
    "30 levels": doubling_chain(30),
    "introspection leaf": doubling_chain(30, leaf="__typename"),
    "5 spreads a level": doubling_chain(10, width=5),
    "30 spreads a level": doubling_chain(3, width=30),
}


@pytest.mark.parametrize("dialect", ["sqlite"])  # the database plays no part
async def test_exponential_fragments_are_refused_at_once_and_the_server_keeps_answering(
    database_url: str, fleet: Fleet
) -> None:
    """Against a real server process: each document is refused (with a token by the
    limits, without one before it is parsed) in well under a second, and /healthz
    answers promptly all along. Before, 30 levels walked 2^30 spreads (20 levels took
    12.7 s) with the event loop blocked."""
    await fleet.tenant("acme")
    token = await fleet.caller("acme", "admin")
    async with (
        bettercompute_serve(BETTERCOMPUTE_DATABASE_URL=database_url) as server,
        httpx.AsyncClient(base_url=f"http://{server.address}", timeout=10) as client,
    ):
        warm = await client.post(
            "/graphql",
            json={"query": "{ __typename }"},
            headers={"authorization": f"Bearer {token}"},
        )
        assert warm.json()["data"] == {"__typename": "Query"} and "errors" not in warm.json()
        slowest_health = 0.0
        done = asyncio.Event()

        async def probe() -> None:
            nonlocal slowest_health
            async with httpx.AsyncClient(base_url=f"http://{server.address}", timeout=10) as c:
                while not done.is_set():
                    start = time.perf_counter()
                    assert (await c.get("/healthz")).status_code == 200
                    slowest_health = max(slowest_health, time.perf_counter() - start)
                    await asyncio.sleep(0.01)

        probing = asyncio.create_task(probe())
        try:
            for name, document in EXPONENTIAL.items():
                answers = (
                    ({"authorization": f"Bearer {token}"}, "RESOURCE_EXHAUSTED"),
                    ({}, "UNAUTHENTICATED"),  # the token is checked before the document
                )
                for headers, code in answers:
                    start = time.perf_counter()
                    response = await client.post(
                        "/graphql", json={"query": document}, headers=headers
                    )
                    elapsed = time.perf_counter() - start
                    extensions = response.json()["errors"][0]["extensions"]
                    assert extensions["code"] == code, (name, extensions)
                    if headers:
                        assert extensions["limit"] == "fields", name
                    # An expansion would take minutes; a busy machine (load 13) took 1.04 s.
                    assert elapsed < AT_ONCE_S, (name, elapsed)
        finally:
            done.set()
            await probing
        assert slowest_health < AT_ONCE_S


async def test_fragments_count_every_time_they_are_spread(api: Api, token: str) -> None:
    """Measured once per fragment, counted per spread: 12 levels expand to 2^12 x 2 =
    8,192 fields and run; 13 levels expand to 16,384, over the bound of 10,000."""
    assert "errors" not in await api.graphql(token, doubling_chain(12))
    refused = await api.graphql(token, doubling_chain(13))
    error = refused["errors"][0]
    assert error["extensions"] == {"code": "RESOURCE_EXHAUSTED", "limit": "fields"}
    assert "16384 fields" in error["message"]


def test_every_list_field_has_a_bound() -> None:
    """A list without `first` is counted by its bound from app/capacity/bounds.py; a new
    list field must say what bounds it (LIST_BOUNDS) before it can be priced."""
    for type_name, graphql_type in graphql_core_schema(schema).type_map.items():
        if type_name.startswith("__") or not isinstance(graphql_type, GraphQLObjectType):
            continue
        for field_name, field in graphql_type.fields.items():
            if not is_list_type(get_nullable_type(field.type)):
                continue
            paged = "first" in field.args or type_name.endswith("Connection")
            assert paged or (type_name, field_name) in LIST_BOUNDS, (type_name, field_name)


COSTS = {
    # 1 + 3 capacity rows x 1
    '{ capacity(tenantId: "acme", poolId: "pool_x") { total } }': 4,
    # 1 + 8 methods x 1
    "{ catalog { name } }": 9,
    # pool 1 + quotas (1 + 16) + capacity (1 + 3) + offers (1 + 100 x (1 + quotas (1 + 16)))
    '{ pool(tenantId: "acme", poolId: "pool_x") { quotas { max } capacity { total }'
    " offers { tenantId quotas { max } } } }": 1 + 17 + 4 + 1 + 100 * 18,
    # one pool's quota rows; without poolId, a full page of pools (100 x 16 rows)
    '{ quotas(tenantId: "acme", poolId: "pool_x") { max used } }': 1 + 16 * 2,
    '{ quotas(tenantId: "acme") { max used } }': 1 + 1600 * 2,
    # reservations by `first`, their resources by the bound of 16
    '{ pools(tenantId: "acme", first: 10) { nodes { reservations(first: 5) '
    "{ nodes { resources { amount } } } } } }": 1 + 10 * (1 + 1 + 5 * (1 + 1 + 16)),
}


async def test_list_fields_count_by_their_domain_bounds(database_url: str, token: str) -> None:
    """Priced with a budget of 1, every query is refused and says what it cost."""
    settings = Settings(database_url=database_url, max_query_cost=1)
    for query, cost in COSTS.items():
        refused = await _answer(settings, token, query)
        assert refused["errors"][0]["extensions"]["cost"] == cost, query


async def test_quotas_of_every_pool_may_be_asked_once_per_query(api: Api, token: str) -> None:
    """Root `quotas` without `poolId` is the one list nothing bounds (every pool the
    tenant sees): asked once it answers; aliased, it is refused however small its cost.
    Before, 13 aliases of it were priced at 13 x 41 and answered 122 MB."""
    once = await api.graphql(token, '{ quotas(tenantId: "acme") { poolId max } }')
    assert "errors" not in once
    aliased = " ".join(f'q{i}: quotas(tenantId: "acme") {{ poolId max }}' for i in range(13))
    refused = await api.graphql(token, "{ " + aliased + " }")
    error = refused["errors"][0]
    assert error["extensions"]["code"] == "RESOURCE_EXHAUSTED"
    assert error["extensions"]["limit"] == "cost"
    # One pool's rows are bounded (16), so they may be aliased like any other list.
    per_pool = " ".join(
        f'q{i}: quotas(tenantId: "acme", poolId: "pool_{i}") {{ max }}' for i in range(13)
    )
    assert code_of(await api.graphql(token, "{ " + per_pool + " }")) != "RESOURCE_EXHAUSTED"
