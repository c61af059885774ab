from tests.support import Api, Fleet


async def test_create_then_get_round_trip(api: Api, fleet: Fleet) -> None:
    await fleet.tenant("acme")
    site = await fleet.site("acme")
    token = await fleet.caller("acme", "admin")
    created = await api.ok(
        token, "pools/create", {"tenantId": "acme", "siteId": site, "class": "metal-host"}
    )
    pool = created["pool"]
    got = await api.ok(token, "pools/get", {"tenantId": "acme", "poolId": pool["id"]})
    assert got["pool"] == pool
    assert pool["version"] == 1 and pool["sharing"] == "exclusive" and pool["agent"] == "bcd"
