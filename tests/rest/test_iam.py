"""IAM over REST (CONTRACT section 2): acting tenants, roles, check order, narrowed
bindings, and answers that never reveal whether a pool exists."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import pytest

from app.iam.roles import ROLE_PERMISSIONS
from tests.rest.pool_calls import MISSING_POOL, MISSING_SITE, create_pool, offer
from tests.support import Api, Fleet

POOL_METHODS = ("list", "get", "create", "capacity", "offer", "unoffer", "update", "archive")
# Methods that name a pool, and of those the owner-only ones (seed intro).
ON_A_POOL = ("get", "capacity", "offer", "unoffer", "update", "archive")
OWNER_ONLY = ("offer", "unoffer", "update", "archive")

# CONTRACT section 2's role table, restricted to the seed's pools permissions.
VIEWER = {"compute:pools:read", "compute:capacity:read"}
OPERATOR = VIEWER | {"compute:pools:create", "compute:pools:manage"}
ADMIN = OPERATOR | {"compute:pools:share"}
CONTRACT_ROLES = {"viewer": VIEWER, "operator": OPERATOR, "admin": ADMIN, "fleet-admin": ADMIN}
# The permission each method is decided on (seed's Authorization column).
METHOD_PERMISSION = {
    "list": "compute:pools:read",
    "get": "compute:pools:read",
    "create": "compute:pools:create",
    "capacity": "compute:capacity:read",
    "offer": "compute:pools:share",
    "unoffer": "compute:pools:share",
    "update": "compute:pools:manage",
    "archive": "compute:pools:manage",
}


@dataclass
class World:
    """acme owns `pool` (on `site`); beta owns `hidden` (never offered to acme) and `shared`
    (offered to acme). Every token here is an unnarrowed admin."""

    site: str
    acme: str
    beta: str
    pool: str
    hidden: str
    shared: str


async def _world(fleet: Fleet, api: Api) -> World:
    await fleet.tenant("acme")
    await fleet.tenant("beta")
    site = await fleet.site("acme")
    beta_site = await fleet.site("beta")
    acme, beta = await fleet.caller("acme"), await fleet.caller("beta")
    pool = (await create_pool(api, acme, "acme", site, gpuModel="H100"))["id"]
    hidden = (await create_pool(api, beta, "beta", beta_site))["id"]
    shared = (await create_pool(api, beta, "beta", beta_site))["id"]
    await offer(api, beta, "beta", shared, "acme", {"gpu": 1})
    return World(site, acme, beta, pool, hidden, shared)


def _body(
    method: str, tenant: str, pool_id: str, site: str = MISSING_SITE, to: str = "beta"
) -> Any:
    """A valid input for `method`, acting for `tenant` on `pool_id`."""
    return {
        "list": {"tenantId": tenant},
        "get": {"tenantId": tenant, "poolId": pool_id},
        "capacity": {"tenantId": tenant, "poolId": pool_id},
        "create": {"tenantId": tenant, "siteId": site, "class": "metal-host"},
        "offer": {"tenantId": tenant, "poolId": pool_id, "toTenantId": to, "quota": {"gpu": 1}},
        "unoffer": {"tenantId": tenant, "poolId": pool_id, "toTenantId": to},
        "update": {"tenantId": tenant, "poolId": pool_id, "gpuModel": "A100"},
        "archive": {"tenantId": tenant, "poolId": pool_id},
    }[method]


async def _answer(api: Api, token: str, method: str, body: Any, pool_id: str) -> tuple[int, str]:
    """The whole HTTP answer (status and body), with the pool id blanked out."""
    response = await api.post(token, f"pools/{method}", body)
    return response.status_code, response.text.replace(pool_id, "<pool>")


# -- roles ---------------------------------------------------------------------------------


def test_roles_grant_exactly_the_contract_permissions() -> None:
    """Roles grant permissions: viewer compute:pools:read, compute:capacity:read; operator
    viewer + compute:pools:create, compute:pools:manage; admin operator + compute:pools:share;
    fleet-admin all of the above on every tenant."""
    pools_permissions = set(METHOD_PERMISSION.values())
    granted = {role: set(p) & pools_permissions for role, p in ROLE_PERMISSIONS.items()}
    assert granted == CONTRACT_ROLES


@pytest.mark.parametrize("role", ["viewer", "operator", "admin"])
async def test_role_grants_exactly_its_permissions_on_every_method(
    api: Api, fleet: Fleet, role: str
) -> None:
    """Roles grant permissions (CONTRACT 2 table); on its own pool, a role lacking the method's
    permission gets PERMISSION_DENIED, a role holding it succeeds."""
    world = await _world(fleet, api)
    token = await fleet.caller("acme", role)
    for method in POOL_METHODS:  # archive last: it ends what the others need
        body = _body(method, "acme", world.pool, world.site)
        response = await api.post(token, f"pools/{method}", body)
        if METHOD_PERMISSION[method] in CONTRACT_ROLES[role]:
            assert response.status_code == 200, (method, response.text)
        else:
            assert response.status_code == 403, (method, response.text)
            assert response.json()["error"]["code"] == "PERMISSION_DENIED"


# -- acting tenants ------------------------------------------------------------------------


async def test_acting_for_another_tenant_is_permission_denied(api: Api, fleet: Fleet) -> None:
    """A caller may act for its own tenant; a caller of the built-in fleet tenant with the
    fleet-admin role may act for any tenant. Otherwise: PERMISSION_DENIED."""
    world = await _world(fleet, api)
    await fleet.tenant("fleet")
    fleet_admin_role = await fleet.caller("fleet", "admin")  # fleet tenant, but not fleet-admin
    for token, method in itertools.product((world.acme, fleet_admin_role), POOL_METHODS):
        status, error = await api.fails(
            token, f"pools/{method}", _body(method, "beta", world.hidden)
        )
        assert (status, error["code"], error["details"]) == (
            403,
            "PERMISSION_DENIED",
            {"field": "tenantId"},
        )


async def test_acting_for_an_unknown_tenant_reveals_nothing(api: Api, fleet: Fleet) -> None:
    """A caller may act for its own tenant ... Otherwise: PERMISSION_DENIED, whether or not
    the other tenant exists."""
    world = await _world(fleet, api)
    answers = []
    for tenant in ("beta", "gamma"):
        response = await api.post(world.acme, "pools/list", {"tenantId": tenant})
        answers.append((response.status_code, response.text.replace(tenant, "<t>")))
    assert answers[0] == answers[1] and answers[0][0] == 403


async def test_fleet_admin_may_act_for_any_tenant(api: Api, fleet: Fleet) -> None:
    """A caller of the built-in fleet tenant with the fleet-admin role may act for any tenant
    (fleet-admin: all of the above on every tenant)."""
    world = await _world(fleet, api)
    await fleet.tenant("fleet")
    admin = await fleet.caller("fleet", "fleet-admin")
    acme = await api.ok(admin, "pools/list", {"tenantId": "acme"})
    assert sorted(p["id"] for p in acme["pools"]) == sorted([world.pool, world.shared])
    beta = await api.ok(admin, "pools/get", {"tenantId": "beta", "poolId": world.hidden})
    assert beta["pool"]["owned"] is True and beta["pool"]["offers"] is not None
    for method in ("capacity", "offer", "unoffer", "update", "archive"):
        await api.ok(admin, f"pools/{method}", _body(method, "beta", world.hidden, to="acme"))
    # Acting for acme, it sees what acme sees: beta's unoffered pool stays hidden.
    status, error = await api.fails(
        admin, "pools/get", {"tenantId": "acme", "poolId": world.hidden}
    )
    assert (status, error["code"]) == (404, "NOT_FOUND")
    status, error = await api.fails(admin, "pools/list", {"tenantId": "nobody"})
    assert (status, error["code"], error["details"]) == (404, "NOT_FOUND", {"field": "tenantId"})


# -- check order ---------------------------------------------------------------------------


async def test_authentication_comes_before_validation(api: Api, fleet: Fleet) -> None:
    """Checks run in this order: authentication, input validation, ..."""
    await _world(fleet, api)
    for method in POOL_METHODS:
        status, error = await api.fails(None, f"pools/{method}", {"tenantId": "no spaces"})
        assert (status, error["code"]) == (401, "UNAUTHENTICATED"), method


async def test_validation_comes_before_the_tenant_decision(api: Api, fleet: Fleet) -> None:
    """Checks run in this order: authentication, input validation, the tenant decision, ..."""
    world = await _world(fleet, api)
    for method in POOL_METHODS:
        body = {**_body(method, "beta", world.hidden), "unexpected": 1}
        status, error = await api.fails(world.acme, f"pools/{method}", body)
        assert (status, error["code"]) == (400, "INVALID_INPUT"), method


async def test_the_tenant_decision_comes_before_visibility(api: Api, fleet: Fleet) -> None:
    """Checks run in this order: ..., the tenant decision, visibility (NOT_FOUND), ..."""
    world = await _world(fleet, api)
    for method in ON_A_POOL:
        body = _body(method, "beta", MISSING_POOL)
        status, error = await api.fails(world.acme, f"pools/{method}", body)
        assert (status, error["code"]) == (403, "PERMISSION_DENIED"), method


async def test_a_pool_the_tenant_cannot_see_is_not_found_for_every_role(
    api: Api, fleet: Fleet
) -> None:
    """A pool the acting tenant cannot see is NOT_FOUND, never PERMISSION_DENIED: no answer
    may reveal that a pool exists. (visibility comes before the permission on the pool)"""
    world = await _world(fleet, api)
    for role in ("viewer", "operator", "admin"):
        token = await fleet.caller("acme", role)
        for method, pool_id in itertools.product(ON_A_POOL, (world.hidden, MISSING_POOL)):
            body = _body(method, "acme", pool_id)
            status, error = await api.fails(token, f"pools/{method}", body)
            assert (status, error["code"]) == (404, "NOT_FOUND"), (role, method, pool_id)


async def test_owner_only_methods_on_an_offered_pool_are_not_found_for_every_role(
    api: Api, fleet: Fleet
) -> None:
    """Owner-only methods called by a tenant that sees the pool but does not own it are also
    NOT_FOUND (seed: Only the owner can offer, unoffer, update or archive a pool; anyone else
    gets NOT_FOUND)."""
    world = await _world(fleet, api)
    for role in ("viewer", "operator", "admin"):
        token = await fleet.caller("acme", role)
        for method in OWNER_ONLY:
            body = _body(method, "acme", world.shared)
            status, error = await api.fails(token, f"pools/{method}", body)
            assert (status, error["code"]) == (404, "NOT_FOUND"), (role, method)


async def test_the_permission_comes_before_the_state_rules(api: Api, fleet: Fleet) -> None:
    """Checks run in this order: ..., the permission on the pool (PERMISSION_DENIED), then the
    method's state rules: a viewer touching an archived pool it owns is refused for its role,
    not for the pool's state (an operator gets the state's answer)."""
    world = await _world(fleet, api)
    await api.ok(world.acme, "pools/archive", {"tenantId": "acme", "poolId": world.pool})
    viewer = await fleet.caller("acme", "viewer")
    for method in OWNER_ONLY:
        body = _body(method, "acme", world.pool)
        status, error = await api.fails(viewer, f"pools/{method}", body)
        assert (status, error["code"]) == (403, "PERMISSION_DENIED"), method
    operator = await fleet.caller("acme", "operator")
    body = _body("update", "acme", world.pool)
    status, error = await api.fails(operator, "pools/update", body)
    assert (status, error["code"]) == (409, "INVALID_STATE")


# -- narrowed bindings ---------------------------------------------------------------------

# (binding, create fields of a pool it matches, of one it does not). "owned" pools are
# acme's own; the non-owned one is beta's, offered to acme.
NARROWED = [
    ({"gpuModel": "H100"}, {"gpuModel": "H100"}, {"gpuModel": "A100"}),
    ({"class": "metal-host"}, {"class": "metal-host"}, {"class": "metal-dedicated"}),
    ({"sharing": "exclusive"}, {}, {"sharing": "mig"}),
    ({"region": "eu-west"}, {}, {"region": "us-east"}),
    ({"owned": "true"}, {"owned": True}, {"owned": False}),
    ({"owned": "false"}, {"owned": False}, {"owned": True}),
]


async def _narrowed_pool(api: Api, fleet: Fleet, world: World, fields: dict[str, Any]) -> str:
    fields = dict(fields)
    if fields.pop("owned", True) is False:
        return world.shared
    site = world.site
    if "region" in fields:
        site = await fleet.site("acme", region=fields.pop("region"))
    return str((await create_pool(api, world.acme, "acme", site, **fields))["id"])


@pytest.mark.parametrize(
    ("where", "matching", "other"),
    NARROWED,
    ids=["gpuModel", "class", "sharing", "region", "owned", "not-owned"],
)
async def test_a_narrowed_binding_applies_only_to_matching_pools(
    api: Api,
    fleet: Fleet,
    where: dict[str, str],
    matching: dict[str, Any],
    other: dict[str, Any],
) -> None:
    """A role binding may be narrowed by pool attributes (gpuModel, class, sharing, region,
    owned): the binding then applies only to pools whose authz row carries matching
    attributes. (list: each pool is checked as compute:pools:read on the pool, and only the
    allowed ones are returned.)"""
    world = await _world(fleet, api)
    yes = await _narrowed_pool(api, fleet, world, matching)
    no = await _narrowed_pool(api, fleet, world, other)
    token = await fleet.caller("acme", "admin", **where)

    listed = await api.ok(token, "pools/list", {"tenantId": "acme"})
    assert [p["id"] for p in listed["pools"] if p["id"] in (yes, no)] == [yes]
    for method in ("get", "capacity"):
        await api.ok(token, f"pools/{method}", {"tenantId": "acme", "poolId": yes})
        status, error = await api.fails(
            token, f"pools/{method}", {"tenantId": "acme", "poolId": no}
        )
        assert (status, error["code"]) == (403, "PERMISSION_DENIED"), method


# -- never leak existence ------------------------------------------------------------------


async def test_missing_and_hidden_pools_get_the_same_answer(api: Api, fleet: Fleet) -> None:
    """No answer may reveal that a pool exists: a missing pool id and another tenant's hidden
    pool get the same whole HTTP answer (status and body, the id blanked out)."""
    world = await _world(fleet, api)
    # Hidden in two ways: never offered, and offered then archived (seed: archived pools
    # appear only for their owner).
    beta_site = await fleet.site("beta")
    archived = (await create_pool(api, world.beta, "beta", beta_site))["id"]
    await offer(api, world.beta, "beta", archived, "acme", {"gpu": 1})
    await api.ok(world.beta, "pools/archive", {"tenantId": "beta", "poolId": archived})
    viewer = await fleet.caller("acme", "viewer")
    for token, method in itertools.product((world.acme, viewer), ON_A_POOL):
        hidden = [world.hidden, archived]
        if method in OWNER_ONLY:
            hidden.append(world.shared)  # seen but not owned: anyone else gets NOT_FOUND
        body = _body(method, "acme", MISSING_POOL)
        missing = await _answer(api, token, method, body, MISSING_POOL)
        assert missing[0] == 404, method
        for pool_id in hidden:
            body = _body(method, "acme", pool_id)
            assert await _answer(api, token, method, body, pool_id) == missing, (method, pool_id)
