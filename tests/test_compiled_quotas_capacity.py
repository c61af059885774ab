"""GraphQL `quotas`, `capacity` and `lending` and REST `pools/capacity` and `pools/lending`,
answered by their compiled statements (app/capacity/json_reads.py: QuotasShape,
CapacityShape, LendingShape), give the plain
path's bytes for every caller of the compiled world, every pool and bad input, on both
dialects; each is one statement; and a lender's sum the statement cannot be sure of is
left to the plain path (which answers it, or refuses it, as it always has)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import text

from app.capacity.inputs import MAX_AMOUNT
from app.capacity.service import Capacity
from app.config import Settings
from app.server import create_app
from tests.compiled_world import CALLERS, Pair, World, pair, world
from tests.support import Fleet

__all__ = ["pair", "world"]  # fixtures
# The compiled path against the plain one: nothing to compare on the plain path.
pytestmark = pytest.mark.fast_path

MISSING = "pool_01j00000000000000000000000"
LENDER = "offered guestUsed overcommit"
CAPACITY = (
    "query($t: String!, $p: ID!) { capacity(tenantId: $t, poolId: $p) { resource total "
    f"allocatable booked available {LENDER} __typename }} }}"
)
LENDING = (
    "query($t: String!, $first: Int) { lending(tenantId: $t, first: $first) { poolId "
    f"resource total allocatable booked available {LENDER} __typename }} }}"
)
QUOTAS = (
    "query($t: String!, $p: ID) { quotas(tenantId: $t, poolId: $p) { poolId resource max "
    "used __typename grant { via tenantId includeDescendants priority offeredAt } } }"
)


def _count(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _answered() -> float:
    return _count("bettercompute_compiled_reads_total", outcome="answered")


def _declined() -> float:
    return _count("bettercompute_compiled_reads_total", outcome="declined")


async def _post(client: httpx.AsyncClient, token: str, path: str, body: Any) -> tuple[Any, ...]:
    response = await client.post(path, json=body, headers={"authorization": f"Bearer {token}"})
    headers = {k: v for k, v in response.headers.items() if k != "x-request-id"}
    return response.status_code, headers, response.content


def _capacity(tenant: str, pool: str) -> tuple[str, Any]:
    return "/api/compute/pools/capacity", {"tenantId": tenant, "poolId": pool}


def _lending(tenant: str, **more: Any) -> tuple[str, Any]:
    return "/api/compute/pools/lending", {"tenantId": tenant, **more}


def _graphql(query: str, **variables: Any) -> tuple[str, Any]:
    return "/graphql", {"query": query, "variables": variables}


async def _alike(pair: Pair, token: str, path: str, body: Any) -> tuple[Any, ...]:
    """Plain once, fast twice (the first remembers the caller and learns the query text):
    the same status, headers and bytes."""
    plain = await _post(pair.plain, token, path, body)
    for attempt in (1, 2):
        assert await _post(pair.fast, token, path, body) == plain, (attempt, path, body)
    return plain


@pytest.mark.slow
async def test_quotas_and_capacity_answer_alike(pair: Pair, world: World, dialect: str) -> None:
    before = _answered()
    pools = [*world.pools.values(), MISSING]
    for caller in CALLERS:
        token = world.tokens[caller]
        for tenant in ("acme", "globex", "globex-dev", "initech"):
            await _alike(pair, token, *_graphql(QUOTAS, t=tenant))
            for first in (None, 0, 1, 2, 101):
                given = {} if first is None else {"first": first}
                await _alike(pair, token, *_lending(tenant, **given))
                await _alike(pair, token, *_graphql(LENDING, t=tenant, **given))
            for pool in pools:
                await _alike(pair, token, *_capacity(tenant, pool))
                await _alike(pair, token, *_graphql(CAPACITY, t=tenant, p=pool))
                await _alike(pair, token, *_graphql(QUOTAS, t=tenant, p=pool))
    bad: list[Any] = [
        {"tenantId": "acme"},
        {"tenantId": "acme", "poolId": "x"},
        {"tenantId": "acme", "poolId": world.pools["p0"], "colour": "red"},
        {"tenantId": "acme", "poolId": world.pools["p0"], "first": 1},
        [],
        "x",
    ]
    for body in bad:
        status, _, _ = await _alike(
            pair, world.tokens["acme-admin"], "/api/compute/pools/capacity", body
        )
        assert status == 400, body
    await _alike(pair, world.tokens["acme-admin"], *_graphql(QUOTAS, t="acme", p="nope"))
    answered = _answered() - before
    assert answered >= 150, (dialect, answered)  # the compiled path answers on both


async def test_the_owner_sees_what_it_lent(pair: Pair, world: World) -> None:
    """The lender's values, compiled: p1 lends 1 gpu to globex, which holds it; REST
    shows them to the owner with compute:pools:share only (no key for anyone else)."""
    admin, viewer = world.tokens["acme-admin"], world.tokens["acme-viewer"]
    for _ in range(2):
        before = _answered()
        status, _, body = await _post(pair.fast, admin, *_capacity("acme", world.pools["p1"]))
        assert status == 200 and _answered() == before + 1
        assert b'"offered":1,"guestUsed":1,"overcommit":0.25' in body, body
        status, _, body = await _post(pair.fast, viewer, *_capacity("acme", world.pools["p1"]))
        assert status == 200 and b"offered" not in body, body


async def test_one_statement_each(pair: Pair, world: World) -> None:
    app: Any = pair.fast._transport.app  # type: ignore[attr-defined]
    capacity: Capacity = app.state.capacity
    pooled = capacity.db.pooled_by_transaction
    token = world.tokens["acme-admin"]
    reads = {
        "rest": _capacity("acme", world.pools["p0"]),
        "graphql": _graphql(CAPACITY, t="acme", p=world.pools["p0"]),
    }
    more = [("graphql", _graphql(QUOTAS, t="acme")), ("graphql", _graphql(LENDING, t="acme"))]
    for transport, (path, body) in [*reads.items(), ("rest", _lending("acme")), *more]:
        await _post(pair.fast, token, path, body)  # remembers the caller, learns the text
        before = _count("bettercompute_db_statements_total", transport=transport)
        answered = _answered()
        status, _, _ = await _post(pair.fast, token, path, body)
        assert status == 200
        assert _answered() == answered + 1, (path, body)
        sent = _count("bettercompute_db_statements_total", transport=transport) - before
        assert sent == (2 if pooled else 1), (path, body, sent)


async def test_a_lender_sum_past_a_long_is_left_to_the_plain_path(pair: Pair, fleet: Fleet) -> None:
    """Two guests lent 2^62 each: `offered` is 2^63, past a Long. REST's plain path shows
        it, GraphQL's fails the field (a Long cannot hold it); the compiled read declines both
    to it."""
    await fleet.tenant("acme")
    site = await fleet.site("acme")
    admin = await fleet.caller("acme", "admin")
    headers = {"authorization": f"Bearer {admin}"}
    body = {"tenantId": "acme", "siteId": site, "class": "metal-host"}
    created = await pair.plain.post("/api/compute/pools/create", json=body, headers=headers)
    pool = created.json()["pool"]["id"]
    await fleet.node(pool, 4)
    for guest in ("globex", "initech"):
        await fleet.tenant(guest)
        offer = {"tenantId": "acme", "poolId": pool, "toTenantId": guest, "quota": {"gpu": 2**62}}
        offered = await pair.plain.post("/api/compute/pools/offer", json=offer, headers=headers)
        assert offered.status_code == 200, offered.text
    declined = _declined()
    rest = await _alike(pair, admin, *_capacity("acme", pool))
    assert rest[0] == 200 and f'"offered":{2**63}'.encode() in rest[2], rest
    assert MAX_AMOUNT < 2**63
    graphql = await _alike(pair, admin, *_graphql(CAPACITY, t="acme", p=pool))
    assert b'"path":["capacity",0,"offered"],"extensions":{"code":"INTERNAL"}' in graphql[2]
    # The second of each (the first remembers the caller, and learns the query text).
    assert _declined() - declined == 2


@pytest.mark.parametrize("dialect", ["postgresql"])  # a lock waited for past the timeout
async def test_a_connection_fault_is_503_at_once(database_url: str, fleet: Fleet) -> None:
    """A compiled read that meets a connection-class fault (here PostgreSQL cancelling
    the statement at its statement_timeout, SQLSTATE 57014, behind a table lock) answers
    503 itself: it does not give way to the plain path, which would wait again."""
    await fleet.tenant("acme")
    site = await fleet.site("acme")
    admin = await fleet.caller("acme", "admin")
    settings = Settings(database_url=database_url, db_statement_timeout_s=0.5)
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            headers = {"authorization": f"Bearer {admin}"}
            body = {"tenantId": "acme", "siteId": site, "class": "metal-host"}
            created = await client.post("/api/compute/pools/create", json=body, headers=headers)
            pool = created.json()["pool"]["id"]
            reads = [
                _capacity("acme", pool),
                _lending("acme"),
                _graphql(QUOTAS, t="acme"),
                _graphql(CAPACITY, t="acme", p=pool),
                _graphql(LENDING, t="acme"),
            ]
            for path, sent in reads:  # the caller remembered, each query text learnt
                for _ in range(2):
                    assert (await _post(client, admin, path, sent))[0] == 200
            async with fleet.db.writer.connect() as holder, holder.begin() as held:
                await holder.execute(text("LOCK TABLE tenants IN ACCESS EXCLUSIVE MODE"))
                for path, sent in reads:
                    declined, answered = _declined(), _answered()
                    status, found, _ = await _post(client, admin, path, sent)
                    assert (status, found.get("retry-after")) == (503, "2"), (path, sent)
                    assert (_declined(), _answered()) == (declined, answered), (path, sent)
                await held.rollback()
            assert (await _post(client, admin, *reads[0]))[0] == 200
