"""The lender's view (CONTRACT section 10): offered, guestUsed and overcommit on the
owner's capacity rows, GraphQL `Pool.lending`, and the owner's fleet ranked by overcommit."""

from __future__ import annotations

from typing import Any

from tests.rest.scene import Scene
from tests.support import Api, Fleet

POOL = """
query($t: String!, $p: ID!) {
  pool(tenantId: $t, poolId: $p) {
    capacity { resource allocatable booked offered guestUsed overcommit }
    lending { tenantId includeDescendants priority quotas { resource max used } }
  }
}
"""
RANKED = """
query($t: String!, $n: Int) {
  lending(tenantId: $t, first: $n) {
    poolId resource total allocatable booked available offered guestUsed overcommit
  }
}
"""


async def _lent_pool(s: Scene, gpus: int, **quotas: int) -> tuple[str, dict[str, str]]:
    pool_id = (await s.pool())["id"]
    if gpus:
        await s.fleet.node(pool_id, gpus)
    tokens = {}
    for tenant, gpu in quotas.items():
        if tenant not in s.fleet.tokens:
            s.fleet.tokens[tenant] = await s.guest(tenant)
        tokens[tenant] = s.fleet.tokens[tenant]
        await s.offer(pool_id, tenant, {"gpu": gpu})
    return pool_id, tokens


async def test_the_owner_sees_what_it_lent(api: Api, fleet: Fleet) -> None:
    s = await Scene.start(api, fleet)
    pool_id, tokens = await _lent_pool(s, 8, beta=6, gamma=4)
    await s.reserve(pool_id, {"gpu": 2}, tokens["beta"], "beta")
    await s.reserve(pool_id, {"gpu": 1})  # the owner's own: not guest use

    (row,) = (await api.ok(s.token, "pools/capacity", s.body(pool_id)))["capacity"]
    assert row == {
        "resource": "gpu",
        "total": 8,
        "allocatable": 8,
        "booked": 3,
        "available": 5,
        "offered": 10,
        "guestUsed": 2,
        "overcommit": 1.25,
    }
    answer = await api.graphql(s.token, POOL, {"t": "acme", "p": pool_id})
    assert "errors" not in answer, answer
    pool = answer["data"]["pool"]
    assert pool["capacity"] == [{k: row[k] for k in pool["capacity"][0]}]
    assert pool["lending"] == [
        {
            "tenantId": "beta",
            "includeDescendants": False,
            "priority": 0,
            "quotas": [{"resource": "gpu", "max": 6, "used": 2}],
        },
        {
            "tenantId": "gamma",
            "includeDescendants": False,
            "priority": 0,
            "quotas": [{"resource": "gpu", "max": 4, "used": 0}],
        },
    ]


async def test_only_the_owner_with_share_sees_it(api: Api, fleet: Fleet) -> None:
    """Guests and the owner's callers without compute:pools:share see the plain rows;
    `lending` is null for them, as `offers` is: with PERMISSION_DENIED for the owner's
    caller, with no error for a guest (it owns nothing to show, CONTRACT 9)."""
    s = await Scene.start(api, fleet)
    pool_id, tokens = await _lent_pool(s, 4, beta=2)
    viewer = await fleet.caller("acme", "viewer")
    plain = {"resource", "total", "allocatable", "booked", "available"}
    for token, tenant in ((viewer, "acme"), (tokens["beta"], "beta")):
        body = {"tenantId": tenant, "poolId": pool_id}
        (row,) = (await api.ok(token, "pools/capacity", body))["capacity"]
        assert set(row) == plain
        answer = await api.graphql(token, POOL, {"t": tenant, "p": pool_id})
        pool = answer["data"]["pool"]
        assert pool["lending"] is None
        assert pool["capacity"][0]["offered"] is None and pool["capacity"][0]["overcommit"] is None
        denied = ["PERMISSION_DENIED"] if tenant == "acme" else []
        assert [e["extensions"]["code"] for e in answer.get("errors", [])] == denied

    # The ranking: the role needs compute:pools:share; a guest's own fleet lends nothing.
    status, error = await api.fails(viewer, "pools/lending", {"tenantId": "acme"})
    assert (status, error["code"]) == (403, "PERMISSION_DENIED")
    assert await api.ok(tokens["beta"], "pools/lending", {"tenantId": "beta"}) == {"lending": []}


async def test_the_fleet_ranked_by_overcommit_in_one_request(api: Api, fleet: Fleet) -> None:
    s = await Scene.start(api, fleet)
    calm, _ = await _lent_pool(s, 8, beta=2)  # 0.25
    tight, _ = await _lent_pool(s, 4, beta=4, gamma=4)  # 2.0
    unlent, _ = await _lent_pool(s, 2)  # 0.0
    archived, _ = await _lent_pool(s, 2, beta=9)
    await s.archive(archived)  # no longer lent: left out
    fleet.tokens["acme"] = s.token
    await s.guest("delta")
    others = Scene(api, fleet, "delta", await fleet.caller("delta", "admin"), "")
    others.site = await fleet.site("delta")
    await _lent_pool(others, 1, acme=5)  # a pool acme is offered, not one it owns

    ranked = (await api.ok(s.token, "pools/lending", {"tenantId": "acme"}))["lending"]
    order = [(r["poolId"], r["overcommit"]) for r in ranked]
    assert order == [(tight, 2.0), (calm, 0.25), (unlent, 0.0)]
    assert ranked[0] | {"poolId": "x"} == {
        "poolId": "x",
        "resource": "gpu",
        "total": 4,
        "allocatable": 4,
        "booked": 0,
        "available": 4,
        "offered": 8,
        "guestUsed": 0,
        "overcommit": 2.0,
    }
    answer = await api.graphql(s.token, RANKED, {"t": "acme", "n": 2})
    assert "errors" not in answer, answer
    assert answer["data"]["lending"] == ranked[:2]
    top: list[dict[str, Any]] = (
        await api.ok(s.token, "pools/lending", {"tenantId": "acme", "first": 1})
    )["lending"]
    assert top == ranked[:1]
