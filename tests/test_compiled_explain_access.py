"""REST `pools/explain` and GraphQL `access`, answered by their compiled statement
(app/capacity/json_reads.py: AccessShape, the facts one statement reads, decided by the
plain read's rule, explain.explanation, once parsed), give the plain path's bytes for
every caller of the compiled world (owner, guest, descendant, stranger, fleet admin,
narrowed, revoked), every pool (archived included, and one that does not exist), every
permission and bad input, on both dialects; each is one statement."""

from __future__ import annotations

from typing import Any, get_args

import httpx
import orjson
import pytest
from prometheus_client import REGISTRY

from app.capacity.inputs import PoolPermission
from app.capacity.service import Capacity
from tests.compiled_world import CALLERS, Pair, World, pair, world

__all__ = ["pair", "world"]  # fixtures
# The compiled path against the plain one: nothing to compare on the plain path.
pytestmark = pytest.mark.fast_path

MISSING = "pool_01j00000000000000000000000"
PERMISSIONS: tuple[str, ...] = get_args(PoolPermission)
READ = "compute:pools:read"
EXPLAIN = "/api/compute/pools/explain"
ACCESS = (
    "query($t: String!, $p: ID!, $perm: String!) { access(tenantId: $t, poolId: $p, "
    "permission: $perm) { allowed permission __typename binding { callerId tenantId role "
    "where actingFor fleetAdmin } grant { via tenantId includeDescendants priority "
    "offeredAt __typename } deniedBy { check message key } } }"
)
# Aliases, a part of the selection, the root's __typename.
ACCESS_ALIASED = (
    "query A($t: String!, $p: ID!) { __typename why: access(tenantId: $t, poolId: $p, "
    'permission: "compute:pools:share") { ok: allowed deniedBy { key check } '
    "g: grant { offeredAt via } } }"
)


