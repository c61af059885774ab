"""Quota provenance (CONTRACT section 10, effective quota): each quota row a tenant sees
names the offer that gives it, and a descendant sees the ancestor's rows it books against."""

from __future__ import annotations

from typing import Any

from tests.rest.scene import Scene
from tests.support import Api, Fleet

QUOTAS = """
query($t: String!, $p: ID!) {
  quotas(tenantId: $t, poolId: $p) {
    resource max used grant { tenantId includeDescendants priority offeredAt }
  }
  pool(tenantId: $t, poolId: $p) {
    quotas { resource max used grant { tenantId includeDescendants priority offeredAt } }
  }
}
"""
OFFERS = """
query($t: String!, $p: ID!) {
  pool(tenantId: $t, poolId: $p) { offers { tenantId quotas { resource grant { tenantId } } } }
}
"""


async def _seen(api: Api, token: str, tenant: str, pool_id: str) -> list[dict[str, Any]]:
    """The tenant's quota rows on REST get and list, GraphQL `quotas` and `Pool.quotas`:
    all four the same."""
    body = {"tenantId": tenant, "poolId": pool_id}
    got = (await api.ok(token, "pools/get", body))["pool"]["quotas"]
    listed = (await api.ok(token, "pools/list", {"tenantId": tenant}))["pools"]
    assert [p["quotas"] for p in listed if p["id"] == pool_id] == [got]
    answer = await api.graphql(token, QUOTAS, {"t": tenant, "p": pool_id})
    assert "errors" not in answer, answer
    assert answer["data"]["quotas"] == got
    assert answer["data"]["pool"]["quotas"] == got
    rows: list[dict[str, Any]] = got
    return rows


async def test_each_row_names_the_offer_that_gives_it(api: Api, fleet: Fleet) -> None:
    s = await Scene.start(api, fleet)
    beta = await s.guest("beta")
    lab = await s.guest("beta-lab", parent="beta")
    pool = await s.pool(ownerQuota={"gpu": 8})
    await fleet.node(pool["id"], 8)
    offered = await s.offer(pool["id"], "beta", {"gpu": 4}, includeDescendants=True, priority=5)
    await s.reserve(pool["id"], {"gpu": 1}, lab, "beta-lab")  # booked on beta's row

    owner_rows = await _seen(api, s.token, "acme", pool["id"])
    owner_grant = {
        "tenantId": "acme",
        "includeDescendants": False,
        "priority": 0,
        "offeredAt": pool["createdAt"],
    }
    assert owner_rows == [{"resource": "gpu", "max": 8, "used": 0, "grant": owner_grant}]

    beta_rows = await _seen(api, beta, "beta", pool["id"])
    (row,) = beta_rows
    assert (row["max"], row["used"]) == (4, 1)
    grant = row["grant"]
    assert (grant["tenantId"], grant["includeDescendants"], grant["priority"]) == ("beta", True, 5)
    assert grant["offeredAt"] >= pool["createdAt"]
    # The offer's answer (the pool as beta saw it then, before the booking) agrees.
    assert [q | {"used": 1} for q in offered["quotas"]] == beta_rows

    # The descendant has no rows of its own: it sees, read-only, the ancestor's it books on.
    assert await _seen(api, lab, "beta-lab", pool["id"]) == beta_rows

    # The owner's offers list stays as it was: rows without a grant (the offer says it).
    answer = await api.graphql(s.token, OFFERS, {"t": "acme", "p": pool["id"]})
    offers = answer["data"]["pool"]["offers"]
    assert [q["grant"] for o in offers for q in o["quotas"]] == [None, None]
    rest_offers = (await api.ok(s.token, "pools/get", s.body(pool["id"])))["pool"]["offers"]
    assert all("grant" not in q for o in rest_offers for q in o["quotas"])


async def test_own_offer_wins_over_the_ancestors(api: Api, fleet: Fleet) -> None:
    """A descendant with an offer of its own books on its own rows, and sees those; other
    tenants' rows stay hidden."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    lab = await s.guest("beta-lab", parent="beta")
    await s.guest("gamma")
    pool = await s.pool()
    await s.offer(pool["id"], "beta", {"gpu": 4}, includeDescendants=True)
    await s.offer(pool["id"], "gamma", {"gpu": 6})
    await s.offer(pool["id"], "beta-lab", {"gpu": 2}, priority=-3)
    (row,) = await _seen(api, lab, "beta-lab", pool["id"])
    assert (row["max"], row["grant"]["tenantId"], row["grant"]["priority"]) == (2, "beta-lab", -3)

    # Withdrawn: back to the ancestor's rows (its own are no longer what it books on).
    await s.unoffer(pool["id"], "beta-lab")
    (row,) = await _seen(api, lab, "beta-lab", pool["id"])
    assert (row["max"], row["grant"]["tenantId"]) == (4, "beta")
