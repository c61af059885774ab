"""`pools/list` and `pools/get`, and the seed's intro paragraph: one test per rule sentence.
Response shapes are CONTRACT section 4's, checked key by key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tests.rest.pool_calls import (
    DEFAULT_OWNER_MAX,
    HIDDEN_BY,
    assert_pool_shape,
    create_pool,
    hide_from_guest,
    offer,
    without_grants,
)
from tests.support import Api, Fleet


@dataclass
class Tenants:
    """acme, beta and gamma, each with a custom site and an admin token."""

    sites: dict[str, str]
    tokens: dict[str, str]


async def _tenants(fleet: Fleet, *names: str) -> Tenants:
    sites, tokens = {}, {}
    for name in names:
        await fleet.tenant(name)
        sites[name] = await fleet.site(name)
        tokens[name] = await fleet.caller(name)
    return Tenants(sites, tokens)


async def _list(api: Api, token: str, tenant: str) -> dict[str, dict[str, Any]]:
    listed = await api.ok(token, "pools/list", {"tenantId": tenant})
    assert set(listed) == {"pools"}  # CONTRACT 4: {"pools": [Pool, ...]}
    pools = listed["pools"]
    for pool in pools:
        assert_pool_shape(pool)
    return {p["id"]: p for p in pools}


async def _get(api: Api, token: str, tenant: str, pool_id: str) -> dict[str, Any]:
    got = await api.ok(token, "pools/get", {"tenantId": tenant, "poolId": pool_id})
    assert set(got) == {"pool"}  # CONTRACT 4: {"pool": Pool}
    pool: dict[str, Any] = got["pool"]
    assert_pool_shape(pool)
    return pool


# -- the intro paragraph -------------------------------------------------------------------


async def test_a_pool_groups_one_site_model_sharing_policy_and_owns_its_quotas(
    api: Api, fleet: Fleet
) -> None:
    """A pool groups the nodes of one site under one GPU model, one sharing mode and one
    policy, and every reservation and quota belongs to exactly one pool."""
    t = await _tenants(fleet, "acme")
    token, site = t.tokens["acme"], t.sites["acme"]
    first = await create_pool(api, token, "acme", site, gpuModel="H100", ownerQuota={"gpu": 4})
    second = await create_pool(api, token, "acme", site, gpuModel="H100", ownerQuota={"gpu": 4})
    for pool in (first, second):
        await fleet.node(pool["id"], 4)
    body = {"tenantId": "acme", "poolId": first["id"], "resources": {"gpu": 3}}
    reservation = (await api.ok(token, "reservations/create", body))["reservation"]

    assert reservation["poolId"] == first["id"]
    assert without_grants((await _get(api, token, "acme", first["id"]))["quotas"]) == [
        {"resource": "gpu", "max": 4, "used": 3}
    ]
    assert without_grants((await _get(api, token, "acme", second["id"]))["quotas"]) == [
        {"resource": "gpu", "max": 4, "used": 0}
    ]
    seen = await _get(api, token, "acme", first["id"])
    assert (seen["siteId"], seen["gpuModel"], seen["sharing"], seen["policy"]) == (
        site,
        "H100",
        "exclusive",
        {},
    )


async def test_the_creator_owns_a_pool_others_see_it_once_offered_with_a_quota(
    api: Api, fleet: Fleet
) -> None:
    """The tenant that creates a pool owns it; other tenants see it only once the owner
    offers it to them with a quota."""
    t = await _tenants(fleet, "acme", "beta")
    acme, beta = t.tokens["acme"], t.tokens["beta"]
    pool = await create_pool(api, acme, "acme", t.sites["acme"])
    assert (pool["tenantId"], pool["owned"]) == ("acme", True)

    assert await _list(api, beta, "beta") == {}
    status, error = await api.fails(beta, "pools/get", {"tenantId": "beta", "poolId": pool["id"]})
    assert (status, error["code"]) == (404, "NOT_FOUND")

    await offer(api, acme, "acme", pool["id"], "beta", {"gpu": 3})
    seen = await _get(api, beta, "beta", pool["id"])
    assert (seen["tenantId"], seen["owned"]) == ("acme", False)
    assert without_grants(seen["quotas"]) == [{"resource": "gpu", "max": 3, "used": 0}]
    assert list(await _list(api, beta, "beta")) == [pool["id"]]


@pytest.mark.parametrize("method", ["offer", "unoffer", "update", "archive"])
async def test_only_the_owner_can_offer_unoffer_update_or_archive(
    api: Api, fleet: Fleet, method: str
) -> None:
    """Only the owner can offer, unoffer, update or archive a pool; anyone else gets
    NOT_FOUND."""
    t = await _tenants(fleet, "acme", "beta", "gamma")
    pool = await create_pool(api, t.tokens["acme"], "acme", t.sites["acme"])
    await offer(api, t.tokens["acme"], "acme", pool["id"], "beta", {"gpu": 1})
    body: dict[str, Any] = {"tenantId": "beta", "poolId": pool["id"]}
    body |= {
        "offer": {"toTenantId": "gamma", "quota": {"gpu": 1}},
        "unoffer": {"toTenantId": "beta"},
        "update": {"gpuModel": "A100"},
        "archive": {},
    }[method]
    status, error = await api.fails(t.tokens["beta"], f"pools/{method}", body)
    assert (status, error["code"], error["details"]) == (404, "NOT_FOUND", {"field": "poolId"})
    unchanged = await _get(api, t.tokens["acme"], "acme", pool["id"])
    # Version 2: the offer to beta moved it; the refused call did not.
    assert (unchanged["version"], unchanged["archived"], unchanged["gpuModel"]) == (2, False, None)
    assert [o["tenantId"] for o in unchanged["offers"]] == ["acme", "beta"]


# -- list ----------------------------------------------------------------------------------


async def test_list_returns_owned_and_offered_pools_with_owned_archived_and_own_quotas(
    api: Api, fleet: Fleet
) -> None:
    """Returns the pools the tenant owns or is offered, each with owned, archived and the
    tenant's own quota rows."""
    t = await _tenants(fleet, "acme", "beta", "gamma")
    acme, beta, gamma = (t.tokens[n] for n in ("acme", "beta", "gamma"))
    mine = await create_pool(api, acme, "acme", t.sites["acme"], ownerQuota={"gpu": 8})
    offered = await create_pool(api, beta, "beta", t.sites["beta"])
    await offer(api, beta, "beta", offered["id"], "acme", {"gpu": 2, "gpu.mig": 5})
    await offer(api, beta, "beta", offered["id"], "gamma", {"gpu": 7})
    elsewhere = await create_pool(api, gamma, "gamma", t.sites["gamma"])
    await offer(api, gamma, "gamma", elsewhere["id"], "beta", {"gpu": 1})

    listed = await _list(api, acme, "acme")
    assert set(listed) == {mine["id"], offered["id"]}
    own, guest = listed[mine["id"]], listed[offered["id"]]
    assert (own["owned"], own["archived"]) == (True, False)
    assert without_grants(own["quotas"]) == [{"resource": "gpu", "max": 8, "used": 0}]
    assert (guest["owned"], guest["archived"], guest["tenantId"]) == (False, False, "beta")
    # Only acme's rows: not beta's (the owner's) nor gamma's.
    assert without_grants(guest["quotas"]) == [
        {"resource": "gpu", "max": 2, "used": 0},
        {"resource": "gpu.mig", "max": 5, "used": 0},
    ]
    assert guest["offers"] is None


