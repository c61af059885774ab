"""No tenant-existence oracle through offers (issue 19, item 11; docs/decisions/0001).

A tenant's admin cannot see other tenants, and the seed has it offer pools to them, so an
offer to a tenant id no tenant holds is taken and answered exactly as one to a real tenant
(that has no history with the pool): on REST and GraphQL, through offer, its resize, the
owner's reads, lending, the dry run, unoffer, explain and the event. Such an offer stays
inert until a tenant of that id is made. A fleet admin, which may act for any tenant and so
knows which exist, is still told NOT_FOUND (a typo in a fleet file)."""

from __future__ import annotations

from typing import Any

from tests.rest.scene import Scene, events
from tests.support import Api, Fleet

MASK = ("createdAt", "updatedAt", "offeredAt", "occurredAt", "cursor", "seq")

OFFER = """
mutation($t: String!, $p: ID!, $to: String!, $gpu: Long!) {
  offerPool(input: {tenantId: $t, poolId: $p, toTenantId: $to,
                    quota: [{resource: "gpu", max: $gpu}], priority: 3}) {
    pool {
      id tenantId owned archived version policy region createdAt updatedAt
      quotas { poolId resource max used grant { via tenantId includeDescendants priority } }
      capacity { resource total allocatable booked available }
      offers { tenantId includeDescendants priority quotas { resource max used } }
      lending { tenantId }
      reservations { nodes { id } pageInfo { hasNextPage } }
    }
  }
}
"""
OWNER_VIEW = """
query($t: String!, $p: ID!) {
  pool(tenantId: $t, poolId: $p) {
    version
    offers { tenantId includeDescendants priority quotas { resource max used } }
    lending { tenantId includeDescendants priority quotas { resource max used } }
    capacity { resource offered guestUsed overcommit }
  }
}
"""
UNOFFER = """
mutation($t: String!, $p: ID!, $to: String!, $dry: Boolean) {
  unofferPool(input: {tenantId: $t, poolId: $p, toTenantId: $to, dryRun: $dry}) {
    removed
    impact { tenantsLosingAccess quotaKept offersEnded truncated reservations { id } }
  }
}
"""


def masked(value: Any, names: dict[str, str]) -> Any:
    """The answer with ids and times put to placeholders, so two runs compare."""
    if isinstance(value, dict):
        return {
            names.get(k, k): "<time>" if k in MASK else masked(v, names) for k, v in value.items()
        }
    if isinstance(value, list):
        return [masked(v, names) for v in value]
    if isinstance(value, str):
        for real, placeholder in names.items():
            value = value.replace(real, placeholder)
    return value


async def _rest_story(s: Scene, pool_id: str, to: str) -> list[Any]:
    api, names = s.api, {pool_id: "<pool>", to: "<tenant>"}
    answers: list[Any] = []

    async def call(path: str, body: dict[str, Any]) -> None:
        response = await api.post(s.token, path, body)
        answers.append(masked([path, response.status_code, response.json()], names))

    await call("pools/offer", s.body(pool_id, toTenantId=to, quota={"gpu": 4}))
    await call("pools/offer", s.body(pool_id, toTenantId=to, quota={"gpu": 6, "nvme": 1}))
    await call("pools/get", s.body(pool_id))
    await call("pools/capacity", s.body(pool_id))
    await call("pools/unoffer", s.body(pool_id, toTenantId=to, dryRun=True))
    # Acting for the target is refused alike, whether it exists or not.
    await call("pools/get", {"tenantId": to, "poolId": pool_id})
    await call("pools/list", {"tenantId": to})
    permission = "compute:pools:read"
    await call("pools/explain", {"tenantId": to, "poolId": pool_id, "permission": permission})
    await call("pools/unoffer", s.body(pool_id, toTenantId=to))
    await call("pools/unoffer", s.body(pool_id, toTenantId=to))
    await call("pools/unoffer", s.body(pool_id, toTenantId=to, dryRun=True))
    # Offered again, then the writes that refresh or end every offer.
    await call("pools/offer", s.body(pool_id, toTenantId=to, quota={"gpu": 2}))
    await call("pools/update", s.body(pool_id, gpuModel="H200"))
    await call("pools/archive", s.body(pool_id, dryRun=True))
    await call("pools/archive", s.body(pool_id))
    stored = await events(s.fleet.db, pool_id)
    answers.append(masked([[e.type, e.data, sorted(e.audience)] for e in stored], names))
    return answers


