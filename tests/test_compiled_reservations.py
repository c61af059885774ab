"""REST `reservations/list` and GraphQL `Pool.reservations` (in `pool` and in a page of
`pools`), answered by their compiled statements (app/capacity/json_reads.py:
ReservationsShape, and the `Paged` field of a pool), give the plain path's bytes for every
caller of the compiled world (the owner, a guest, a guest's child, a stranger, narrowed,
revoked and nonsense callers), every pool (seen, hidden, archived, missing), paging and
cursors, and bad input, on both dialects; each is one statement; and each caller sees its
own tenant's reservations only."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from app.capacity.service import Capacity
from tests.compiled_world import CALLERS, Pair, World, pair, world
from tests.support import Fleet

__all__ = ["pair", "world"]  # fixtures
# The compiled path against the plain one: nothing to compare on the plain path.
pytestmark = pytest.mark.fast_path

MISSING = "pool_01j00000000000000000000000"
NODE = "id poolId tenantId state createdAt endedAt __typename resources { resource amount }"
PAGE = (
    "__typename pageInfo { hasNextPage hasPreviousPage startCursor endCursor } "
    f"edges {{ cursor node {{ {NODE} }} }} nodes {{ id resources {{ amount __typename }} }}"
)
ONE = (
    "query($t: String!, $p: ID!, $first: Int, $after: String) { pool(tenantId: $t, poolId: $p)"
    f" {{ id reservations(first: $first, after: $after) {{ {PAGE} }} }} }}"
)
PAGES = (
    "query($t: String!, $first: Int) { pools(tenantId: $t, first: 10) { nodes { id "
    f"mine: reservations(first: $first) {{ {PAGE} }} all: reservations {{ nodes {{ id }} }}"
    " } } }"
)


def _count(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _answered() -> float:
    return _count("bettercompute_compiled_reads_total", outcome="answered")


async def _post(client: httpx.AsyncClient, token: str, path: str, body: Any) -> tuple[Any, ...]:
    headers = {"authorization": f"Bearer {token}"}
    if isinstance(body, bytes):
        response = await client.post(path, content=body, headers=headers)
    else:
        response = await client.post(path, json=body, headers=headers)
    headers = {k: v for k, v in response.headers.items() if k != "x-request-id"}
    return response.status_code, headers, response.content


def _rest(body: Any) -> tuple[str, Any]:
    return "/api/compute/reservations/list", body


def _graphql(query: str, **variables: Any) -> tuple[str, Any]:
    return "/graphql", {"query": query, "variables": variables}


async def _alike(pair: Pair, token: str, path: str, body: Any) -> tuple[Any, ...]:
    """Plain once, fast twice (the first remembers the caller and learns the query text):
    the same status, headers and bytes."""
    plain = await _post(pair.plain, token, path, body)
    for attempt in (1, 2):
        fast = await _post(pair.fast, token, path, body)
        assert fast == plain, (attempt, path, body)
    return plain


async def _book(pair: Pair, token: str, tenant: str, pool: str, resources: dict[str, int]) -> str:
    body = {"tenantId": tenant, "poolId": pool, "resources": resources}
    headers = {"authorization": f"Bearer {token}"}
    booked = await pair.plain.post("/api/compute/reservations/create", json=body, headers=headers)
    assert booked.status_code == 200, booked.text
    return str(booked.json()["reservation"]["id"])


@pytest.fixture
async def booked(pair: Pair, world: World, fleet: Fleet) -> World:
    """Beside the world's one (globex's in p1): acme books four in a mig pool of its own
    (`mig`, with a layout: gpu and gpu.mig, in both key orders) and releases one; globex
    books two more in p0 (its offer)."""
    acme, globex = world.tokens["acme-admin"], world.tokens["globex-admin"]
    headers = {"authorization": f"Bearer {acme}"}
    site = await fleet.site("acme")
    body = {
        "tenantId": "acme",
        "siteId": site,
        "class": "metal-host",
        "sharing": "mig",
        "policy": {"migLayout": ["3g.40gb", "2g.20gb"]},
        "ownerQuota": {"gpu": 8, "gpu.mig": 16},
    }
    created = await pair.plain.post("/api/compute/pools/create", json=body, headers=headers)
    assert created.status_code == 200, created.text
    mig = world.pools["mig"] = created.json()["pool"]["id"]
    await fleet.node(mig, 4)
    made = [
        await _book(pair, acme, "acme", mig, {"gpu": 1, "gpu.mig": 2}),
        await _book(pair, acme, "acme", mig, {"gpu.mig": 1, "gpu": 1}),
        await _book(pair, acme, "acme", mig, {"gpu": 1}),
        await _book(pair, acme, "acme", mig, {"gpu.mig": 3}),
    ]
    release = {"tenantId": "acme", "reservationId": made[1]}
    released = await pair.plain.post(
        "/api/compute/reservations/release", json=release, headers=headers
    )
    assert released.status_code == 200, released.text
    for _ in range(2):
        await _book(pair, globex, "globex", world.pools["p0"], {"gpu": 1})
    return world


@pytest.mark.slow
async def test_the_reservation_reads_answer_alike(pair: Pair, booked: World, dialect: str) -> None:
    world = booked
    pools = [*world.pools.values(), MISSING]
    before = _answered()
    for caller, acting in CALLERS.items():
        token = world.tokens[caller]
        for tenant in (acting, "globex", "globex-dev", "initech"):
            await _alike(pair, token, *_rest({"tenantId": tenant}))
            for first in (None, 0, 1, 2):
                await _alike(pair, token, *_graphql(PAGES, t=tenant, first=first))
            for pool in pools:
                await _alike(pair, token, *_rest({"tenantId": tenant, "poolId": pool}))
                await _alike(pair, token, *_graphql(ONE, t=tenant, p=pool, first=2))
    # Input the plain path refuses, and a cursor that is none.
    admin = world.tokens["acme-admin"]
    p0 = world.pools["p0"]
    refused: list[Any] = [
        {"tenantId": "acme", "poolId": "x"},
        {"tenantId": "acme", "colour": "red"},
        {"tenantId": "acme", "#rsv0:first": 1},
        {},
        b"[]",
        b"{not json",
    ]
    for body in refused:
        status, _, _ = await _alike(pair, admin, *_rest(body))
        assert status == 400, body
    for first, after in ((101, None), (-1, None), (1, "bm90LWEtY3Vyc29y"), (1, "x")):
        await _alike(pair, admin, *_graphql(ONE, t="acme", p=p0, first=first, after=after))
    answered = _answered() - before
    assert answered >= 250, (dialect, answered)  # the compiled path answers on both


async def test_pages_and_cursors(pair: Pair, booked: World) -> None:
    """acme's four reservations in its mig pool walked one and three at a time by their cursors
    (and past the last), on both surfaces of the fast app, as the plain path walks them."""
    token, p0 = booked.tokens["acme-admin"], booked.pools["mig"]
    for first in (1, 3):
        seen: list[str] = []
        after: str | None = None
        while True:
            status, _, body = await _alike(
                pair, token, *_graphql(ONE, t="acme", p=p0, first=first, after=after)
            )
            assert status == 200
            page = httpx.Response(200, content=body).json()["data"]["pool"]["reservations"]
            seen += [n["id"] for n in page["nodes"]]
            assert [e["node"]["id"] for e in page["edges"]] == [n["id"] for n in page["nodes"]]
            info = page["pageInfo"]
            assert info["hasPreviousPage"] == (after is not None)
            if not info["hasNextPage"]:
                break
            after = info["endCursor"]
            assert base64.urlsafe_b64decode(after).decode() == f"v1:{seen[-1]}"
        assert len(seen) == 4 and seen == sorted(seen), seen
    # Past the last: an empty page with no cursors.
    last = base64.urlsafe_b64encode(f"v1:{seen[-1]}".encode()).decode()
    status, _, body = await _alike(pair, token, *_graphql(ONE, t="acme", p=p0, after=last))
    page = httpx.Response(200, content=body).json()["data"]["pool"]["reservations"]
    assert page["nodes"] == [] and page["pageInfo"]["startCursor"] is None


async def test_each_caller_sees_its_own_tenants(pair: Pair, booked: World, dialect: str) -> None:
    """The owner lists acme's reservations (one ended, with endedAt; resources in the
    stored object's order), a guest globex's only, a stranger none, and a stranger
    asking for acme's pool is NOT_FOUND, as `get` answers it (never a hint it exists)."""
    p0, p1, mig = booked.pools["p0"], booked.pools["p1"], booked.pools["mig"]
    _, _, body = await _alike(pair, booked.tokens["acme-admin"], *_rest({"tenantId": "acme"}))
    acme = httpx.Response(200, content=body).json()["reservations"]
    assert [(r["tenantId"], r["poolId"]) for r in acme] == [("acme", mig)] * 4
    assert [r["state"] for r in acme] == ["active", "ended", "active", "active"]
    # In the stored object's order: as booked on SQLite; PostgreSQL's jsonb orders keys.
    booked_order = [["gpu", "gpu.mig"], ["gpu.mig", "gpu"]]
    stored = booked_order if dialect == "sqlite" else [["gpu", "gpu.mig"]] * 2
    assert [list(r["resources"]) for r in acme[:2]] == stored
    assert acme[1]["endedAt"] is not None and acme[0]["endedAt"] is None
    _, _, body = await _alike(pair, booked.tokens["globex-viewer"], *_rest({"tenantId": "globex"}))
    globex = httpx.Response(200, content=body).json()["reservations"]
    assert {(r["tenantId"], r["poolId"]) for r in globex} == {("globex", p0), ("globex", p1)}
    assert len(globex) == 3
    stranger = booked.tokens["initech-admin"]
    _, _, body = await _alike(pair, stranger, *_rest({"tenantId": "initech"}))
    assert httpx.Response(200, content=body).json() == {"reservations": []}
    for path, sent in (
        _rest({"tenantId": "initech", "poolId": p0}),
        ("/api/compute/pools/get", {"tenantId": "initech", "poolId": p0}),
        _rest({"tenantId": "initech", "poolId": MISSING}),
    ):
        status, _, body = await _alike(pair, stranger, path, sent)
        error = httpx.Response(status, content=body).json()["error"]
        assert (status, error["code"]) == (404, "NOT_FOUND"), body
    # Another tenant's list: refused as the plain path refuses it.
    status, _, _ = await _alike(pair, stranger, *_rest({"tenantId": "acme"}))
    assert status == 403


async def test_one_statement_each(pair: Pair, booked: World) -> None:
    app: Any = pair.fast._transport.app  # type: ignore[attr-defined]
    capacity: Capacity = app.state.capacity
    pooled = capacity.db.pooled_by_transaction
    token, p0 = booked.tokens["acme-admin"], booked.pools["mig"]
    reads = [
        ("rest", _rest({"tenantId": "acme"})),
        ("rest", _rest({"tenantId": "acme", "poolId": p0})),
        ("graphql", _graphql(ONE, t="acme", p=p0, first=2)),
        ("graphql", _graphql(PAGES, t="acme", first=1)),
    ]
    for transport, (path, body) in reads:
        await _post(pair.fast, token, path, body)  # remembers the caller, learns the text
        before = _count("bettercompute_db_statements_total", transport=transport)
        answered = _answered()
        status, _, _ = await _post(pair.fast, token, path, body)
        assert status == 200
        assert _answered() == answered + 1, (path, body)
        sent = _count("bettercompute_db_statements_total", transport=transport) - before
        assert sent == (2 if pooled else 1), (path, body, sent)