def _count(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _answered() -> float:
    return _count("bettercompute_compiled_reads_total", outcome="answered")


async def _post(client: httpx.AsyncClient, token: str, path: str, body: Any) -> tuple[Any, ...]:
    response = await client.post(path, json=body, headers={"authorization": f"Bearer {token}"})
    headers = {k: v for k, v in response.headers.items() if k != "x-request-id"}
    return response.status_code, headers, response.content


def _explain(tenant: str, pool: str, permission: str) -> tuple[str, Any]:
    return EXPLAIN, {"tenantId": tenant, "poolId": pool, "permission": permission}


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
async def test_explain_and_access_answer_alike(pair: Pair, world: World, dialect: str) -> None:
    before = _answered()
    pools = [*world.pools.values(), MISSING]
    n = 0
    for caller in CALLERS:
        token = world.tokens[caller]
        for tenant in ("acme", "globex", "globex-dev", "initech"):
            for pool in pools:
                # Two permissions each time, every permission in turn.
                for permission in (PERMISSIONS[n % 6], PERMISSIONS[(n + 3) % 6]):
                    await _alike(pair, token, *_explain(tenant, pool, permission))
                n += 1
                perm = PERMISSIONS[n % 6]
                await _alike(pair, token, *_graphql(ACCESS, t=tenant, p=pool, perm=perm))
                await _alike(pair, token, *_graphql(ACCESS_ALIASED, t=tenant, p=pool))
    p0 = world.pools["p0"]
    bad: list[Any] = [
        {"tenantId": "acme", "poolId": p0},
        {"tenantId": "acme", "poolId": p0, "permission": "compute:nothing"},
        {"tenantId": "acme", "poolId": "x", "permission": "compute:pools:read"},
        {"tenantId": "acme", "poolId": p0, "permission": "compute:pools:read", "colour": "red"},
        [],
        "x",
    ]
    for body in bad:
        status, _, _ = await _alike(pair, world.tokens["acme-admin"], EXPLAIN, body)
        assert status == 400, body
    await _alike(pair, world.tokens["acme-admin"], *_graphql(ACCESS, t="acme", p=p0, perm="x"))
    answered = _answered() - before
    assert answered >= 150, (dialect, answered)  # the compiled path answers on both


async def test_what_the_compiled_explanation_says(pair: Pair, world: World) -> None:
    """Compiled answers, read: the owner's grant, a guest's own offer, the descendant's
    ancestor offer (with its terms), a role that lacks the permission, an owner-only
    permission asked by a guest; an archived pool is explained to its owner only."""
    p0, p4 = world.pools["p0"], world.pools["p4"]

    async def explained(caller: str, tenant: str, pool: str, permission: str) -> Any:
        before = _answered()
        for _ in range(2):  # the first remembers the caller
            status, _, body = await _post(
                pair.fast, world.tokens[caller], *_explain(tenant, pool, permission)
            )
        assert _answered() > before, (caller, tenant, pool, permission)
        assert status == 200, body
        return orjson.loads(body)["access"]

    owner = await explained("acme-admin", "acme", p0, "compute:pools:share")
    assert owner["allowed"] and owner["grant"]["via"] == "owner" and owner["deniedBy"] is None
    guest = await explained("globex-viewer", "globex", p0, "compute:pools:read")
    assert guest["grant"] == {
        "via": "offer",
        "tenantId": "globex",
        "includeDescendants": True,
        "priority": 5,
        "offeredAt": guest["grant"]["offeredAt"],
    }
    assert guest["grant"]["offeredAt"].endswith("Z")
    dev = await explained("dev-viewer", "globex-dev", p0, "compute:reservations:write")
    assert dev["grant"]["via"] == "ancestorOffer" and dev["grant"]["tenantId"] == "globex"
    assert dev["deniedBy"] == {
        "check": "role",
        "message": "role viewer lacks compute:reservations:write",
    }
    shared = await explained("globex-admin", "globex", p0, "compute:pools:share")
    assert shared["deniedBy"]["check"] == "owner" and "key" not in shared["deniedBy"]
    archived = await explained("acme-viewer", "acme", p4, "compute:pools:read")
    assert archived["allowed"] and archived["grant"]["via"] == "owner"
    # A guest no longer sees the archived pool: NOT_FOUND, as for a pool that never was.
    guest = world.tokens["globex-viewer"]
    for pool in (p4, MISSING):
        status, _, body = await _post(pair.fast, guest, *_explain("globex", pool, READ))
        assert status == 404, body
        assert orjson.loads(body)["error"]["message"] == f"pool {pool} not found", body


async def test_narrowed_and_revoked_callers_are_left_to_the_plain_path(
    pair: Pair, world: World
) -> None:
    """A narrowed binding's explanation (its `where` check) and a revoked token's refusal
    are the plain path's: the compiled read declines both."""
    p0, p1 = world.pools["p0"], world.pools["p1"]
    for caller in ("acme-narrowed", "revoked"):
        for pool in (p0, p1):
            await _post(pair.fast, world.tokens[caller], *_explain("acme", pool, READ))
            before = _answered()
            await _alike(pair, world.tokens[caller], *_explain("acme", pool, READ))
            assert _answered() == before, caller
    status, _, body = await _post(
        pair.fast, world.tokens["acme-narrowed"], *_explain("acme", p1, "compute:pools:read")
    )
    assert status == 200
    denied = orjson.loads(body)["access"]
    assert denied["deniedBy"]["check"] == "where" and denied["deniedBy"]["key"] == "gpuModel"
    assert denied["grant"] is None  # a pool its binding excludes is not read


async def test_one_statement_each(pair: Pair, world: World) -> None:
    app: Any = pair.fast._transport.app  # type: ignore[attr-defined]
    capacity: Capacity = app.state.capacity
    pooled = capacity.db.pooled_by_transaction
    token = world.tokens["globex-viewer"]
    p0 = world.pools["p0"]
    reads = [
        ("rest", _explain("globex", p0, "compute:pools:read")),
        ("graphql", _graphql(ACCESS, t="globex", p=p0, perm="compute:pools:read")),
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