async def test_list_of_a_tenant_with_no_pools_is_empty(api: Api, fleet: Fleet) -> None:
    """Returns the pools the tenant owns or is offered: none is an empty list."""
    t = await _tenants(fleet, "acme")
    assert await api.ok(t.tokens["acme"], "pools/list", {"tenantId": "acme"}) == {"pools": []}


async def test_list_includes_pools_offered_with_descendants_to_an_ancestor(
    api: Api, fleet: Fleet
) -> None:
    """Returns the pools the tenant ... is offered (CONTRACT 2: or offered with
    includeDescendants to one of its ancestors); its quotas are the ancestor's rows it books
    against, named by their grant (CONTRACT section 10)."""
    t = await _tenants(fleet, "acme", "beta")
    await fleet.tenant("beta-lab", parent="beta")
    lab = await fleet.caller("beta-lab")
    pool = await create_pool(api, t.tokens["acme"], "acme", t.sites["acme"])
    body = {
        "tenantId": "acme",
        "poolId": pool["id"],
        "toTenantId": "beta",
        "quota": {"gpu": 4},
        "includeDescendants": True,
    }
    await api.ok(t.tokens["acme"], "pools/offer", body)
    listed = await _list(api, lab, "beta-lab")
    assert list(listed) == [pool["id"]]
    assert listed[pool["id"]]["owned"] is False
    (row,) = listed[pool["id"]]["quotas"]
    assert (row["max"], row["grant"]["tenantId"], row["grant"]["includeDescendants"]) == (
        4,
        "beta",
        True,
    )


async def test_archived_pools_appear_only_for_their_owner(api: Api, fleet: Fleet) -> None:
    """Archived pools appear only for their owner."""
    t = await _tenants(fleet, "acme", "beta")
    acme, beta = t.tokens["acme"], t.tokens["beta"]
    pool = await create_pool(api, acme, "acme", t.sites["acme"])
    await offer(api, acme, "acme", pool["id"], "beta", {"gpu": 1})
    await api.ok(acme, "pools/archive", {"tenantId": "acme", "poolId": pool["id"]})

    owner_view = await _list(api, acme, "acme")
    assert owner_view[pool["id"]]["archived"] is True
    assert await _list(api, beta, "beta") == {}


