"""Automatic persisted queries are registered per tenant (issue 19, item 12): a hash one
tenant registered answers PERSISTED_QUERY_NOT_FOUND to another, over HTTP (POST and GET,
compiled reads on and off) and over both websocket protocols; the manifest stays global;
the cache is bounded in entries and bytes whatever the tenants."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import websockets

from app.config import Settings
from schema import persisted
from schema.persisted import PersistedQueries, PersistedQueryError, sha256
from tests.events.conftest import served
from tests.support import Fleet

# A read the compiled path answers (PostgreSQL, fast path), and one it does not.
POOLS = 'query Pools { pools(tenantId: "acme", first: 5) { nodes { id } } }'
CATALOG = "query Catalog { catalog { name } }"


def apq(query: str) -> dict[str, object]:
    return {"persistedQuery": {"version": 1, "sha256Hash": sha256(query)}}


def _code(answer: dict[str, object]) -> object:
    errors = answer.get("errors")
    assert isinstance(errors, list) and errors, answer
    return errors[0]["extensions"]["code"]


async def _ws_by_hash(address: str, token: str, protocol: str, query: str) -> dict[str, object]:
    """The first answer to an operation sent by its hash alone over `protocol`."""
    async with websockets.connect(
        f"ws://{address}/graphql",
        subprotocols=[protocol],  # type: ignore[list-item]
    ) as ws:
        init = {"type": "connection_init", "payload": {"authorization": f"Bearer {token}"}}
        await ws.send(json.dumps(init))
        assert json.loads(await ws.recv())["type"] == "connection_ack"
        kind = "subscribe" if protocol == "graphql-transport-ws" else "start"
        payload = {"query": "", "extensions": apq(query)}
        await ws.send(json.dumps({"id": "1", "type": kind, "payload": payload}))
        while True:
            message = json.loads(await ws.recv())
            if message["type"] != "ka":  # graphql-ws's keep-alive
                assert message["id"] == "1", message
                return dict(message)


@pytest.mark.parametrize("fast_path", [True, False], ids=["compiled", "plain"])
async def test_a_registration_is_the_tenants_own(
    database_url: str, fleet: Fleet, fast_path: bool
) -> None:
    await fleet.tenant("acme")
    await fleet.tenant("globex")
    acme, globex = await fleet.caller("acme", "admin"), await fleet.caller("globex", "admin")
    settings = Settings(database_url=database_url, fast_path=fast_path)
    async with (
        served(settings) as (_, address),
        httpx.AsyncClient(base_url=f"http://{address}") as c,
    ):

        async def post(token: str, body: dict[str, object]) -> dict[str, object]:
            headers = {"authorization": f"Bearer {token}"}
            answer = await c.post("/graphql", json=body, headers=headers)
            return dict(answer.json())

        for query in (POOLS, CATALOG):
            registered = await post(acme, {"query": query, "extensions": apq(query)})
            assert "errors" not in registered, registered
            # The registering tenant runs it by its hash, again and again (the compiled
            # path learns the query from the first plain run, then answers it).
            for _ in range(3):
                assert await post(acme, {"extensions": apq(query)}) == registered
            # Another tenant cannot tell it was registered: by POST, by GET, by websocket.
            for _ in range(3):
                other = await post(globex, {"extensions": apq(query)})
                assert _code(other) == "PERSISTED_QUERY_NOT_FOUND", other
            by_get = await c.get(
                "/graphql",
                params={"extensions": json.dumps(apq(query))},
                headers={"authorization": f"Bearer {globex}", "accept": "application/json"},
            )
            assert _code(by_get.json()) == "PERSISTED_QUERY_NOT_FOUND", by_get.text
            for protocol in ("graphql-transport-ws", "graphql-ws"):
                refused = await _ws_by_hash(address, globex, protocol, query)
                assert refused["type"] == "error", (protocol, refused)
                payload = refused["payload"]
                error = payload[0] if isinstance(payload, list) else payload
                assert error["extensions"]["code"] == "PERSISTED_QUERY_NOT_FOUND", protocol
                mine = await _ws_by_hash(address, acme, protocol, query)
                assert mine["type"] in ("next", "data"), (protocol, mine)
                assert mine["payload"]["data"] == registered["data"], protocol
            # Once the other tenant sends the text, the hash is its own too.
            own = await post(globex, {"query": query, "extensions": apq(query)})
            assert await post(globex, {"extensions": apq(query)}) == own


async def test_the_manifest_is_every_tenants(
    database_url: str, fleet: Fleet, tmp_path: Path
) -> None:
    await fleet.tenant("acme")
    await fleet.tenant("globex")
    manifest = tmp_path / "manifest.json"
    operation = {"id": sha256(CATALOG), "name": "Catalog", "type": "query", "body": CATALOG}
    document = {"format": "apollo-persisted-query-manifest", "version": 1}
    manifest.write_text(json.dumps({**document, "operations": [operation]}))
    settings = Settings(
        database_url=database_url,
        persisted_queries="allowlist",
        persisted_queries_manifest=str(manifest),
    )
    async with (
        served(settings) as (_, address),
        httpx.AsyncClient(base_url=f"http://{address}") as c,
    ):
        for tenant in ("acme", "globex"):
            token = await fleet.caller(tenant, "admin")
            answer = await c.post(
                "/graphql",
                json={"extensions": apq(CATALOG)},
                headers={"authorization": f"Bearer {token}"},
            )
            assert answer.json()["data"]["catalog"], answer.text


def test_the_cache_is_bounded_in_entries_and_bytes_across_tenants() -> None:
    cache = PersistedQueries("automatic", max_bytes=64 << 10, max_entries=50)
    for tenant in range(20):
        for i in range(20):
            query = f"{{ catalog {{ name }} }} # {tenant} {i} {'x' * 200}"
            assert cache.resolve(query, apq(query), f"t{tenant}") == query
            assert len(cache) <= 50 and cache.cached_bytes <= 64 << 10
    assert len(cache) == 50  # the entry bound, not the bytes, held here
    big = PersistedQueries("automatic", max_bytes=8 << 10, max_entries=1_000)
    for i in range(200):
        query = f"{{ catalog {{ name }} }} # {i} {'y' * 1_000}"
        big.resolve(query, apq(query), "acme")
        assert big.cached_bytes <= 8 << 10
    assert len(big) == (8 << 10) // (len(query) + len("acme") + persisted.ENTRY_OVERHEAD)
    # The most recently registered ones are kept; an evicted hash is simply not found.
    assert big.resolve(None, apq(query), "acme") == query
    first = f"{{ catalog {{ name }} }} # 0 {'y' * 1_000}"
    with pytest.raises(PersistedQueryError) as missing:
        big.resolve(None, apq(first), "acme")
    assert missing.value.code == "PERSISTED_QUERY_NOT_FOUND"
    # Without an authenticated tenant nothing is kept or found.
    anonymous = PersistedQueries("automatic")
    anonymous.resolve(CATALOG, apq(CATALOG), None)
    assert len(anonymous) == 0
