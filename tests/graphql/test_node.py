"""Relay's global object identification (CONTRACT section 10, "Client caches and Relay"),
through the real app: `node(id:)` answers as the caller's own tenant sees the object,
null where `pool` would be NOT_FOUND; `offerPool` answers an OfferedPool with an id of
its own. The client libraries themselves run in test_client_caches.py."""

from __future__ import annotations

from typing import Any

from tests.support import Api, Fleet

NODE = """query($id: ID!) { node(id: $id) { __typename id
  ... on Pool { owned viewerTenantId quotas { resource max } }
  ... on Offer { tenantId priority quotas { resource max } } } }"""
OFFER = """mutation($input: OfferPoolInput!) { offerPool(input: $input) {
  pool { __typename id poolId viewerTenantId owned quotas { resource max } } } }"""


async def _node(api: Api, token: str, node_id: str) -> dict[str, Any]:
    return await api.graphql(token, NODE, {"id": node_id})


async def test_node_refetches_as_the_callers_own_tenant(api: Api, fleet: Fleet) -> None:
    for tenant in ("acme", "globex", "initech"):
        await fleet.tenant(tenant)
    site = await fleet.site("acme")
    owner = await fleet.caller("acme", "admin")
    operator = await fleet.caller("acme", "operator")  # no compute:pools:share
    guest = await fleet.caller("globex", "admin")
    stranger = await fleet.caller("initech", "admin")
    admin = await fleet.caller("fleet", "fleet-admin")
    body = {"tenantId": "acme", "siteId": site, "class": "metal-host"}
    pool_id = (await api.ok(owner, "pools/create", body))["pool"]["id"]
    quota = [{"resource": "gpu", "max": 3}]
    offer = {"tenantId": "acme", "poolId": pool_id, "toTenantId": "globex", "quota": quota}
    offered = await api.graphql(owner, OFFER, {"input": offer})
    assert offered["data"]["offerPool"]["pool"] == {
        "__typename": "OfferedPool",
        "id": f"offered:{pool_id}:globex",
        "poolId": pool_id,
        "viewerTenantId": "globex",
        "owned": False,
        "quotas": [{"resource": "gpu", "max": 3}],
    }

    mine = (await _node(api, owner, pool_id))["data"]["node"]
    assert mine["__typename"] == "Pool" and mine["id"] == pool_id
    assert mine["owned"] is True and mine["viewerTenantId"] == "acme"
    theirs = (await _node(api, guest, pool_id))["data"]["node"]
    assert theirs["owned"] is False and theirs["viewerTenantId"] == "globex"
    assert theirs["quotas"] == [{"resource": "gpu", "max": 3}]

    offer_id = f"offer:{pool_id}:globex"
    found = (await _node(api, owner, offer_id))["data"]["node"]
    assert found == {
        "__typename": "Offer",
        "id": offer_id,
        "tenantId": "globex",
        "priority": 0,
        "quotas": [{"resource": "gpu", "max": 3}],
    }
    # As Pool.offers withholds them from an owner's caller without compute:pools:share.
    denied = await _node(api, operator, offer_id)
    assert denied["data"]["node"] is None
    assert [e["extensions"]["code"] for e in denied["errors"]] == ["PERMISSION_DENIED"]

    # Null, with no error, wherever `pool` would be NOT_FOUND: no oracle.
    unknown_pool = "pool_" + "0" * 26
    for token, node_id in (
        (stranger, pool_id),
        (stranger, offer_id),
        (guest, offer_id),  # not the owner: no offers to show
        (admin, pool_id),  # a fleet admin's own tenant is `fleet`
        (admin, offer_id),
        (owner, unknown_pool),
        (owner, f"offer:{pool_id}:initech"),  # no such offer
        (owner, f"offered:{pool_id}:globex"),  # the offered view is not a Node
        (owner, "nope"),
        (owner, "offer:pool_x"),
        (owner, f"{pool_id}:x"),
    ):
        answer = await _node(api, token, node_id)
        assert answer["data"] == {"node": None} and "errors" not in answer, (node_id, answer)
    missing = await api.graphql(
        stranger,
        'query($p: ID!) { pool(tenantId: "initech", poolId: $p) { id } }',
        {"p": pool_id},
    )
    assert missing["errors"][0]["extensions"]["code"] == "NOT_FOUND"