async def test_list_checks_read_on_each_pool_after_the_tenant_decision(
    api: Api, fleet: Fleet
) -> None:
    """After the coarse decision on the tenant, each pool is checked as compute:pools:read on
    the pool, and only the allowed ones are returned."""
    t = await _tenants(fleet, "acme", "beta")
    acme = t.tokens["acme"]
    h100 = await create_pool(api, acme, "acme", t.sites["acme"], gpuModel="H100")
    await create_pool(api, acme, "acme", t.sites["acme"], gpuModel="A100")
    await create_pool(api, acme, "acme", t.sites["acme"])  # no model: matches no gpuModel
    narrowed = await fleet.caller("acme", "viewer", gpuModel="H100")
    assert list(await _list(api, narrowed, "acme")) == [h100["id"]]
    # The coarse decision comes first: acting for another tenant is refused outright.
    status, error = await api.fails(narrowed, "pools/list", {"tenantId": "beta"})
    assert (status, error["code"]) == (403, "PERMISSION_DENIED")


# -- get -----------------------------------------------------------------------------------


async def test_get_returns_the_pool_as_the_tenant_sees_it(api: Api, fleet: Fleet) -> None:
    """Returns one pool as the tenant sees it, with owned, archived and the tenant's own
    quota rows."""
    t = await _tenants(fleet, "acme", "beta")
    acme, beta = t.tokens["acme"], t.tokens["beta"]
    pool = await create_pool(api, acme, "acme", t.sites["acme"], gpuModel="H100")
    await offer(api, acme, "acme", pool["id"], "beta", {"gpu": 2})

    owner = await _get(api, acme, "acme", pool["id"])
    guest = await _get(api, beta, "beta", pool["id"])
    shared_fields = set(owner) - {"owned", "quotas", "offers"}
    assert {k: owner[k] for k in shared_fields} == {k: guest[k] for k in shared_fields}
    assert (owner["owned"], guest["owned"]) == (True, False)
    assert without_grants(owner["quotas"]) == [
        {"resource": "gpu", "max": DEFAULT_OWNER_MAX, "used": 0}
    ]
    assert without_grants(guest["quotas"]) == [{"resource": "gpu", "max": 2, "used": 0}]
    assert owner["offers"] == [
        {"tenantId": "acme", "includeDescendants": False, "priority": 0,
         "quotas": without_grants(owner["quotas"])},
        {"tenantId": "beta", "includeDescendants": False, "priority": 0,
         "quotas": without_grants(guest["quotas"])},
    ]  # fmt: skip
    assert guest["offers"] is None


@pytest.mark.parametrize(
    ("role", "acting", "sees_offers"),
    [
        ("admin", "acme", True),
        ("operator", "acme", False),
        ("viewer", "acme", False),
        ("fleet-admin", "acme", True),
        ("admin", "beta", False),
    ],
    ids=["owner-admin", "owner-operator", "owner-viewer", "fleet-admin", "offered-admin"],
)
async def test_offers_only_in_the_owner_view_with_share(
    api: Api, fleet: Fleet, role: str, acting: str, sees_offers: bool
) -> None:
    """CONTRACT 4: the owner's view (with compute:pools:share) also carries "offers", the
    owner's own offer included; every other view has "offers": null."""
    t = await _tenants(fleet, "acme", "beta")
    pool = await create_pool(api, t.tokens["acme"], "acme", t.sites["acme"])
    await offer(api, t.tokens["acme"], "acme", pool["id"], "beta", {"gpu": 2})
    if role == "fleet-admin":
        await fleet.tenant("fleet")
    token = await fleet.caller("fleet" if role == "fleet-admin" else acting, role)
    for seen in (
        await _get(api, token, acting, pool["id"]),
        (await _list(api, token, acting))[pool["id"]],
    ):
        if sees_offers:
            assert [o["tenantId"] for o in seen["offers"]] == ["acme", "beta"]
        else:
            assert seen["offers"] is None


@pytest.mark.parametrize("hidden_by", HIDDEN_BY)
async def test_get_is_not_found_unless_owned_or_offered_and_not_archived(
    api: Api, fleet: Fleet, hidden_by: str
) -> None:
    """The call is NOT_FOUND when the pool is not owned by or offered to the tenant, or is
    archived and the tenant is not its owner."""
    t = await _tenants(fleet, "acme", "beta")
    acme, beta = t.tokens["acme"], t.tokens["beta"]
    created = (await create_pool(api, acme, "acme", t.sites["acme"]))["id"]
    pool_id = await hide_from_guest(
        api, acme, "acme", created, "beta", hidden_by, lambda: _get(api, beta, "beta", created)
    )

    status, error = await api.fails(beta, "pools/get", {"tenantId": "beta", "poolId": pool_id})
    assert (status, error["code"], error["details"]) == (404, "NOT_FOUND", {"field": "poolId"})
    if hidden_by == "archived":
        owner = await _get(api, acme, "acme", pool_id)
        assert (owner["archived"], owner["owned"]) == (True, True)
