"""GraphQL over HTTP (the spec's SHOULDs): application/graphql-response+json with 4xx
and no `data` for request errors, 405 for a mutation by GET, 406, CORS from configured
origins, persisted queries (automatic and allow-list), and GraphiQL's header names in a
websocket's connection_init. `test_audit.py` runs graphql-http's own audit."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import websockets

from app.config import Settings
from app.server import create_app
from schema.graphiql import DEFAULT_ASSETS_DIR, served_files
from schema.persisted import sha256
from tests.databases import service_unavailable
from tests.events.conftest import served
from tests.support import Fleet

GR = "application/graphql-response+json"
QUERY = "{ catalog { name } }"


@pytest.fixture
async def token(fleet: Fleet) -> str:
    await fleet.tenant("acme")
    return await fleet.caller("acme", "admin")


@asynccontextmanager
async def client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            yield c


def auth(token: str, accept: str = GR) -> dict[str, str]:
    return {"authorization": f"Bearer {token}", "accept": accept}


async def test_request_errors_under_graphql_response_json_are_4xx_without_data(
    database_url: str, token: str
) -> None:
    async with client(Settings(database_url=database_url)) as c:
        ok = await c.post("/graphql", json={"query": QUERY}, headers=auth(token))
        assert ok.status_code == 200
        assert ok.headers["content-type"].startswith(GR)
        assert ok.json()["data"]["catalog"]
        for body in (
            {"query": "{ catalog { name }"},  # does not parse
            {"query": "{ nope }"},  # does not validate
            {"query": "query($t: String!) { quotas(tenantId: $t) { max } }", "variables": {"t": 1}},
        ):
            refused = await c.post("/graphql", json=body, headers=auth(token))
            assert refused.status_code == 400, refused.text
            assert refused.headers["content-type"].startswith(GR)
            assert "data" not in refused.json() and refused.json()["errors"]
            # application/json keeps the legacy answer: 200 and data null.
            legacy = await c.post("/graphql", json=body, headers=auth(token, "application/json"))
            assert legacy.status_code == 200 and legacy.json()["data"] is None
        anonymous = await c.post("/graphql", json={"query": QUERY}, headers={"accept": GR})
        assert anonymous.status_code == 401 and "data" not in anonymous.json()
        assert anonymous.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"


async def test_mutation_by_get_is_405_and_an_unacceptable_accept_is_406(
    database_url: str, token: str
) -> None:
    mutation = 'mutation { archivePool(input: {tenantId: "acme", poolId: "x"}) { __typename } }'
    async with client(Settings(database_url=database_url)) as c:
        by_get = await c.get("/graphql", params={"query": mutation}, headers=auth(token))
        assert by_get.status_code == 405 and by_get.headers["allow"] == "POST"
        for accept in ("text/plain", "application/xml, text/html;q=0.5"):
            response = await c.post("/graphql", json={"query": QUERY}, headers=auth(token, accept))
            assert response.status_code == 406, accept
        query_by_get = await c.get("/graphql", params={"query": QUERY}, headers=auth(token))
        assert query_by_get.status_code == 200 and query_by_get.json()["data"]["catalog"]


async def test_cors_only_for_configured_origins(database_url: str, token: str) -> None:
    preflight = {
        "origin": "https://dash.example",
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type",
    }
    async with client(Settings(database_url=database_url)) as c:  # off by default
        response = await c.options("/graphql", headers=preflight)
        assert "access-control-allow-origin" not in response.headers
    settings = Settings(database_url=database_url, allowed_origins=("https://dash.example",))
    async with client(settings) as c:
        response = await c.options("/graphql", headers=preflight)
        assert response.status_code == 200
        assert response.headers["access-control-allow-origin"] == "https://dash.example"
        assert "authorization" in response.headers["access-control-allow-headers"].lower()
        other = await c.options("/graphql", headers={**preflight, "origin": "https://evil.example"})
        assert other.status_code == 400
        answer = await c.post(
            "/graphql",
            json={"query": QUERY},
            headers={**auth(token), "origin": "https://dash.example"},
        )
        assert answer.headers["access-control-allow-origin"] == "https://dash.example"


def apq(query: str) -> dict[str, object]:
    return {"persistedQuery": {"version": 1, "sha256Hash": sha256(query)}}


async def test_automatic_persisted_queries(database_url: str, token: str) -> None:
    async with client(Settings(database_url=database_url)) as c:
        hashed = {"extensions": json.dumps(apq(QUERY))}
        missing = await c.get("/graphql", params=hashed, headers=auth(token, "application/json"))
        assert missing.status_code == 200
        assert missing.json()["errors"][0]["extensions"]["code"] == "PERSISTED_QUERY_NOT_FOUND"
        registered = await c.post(
            "/graphql", json={"query": QUERY, "extensions": apq(QUERY)}, headers=auth(token)
        )
        assert registered.json()["data"]["catalog"]
        # Now the short GET (a cacheable URL) runs it; it needs a token like any request.
        by_hash = await c.get("/graphql", params=hashed, headers=auth(token))
        assert by_hash.status_code == 200 and by_hash.json() == registered.json()
        anonymous = await c.get("/graphql", params=hashed, headers={"accept": GR})
        assert anonymous.status_code == 401
        wrong = await c.post(
            "/graphql",
            json={"query": "{ __typename }", "extensions": apq(QUERY)},
            headers=auth(token),
        )
        assert wrong.status_code == 400
        assert wrong.json()["errors"][0]["extensions"]["code"] == "INVALID_INPUT"


async def test_allowlist_runs_only_registered_operations(
    database_url: str, token: str, tmp_path: Path
) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text(
        json.dumps(
            {
                "format": "apollo-persisted-query-manifest",
                "version": 1,
                "operations": [
                    {"id": sha256(QUERY), "name": "Catalog", "type": "query", "body": QUERY}
                ],
            }
        )
    )
    settings = Settings(
        database_url=database_url,
        persisted_queries="allowlist",
        persisted_queries_manifest=str(manifest),
    )
    async with client(settings) as c:
        by_hash = await c.post("/graphql", json={"extensions": apq(QUERY)}, headers=auth(token))
        assert by_hash.status_code == 200 and by_hash.json()["data"]["catalog"]
        by_text = await c.post("/graphql", json={"query": QUERY}, headers=auth(token))
        assert by_text.json() == by_hash.json()
        other = "{ catalog { name description } }"
        for body in ({"query": other}, {"query": other, "extensions": apq(other)}):
            refused = await c.post("/graphql", json=body, headers=auth(token))
            assert refused.status_code == 400 and "data" not in refused.json()
            code = refused.json()["errors"][0]["extensions"]["code"]
            assert code == "PERSISTED_QUERY_NOT_ALLOWED"
        unknown = await c.post("/graphql", json={"extensions": apq(other)}, headers=auth(token))
        assert unknown.json()["errors"][0]["extensions"]["code"] == "PERSISTED_QUERY_NOT_FOUND"


async def test_connection_init_takes_authorization_in_any_case(
    database_url: str, token: str
) -> None:
    """GraphiQL sends its headers pane as the payload: {"Authorization": "Bearer ..."}."""
    async with served(Settings(database_url=database_url)) as (_, address):
        for key in ("Authorization", "AUTHORIZATION", "authorization"):
            async with websockets.connect(
                f"ws://{address}/graphql",
                subprotocols=["graphql-transport-ws"],  # type: ignore[list-item]
            ) as ws:
                init = {"type": "connection_init", "payload": {key: f"Bearer {token}"}}
                await ws.send(json.dumps(init))
                assert json.loads(await ws.recv())["type"] == "connection_ack", key


async def test_the_allowlist_holds_on_websockets(
    database_url: str, token: str, tmp_path: Path
) -> None:
    events = 'subscription { poolEvents(tenantId: "acme", after: "not-a-cursor") { cursor } }'
    manifest = tmp_path / "manifest.json"
    manifest.write_text(
        json.dumps(
            {
                "format": "apollo-persisted-query-manifest",
                "version": 1,
                "operations": [
                    {"id": sha256(events), "name": "E", "type": "subscription", "body": events}
                ],
            }
        )
    )
    settings = Settings(
        database_url=database_url,
        persisted_queries="allowlist",
        persisted_queries_manifest=str(manifest),
    )
    other = 'subscription { poolEvents(tenantId: "acme") { type } }'
    async with (
        served(settings) as (_, address),
        websockets.connect(
            f"ws://{address}/graphql",
            subprotocols=["graphql-transport-ws"],  # type: ignore[list-item]
        ) as ws,
    ):
        init = {"type": "connection_init", "payload": {"authorization": f"Bearer {token}"}}
        await ws.send(json.dumps(init))
        assert json.loads(await ws.recv())["type"] == "connection_ack"
        await ws.send(json.dumps({"id": "1", "type": "subscribe", "payload": {"query": other}}))
        refused = json.loads(await ws.recv())
        assert refused["type"] == "error" and refused["id"] == "1"
        assert refused["payload"][0]["extensions"]["code"] == "PERSISTED_QUERY_NOT_ALLOWED"
        # The registered one runs by its hash: its malformed `after` is the resolver's answer.
        by_hash = {"query": "", "extensions": apq(events)}
        await ws.send(json.dumps({"id": "2", "type": "subscribe", "payload": by_hash}))
        answer = json.loads(await ws.recv())
        assert answer["type"] == "next" and answer["id"] == "2"
        assert answer["payload"]["errors"][0]["extensions"]["code"] == "INVALID_INPUT"


async def test_graphiql_assets_are_served_pinned_with_their_licences(
    database_url: str, tmp_path: Path
) -> None:
    if not (DEFAULT_ASSETS_DIR / "graphiql").is_dir():
        service_unavailable("web/node_modules is not installed (scripts/web-assets)")
    async with client(Settings(database_url=database_url)) as c:
        page = (await c.get("/graphql", headers={"accept": "text/html"})).text
        assert "unpkg.com" not in page
        for package, version, path in served_files():
            url = f"/assets/{package}@{version}/{path}"
            assert url in page or path == "LICENSE"
            served = await c.get(url)
            assert served.status_code == 200, url
        assert "MIT" in (await c.get("/assets/react@18.2.0/LICENSE")).text
        # Nothing else under node_modules, and never another version under a pinned URL.
        for url in (
            "/assets/graphiql@3.8.3/package.json",
            "/assets/react@18.3.0/LICENSE",
            "/assets/graphql-http@1.23.1/LICENSE",
            "/assets/react@18.2.0/../../x",
        ):
            assert (await c.get(url)).status_code == 404, url
    # Without the assets installed, the page falls back to strawberry's CDN page.
    async with client(Settings(database_url=database_url, web_assets_dir=str(tmp_path))) as c:
        page = (await c.get("/graphql", headers={"accept": "text/html"})).text
        assert "https://unpkg.com/graphiql@3.8.3/" in page