async def test_rest_answers_an_offer_to_a_missing_tenant_as_one_to_a_real_tenant(
    api: Api, fleet: Fleet
) -> None:
    s = await Scene.start(api, fleet)
    await fleet.tenant("beta")
    real, missing = (await s.pool(gpuModel="H100"))["id"], (await s.pool(gpuModel="H100"))["id"]
    for pool_id in (real, missing):
        await fleet.node(pool_id, 8)

    seen_real = await _rest_story(s, real, "beta")
    seen_missing = await _rest_story(s, missing, "nobody")
    assert seen_real == seen_missing
    assert seen_real[0][1] == 200  # the offer was taken, not refused
    assert seen_real[8][2] == {"removed": True}


async def test_graphql_answers_an_offer_to_a_missing_tenant_as_one_to_a_real_tenant(
    api: Api, fleet: Fleet
) -> None:
    s = await Scene.start(api, fleet)
    await fleet.tenant("beta")
    pools = [(await s.pool(gpuModel="H100"))["id"] for _ in range(2)]
    stories = []
    for pool_id, to in zip(pools, ("beta", "nobody"), strict=True):
        names = {pool_id: "<pool>", to: "<tenant>"}
        owner = {"t": s.owner, "p": pool_id}
        story = []
        for gpu in (4, 6):
            story.append(await api.graphql(s.token, OFFER, {**owner, "to": to, "gpu": gpu}))
        story.append(await api.graphql(s.token, OWNER_VIEW, owner))
        for dry in (True, False, False):
            story.append(await api.graphql(s.token, UNOFFER, {**owner, "to": to, "dry": dry}))
        # Acting for the target: the same refusal either way.
        story.append(await api.graphql(s.token, OWNER_VIEW, {"t": to, "p": pool_id}))
        stories.append(masked(story, names))
    assert stories[0] == stories[1]
    offered = stories[0][0]
    assert "errors" not in offered, offered
    assert offered["data"]["offerPool"]["pool"]["owned"] is False
    assert stories[0][-1]["errors"][0]["extensions"]["code"] == "PERMISSION_DENIED"


async def test_an_offer_to_a_missing_tenant_is_inert_until_that_tenant_is_made(
    api: Api, fleet: Fleet
) -> None:
    """The stored offer gives no one anything; a tenant later made with that id holds it,
    as it would hold any offer made to it (the owner's view does not move either way)."""
    s = await Scene.start(api, fleet)
    pool_id = (await s.pool())["id"]
    await s.offer(pool_id, "later", {"gpu": 2})
    before = await s.get(pool_id)

    await fleet.tenant("later")
    token = await fleet.caller("later", "viewer")
    seen = await s.get(pool_id, token, "later")
    assert [(q["resource"], q["max"]) for q in seen["quotas"]] == [("gpu", 2)]
    assert await s.get(pool_id) == before


async def test_a_fleet_admin_is_told_the_tenant_is_missing(api: Api, fleet: Fleet) -> None:
    """It may act for any tenant, so NOT_FOUND tells it nothing it cannot learn anyway."""
    s = await Scene.start(api, fleet)
    pool_id = (await s.pool())["id"]
    operator = await fleet.caller("fleet", "fleet-admin")
    body = s.body(pool_id, toTenantId="nobody", quota={"gpu": 1})
    status, error = await api.fails(operator, "pools/offer", body)
    assert (status, error["code"], error["details"]["field"]) == (404, "NOT_FOUND", "toTenantId")
    assert [o["tenantId"] for o in (await s.get(pool_id))["offers"]] == ["acme"]
