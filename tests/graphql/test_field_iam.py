"""Per-field IAM: a field its caller may not see is null with its own error, and the rest
of the query still answers; hidden pools are NOT_FOUND as on REST."""

from __future__ import annotations

from tests.support import Api, Fleet

POOLS = """query($t: String!) { pools(tenantId: $t) { nodes {
  id owned quotas { resource max } capacity { resource total }
  offers { tenantId quotas { resource max } } } } }"""


async def test_viewer_gets_offers_null_with_an_error_and_the_rest_answers(
    api: Api, fleet: Fleet
) -> None:
    await fleet.tenant("acme")
    site = await fleet.site("acme")
    admin = await fleet.caller("acme", "admin")
    viewer = await fleet.caller("acme", "viewer")
    for _ in range(2):
        body = {"tenantId": "acme", "siteId": site, "class": "vps-host"}
        await api.ok(admin, "pools/create", body)

    answer = await api.graphql(viewer, POOLS, {"t": "acme"})
    nodes = answer["data"]["pools"]["nodes"]
    assert len(nodes) == 2
    assert all(n["offers"] is None and n["quotas"] and n["capacity"] == [] for n in nodes)
    errors = answer["errors"]
    assert len(errors) == 2
    assert {e["extensions"]["code"] for e in errors} == {"PERMISSION_DENIED"}
    assert sorted(e["path"][-2] for e in errors) == [0, 1]
    assert all(e["path"][-1] == "offers" for e in errors)

    owner_view = await api.graphql(admin, POOLS, {"t": "acme"})
    assert "errors" not in owner_view
    assert all(n["offers"][0]["tenantId"] == "acme" for n in owner_view["data"]["pools"]["nodes"])


async def test_an_offered_tenant_never_sees_other_tenants_rows(api: Api, fleet: Fleet) -> None:
    for tenant in ("acme", "beta", "gamma"):
        await fleet.tenant(tenant)
    site = await fleet.site("acme")
    admin = await fleet.caller("acme", "admin")
    beta = await fleet.caller("beta", "admin")
    body = {"tenantId": "acme", "siteId": site, "class": "metal-host"}
    pool_id = (await api.ok(admin, "pools/create", body))["pool"]["id"]
    hidden_id = (await api.ok(admin, "pools/create", body))["pool"]["id"]
    for tenant, amount in (("beta", 2), ("gamma", 5)):
        offer = {
            "tenantId": "acme",
            "poolId": pool_id,
            "toTenantId": tenant,
            "quota": {"gpu": amount},
        }
        await api.ok(admin, "pools/offer", offer)

    answer = await api.graphql(beta, POOLS, {"t": "beta"})
    (node,) = answer["data"]["pools"]["nodes"]
    assert node["quotas"] == [{"resource": "gpu", "max": 2}]
    # Not the owner: nothing to show, nothing denied (CONTRACT 9, as REST's `offers: null`).
    assert node["offers"] is None and node["owned"] is False
    assert "errors" not in answer

    quotas = await api.graphql(beta, '{ quotas(tenantId: "beta") { poolId resource max } }')
    assert quotas["data"]["quotas"] == [{"poolId": pool_id, "resource": "gpu", "max": 2}]

    for document in (
        '{ pool(tenantId: "beta", poolId: "%s") { id } }',
        '{ capacity(tenantId: "beta", poolId: "%s") { resource } }',
        '{ quotas(tenantId: "beta", poolId: "%s") { max } }',
    ):
        hidden = await api.graphql(beta, document % hidden_id)
        assert hidden["data"] is None
        assert hidden["errors"][0]["extensions"] == {"code": "NOT_FOUND", "field": "poolId"}

    other = await api.graphql(beta, POOLS, {"t": "gamma"})
    assert other["data"] is None
    assert other["errors"][0]["extensions"]["code"] == "PERMISSION_DENIED"
