"""Limits refuse a query before it runs (RESOURCE_EXHAUSTED); errors always carry a code;
unexpected failures are masked; GraphiQL and introspection follow the configuration."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette

from app.config import Settings
from app.server import create_app
from tests.support import Api, Fleet

NESTED_RESERVATIONS = """{ pools(tenantId: "acme", first: 100) {
  nodes { reservations(first: 100) { nodes { id resources { resource amount } } } } } }"""


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
    small = NESTED_RESERVATIONS.replace(
        "first: 100) {\n  nodes { reservations(first: 100)",
        "first: $p) {\n  nodes { reservations(first: 5)",
    )
    small = "query($p: Int) " + small
    assert "errors" not in await api.graphql(token, small, {"p": 10})
    assert code_of(await api.graphql(token, small, {"p": 100_000})) == "RESOURCE_EXHAUSTED"


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
    batch = await api.client.post("/graphql", json=[{"query": "{ catalog { name } }"}] * 2)
    assert batch.status_code == 400
    assert batch.json()["errors"][0]["extensions"]["code"] == "INVALID_INPUT"
    mutation_by_get = await api.client.get(
        "/graphql", params={"query": "mutation { unofferPool(input: {}) { removed } }"}
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
    api: Api, closed_app: httpx.AsyncClient
) -> None:
    page = await api.client.get("/graphql", headers={"accept": "text/html"})
    assert page.status_code == 200 and "graphiql" in page.text.lower()
    introspect = {"query": "{ __schema { queryType { name } } }"}
    assert (await api.client.post("/graphql", json=introspect)).json()["data"]

    closed_page = await closed_app.get("/graphql", headers={"accept": "text/html"})
    assert closed_page.status_code == 404
    refused = (await closed_app.post("/graphql", json=introspect)).json()
    assert refused["errors"][0]["extensions"]["code"] == "INVALID_INPUT"
