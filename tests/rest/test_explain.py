"""Why can I see this: `POST /api/compute/pools/explain` and GraphQL `access`
(CONTRACT section 10, Explain)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.rest.pool_calls import HIDDEN_BY, hide_from_guest
from tests.rest.scene import Scene
from tests.support import Api, Fleet

READ, SHARE, MANAGE = "compute:pools:read", "compute:pools:share", "compute:pools:manage"
BOOK = "compute:reservations:write"

ACCESS = """
query($t: String!, $p: ID!, $perm: String!) {
  access(tenantId: $t, poolId: $p, permission: $perm) {
    allowed permission
    binding { callerId tenantId role where actingFor fleetAdmin }
    grant { via tenantId includeDescendants priority offeredAt }
    deniedBy { check message key }
  }
}
"""


async def explain(api: Api, token: str, tenant: str, pool_id: str, permission: str) -> Any:
    """The REST answer, checked equal to GraphQL's for the same call."""
    body = {"tenantId": tenant, "poolId": pool_id, "permission": permission}
    rest = (await api.ok(token, "pools/explain", body))["access"]
    variables = {"t": tenant, "p": pool_id, "perm": permission}
    graphql = await api.graphql(token, ACCESS, variables)
    assert "errors" not in graphql, graphql
    denial = rest["deniedBy"]
    assert graphql["data"]["access"] == rest | {
        "deniedBy": None if denial is None else {"key": None, **denial}
    }
    return rest


async def test_the_owner_is_allowed_through_its_own_offer(api: Api, fleet: Fleet) -> None:
    s = await Scene.start(api, fleet)
    pool = await s.pool()
    answer = await explain(api, s.token, "acme", pool["id"], SHARE)
    assert answer["allowed"] is True and answer["deniedBy"] is None
    assert answer["grant"]["via"] == "owner" and answer["grant"]["tenantId"] == "acme"
    assert answer["grant"]["offeredAt"] == pool["createdAt"]
    binding = answer["binding"]
    assert (binding["tenantId"], binding["role"], binding["where"]) == ("acme", "admin", {})
    assert (binding["actingFor"], binding["fleetAdmin"]) == ("acme", False)
    assert binding["callerId"].startswith("caller_")


async def test_a_guest_sees_its_offer_or_its_ancestors(api: Api, fleet: Fleet) -> None:
    """The grant: the tenant's own offer, or the ancestor's with includeDescendants; an
    owner-only permission is denied by `owner`, before the role is asked."""
    s = await Scene.start(api, fleet)
    beta = await s.guest("beta")
    child = await s.guest("beta-dev", parent="beta")
    pool = await s.pool()
    await s.offer(pool["id"], "beta", {"gpu": 2}, includeDescendants=True, priority=7)

    own = await explain(api, beta, "beta", pool["id"], BOOK)
    assert own["allowed"] is True
    assert own["grant"] | {"offeredAt": None} == {
        "via": "offer",
        "tenantId": "beta",
        "includeDescendants": True,
        "priority": 7,
        "offeredAt": None,
    }
    inherited = await explain(api, child, "beta-dev", pool["id"], READ)
    assert (inherited["allowed"], inherited["grant"]["via"]) == (True, "ancestorOffer")
    assert inherited["grant"]["tenantId"] == "beta"

    denied = await explain(api, beta, "beta", pool["id"], SHARE)
    assert denied["allowed"] is False
    assert denied["deniedBy"]["check"] == "owner"


async def test_the_role_then_the_binding_conditions(api: Api, fleet: Fleet) -> None:
    """The first check that fails: a role without the permission, then a `--where`
    condition that does not match (named by key; the pool's value is not shown, and neither
    is the grant to a caller that may not read the pool)."""
    s = await Scene.start(api, fleet)
    pool = await s.pool(gpuModel="H100")
    viewer = await fleet.caller("acme", "viewer")
    answer = await explain(api, viewer, "acme", pool["id"], MANAGE)
    assert (answer["allowed"], answer["deniedBy"]["check"]) == (False, "role")
    assert (await explain(api, viewer, "acme", pool["id"], READ))["allowed"] is True

    narrowed = await fleet.caller("acme", "admin", gpuModel="A100")
    answer = await explain(api, narrowed, "acme", pool["id"], READ)
    assert answer["allowed"] is False and answer["grant"] is None
    assert answer["deniedBy"]["check"] == "where" and answer["deniedBy"]["key"] == "gpuModel"
    assert "H100" not in str(answer)
    assert answer["binding"]["where"] == {"gpuModel": "A100"}
    # The same caller's get agrees: the pool is visible, the permission is not granted.
    status, _ = await api.fails(narrowed, "pools/get", s.body(pool["id"]))
    assert status == 403

    fleet_admin = await fleet.caller("fleet", "fleet-admin")
    answer = await explain(api, fleet_admin, "acme", pool["id"], SHARE)
    assert answer["allowed"] is True and answer["binding"]["fleetAdmin"] is True


@pytest.mark.parametrize("hidden_by", HIDDEN_BY)
async def test_a_pool_the_tenant_cannot_see_is_answered_as_get(
    api: Api, fleet: Fleet, hidden_by: str
) -> None:
    """No answer reveals that a pool exists: explain fails exactly as get does, status, code,
    message and details, for every permission."""
    s = await Scene.start(api, fleet)
    beta = await s.guest("beta")
    pool = await s.pool()

    async def seen() -> object:
        return await explain(api, beta, "beta", pool["id"], READ)

    pool_id = await hide_from_guest(api, s.token, "acme", pool["id"], "beta", hidden_by, seen)
    body = {"tenantId": "beta", "poolId": pool_id}
    got = await api.post(beta, "pools/get", body)
    for permission in (READ, SHARE, MANAGE, BOOK):
        explained = await api.post(beta, "pools/explain", body | {"permission": permission})
        assert (explained.status_code, explained.json()) == (got.status_code, got.json())
        graphql = await api.graphql(beta, ACCESS, {"t": "beta", "p": pool_id, "perm": permission})
        assert graphql["data"] is None
        assert graphql["errors"][0]["extensions"] == {"code": "NOT_FOUND", "field": "poolId"}
        assert graphql["errors"][0]["message"] == got.json()["error"]["message"]


async def test_the_tenant_decision_and_input_fail_as_get_does(api: Api, fleet: Fleet) -> None:
    s = await Scene.start(api, fleet)
    beta = await s.guest("beta")
    pool = await s.pool()
    body = {"tenantId": "acme", "poolId": pool["id"]}
    got = await api.post(beta, "pools/get", body)
    explained = await api.post(beta, "pools/explain", body | {"permission": READ})
    assert (explained.status_code, explained.json()) == (got.status_code, got.json())
    assert got.status_code == 403
    for bad in ("compute:pools:create", "read", 1):
        status, error = await api.fails(s.token, "pools/explain", body | {"permission": bad})
        assert (status, error["details"]["field"]) == (400, "permission")
    status, error = await api.fails(s.token, "pools/explain", body)
    assert (status, error["details"]["field"]) == (400, "permission")
