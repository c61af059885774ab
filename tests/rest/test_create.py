"""`POST /api/compute/pools/create`: one test per rule sentence of the seed's create section,
plus CONTRACT section 5's create rules. Every test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import re
from typing import Any

import pytest
from sqlalchemy import select, update

from app.db.engine import Database
from app.db.models import Event, RoleBinding
from app.iam.callers import create_caller
from app.ids import derived_id
from tests.rest.pool_calls import (
    DEFAULT_OWNER_MAX,
    MISSING_ACCOUNT,
    MISSING_SITE,
    assert_pool_shape,
    create_pool,
    row_count,
    row_counts,
    without_grants,
)
from tests.support import Api, Fleet

JOIN_SET = {
    "apiServer": "https://k8s.example.com:6443",
    "token": "abcdef.0123456789abcdef",
    "caCertHash": "sha256:" + "a" * 64,
}
# How every read shows JOIN_SET: the token is write-only (CONTRACT section 6).
JOIN_READ = {
    "apiServer": JOIN_SET["apiServer"],
    "tokenSet": True,
    "caCertHash": JOIN_SET["caCertHash"],
}
TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$")


async def _acme(fleet: Fleet, role: str = "admin") -> tuple[str, str]:
    """Tenant acme with one custom site; returns (site id, a caller's token)."""
    await fleet.tenant("acme")
    return await fleet.site("acme"), await fleet.caller("acme", role)


async def _events(db: Database) -> list[tuple[str, str]]:
    async with db.reader.connect() as conn:
        rows = await conn.execute(select(Event.type, Event.pool_id).order_by(Event.seq))
    return [(r.type, r.pool_id) for r in rows]


async def test_creates_pool_with_owner_quota_and_empty_rollup_at_version_1(
    api: Api, fleet: Fleet
) -> None:
    """Creates a pool on a site the tenant owns, with the owner's quota rows and an empty
    rollup; returns the pool at version 1."""
    site, token = await _acme(fleet)
    pool = await create_pool(api, token, "acme", site, gpuModel="H100")

    assert_pool_shape(pool)
    assert re.fullmatch(r"pool_[0-9a-hjkmnp-tv-z]{26}", pool["id"])
    assert {k: v for k, v in pool.items() if k not in ("id", "createdAt", "updatedAt")} == {
        "tenantId": "acme",
        "siteId": site,
        "class": "metal-host",
        "gpuModel": "H100",
        "sharing": "exclusive",
        "agent": "bcd",
        "policy": {},
        "providerAccountId": None,
        "region": "eu-west",
        "displayName": None,
        "labels": {},
        "owned": True,
        "archived": False,
        "version": 1,
        "quotas": [
            {
                "resource": "gpu",
                "max": DEFAULT_OWNER_MAX,
                "used": 0,
                # CONTRACT 10: the offer that gives the row, the owner's own.
                "grant": {
                    "tenantId": "acme",
                    "includeDescendants": False,
                    "priority": 0,
                    "offeredAt": pool["createdAt"],
                },
            }
        ],
        # CONTRACT 5: the owner always holds an offer, created with the pool.
        "offers": [
            {
                "tenantId": "acme",
                "includeDescendants": False,
                "priority": 0,
                "quotas": [{"resource": "gpu", "max": DEFAULT_OWNER_MAX, "used": 0}],
            }
        ],
    }
    assert TIMESTAMP.match(pool["createdAt"]) and pool["createdAt"] == pool["updatedAt"]
    rollup = await api.ok(token, "pools/capacity", {"tenantId": "acme", "poolId": pool["id"]})
    assert rollup == {"capacity": []}
    got = await api.ok(token, "pools/get", {"tenantId": "acme", "poolId": pool["id"]})
    assert got == {"pool": pool}


@pytest.mark.parametrize(("role", "status"), [("viewer", 403), ("operator", 200), ("admin", 200)])
async def test_create_is_decided_as_pools_create_on_the_tenant(
    api: Api, fleet: Fleet, db: Database, role: str, status: int
) -> None:
    """It is decided as compute:pools:create on the tenant (compute-tenant), the alternative
    its catalog row lists next to compute-fleet."""
    site, token = await _acme(fleet, role)
    body = {"tenantId": "acme", "siteId": site, "class": "metal-host"}
    response = await api.post(token, "pools/create", body)
    assert response.status_code == status, response.text
    if status == 403:
        assert response.json()["error"]["code"] == "PERMISSION_DENIED"
        assert await row_count(db, "pools") == 0


async def test_fleet_admin_creates_for_any_tenant_and_the_tenant_owns_it(
    api: Api, fleet: Fleet
) -> None:
    """The tenant that creates a pool owns it (seed intro), also when a fleet-admin acts
    for it (CONTRACT 2: a fleet-admin may act for any tenant)."""
    site, _ = await _acme(fleet)
    await fleet.tenant("fleet")
    admin = await fleet.caller("fleet", "fleet-admin")
    pool = await create_pool(api, admin, "acme", site)
    assert pool["tenantId"] == "acme" and pool["owned"] is True
    # A site is owned per tenant: acting for acme, the fleet-admin can't use fleet's site.
    fleet_site = await fleet.site("fleet")
    body = {"tenantId": "acme", "siteId": fleet_site, "class": "metal-host"}
    status, error = await api.fails(admin, "pools/create", body)
    assert (status, error["code"]) == (404, "NOT_FOUND")


async def test_a_narrowed_binding_creates_only_pools_it_matches(api: Api, fleet: Fleet) -> None:
    """It is decided as compute:pools:create on the tenant (compute-tenant): a binding narrowed
    to gpuModel H100 may create H100 pools but not others (CONTRACT 2)."""
    site, _ = await _acme(fleet)
    token = await fleet.caller("acme", "operator", gpuModel="H100")
    await create_pool(api, token, "acme", site, gpuModel="H100")
    body = {"tenantId": "acme", "siteId": site, "class": "metal-host", "gpuModel": "A100"}
    status, error = await api.fails(token, "pools/create", body)
    assert (status, error["code"]) == (403, "PERMISSION_DENIED")


@pytest.mark.parametrize(
    ("fields", "sharing", "agent"),
    [
        ({"class": "metal-host"}, "exclusive", "bcd"),
        ({"class": "metal-dedicated"}, "exclusive", "bcd"),
        ({"class": "vps-host", "sharing": "mig"}, "mig", "bcd"),
        ({"class": "metal-host", "agent": "none"}, "exclusive", "none"),
        ({"class": "provider", "sharing": "timeslice"}, "timeslice", "none"),
    ],
    ids=["metal-host", "metal-dedicated", "vps-host-mig", "explicit-none", "provider"],
)
async def test_sharing_defaults_to_exclusive_and_agent_to_bcd_none_for_provider(
    api: Api, fleet: Fleet, fields: dict[str, Any], sharing: str, agent: str
) -> None:
    """sharing defaults to exclusive and agent to bcd (none for provider pools)."""
    site, token = await _acme(fleet)
    if fields["class"] == "provider":
        fields = {**fields, "providerAccountId": await fleet.account("acme")}
    pool = await create_pool(api, token, "acme", site, **fields)
    assert (pool["sharing"], pool["agent"]) == (sharing, agent)
    assert pool["providerAccountId"] == fields.get("providerAccountId")


PROVIDER_RULES: list[tuple[dict[str, Any], str]] = [
    ({"class": "provider"}, "providerAccountId"),
    ({"class": "provider", "agent": "bcd", "providerAccountId": "own"}, "agent"),
    ({"class": "metal-host", "providerAccountId": "own"}, "providerAccountId"),
    ({"class": "metal-dedicated", "providerAccountId": "own"}, "providerAccountId"),
    ({"class": "vps-host", "providerAccountId": "own"}, "providerAccountId"),
]


async def test_provider_pool_needs_account_and_agent_none_others_refuse_account(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """A provider pool needs providerAccountId and agent: 'none', and other classes refuse
    providerAccountId; both are INVALID_INPUT."""
    site, token = await _acme(fleet)
    account = await fleet.account("acme")
    before = await row_counts(db)
    for fields, field in PROVIDER_RULES:
        if fields.get("providerAccountId") == "own":
            fields = {**fields, "providerAccountId": account}
        body = {"tenantId": "acme", "siteId": site, **fields}
        status, error = await api.fails(token, "pools/create", body)
        assert (status, error["code"], error["details"]) == (
            400,
            "INVALID_INPUT",
            {"field": field},
        ), fields
    assert await row_counts(db) == before


async def test_provider_account_of_another_tenant_is_not_found_like_a_missing_one(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """A provider pool needs providerAccountId (CONTRACT 5: owned by the tenant); another
    tenant's account answers exactly as an account that does not exist."""
    site, token = await _acme(fleet)
    await fleet.tenant("beta")
    theirs = await fleet.account("beta")
    answers = []
    for account in (theirs, MISSING_ACCOUNT):
        body = {
            "tenantId": "acme",
            "siteId": site,
            "class": "provider",
            "providerAccountId": account,
        }
        response = await api.post(token, "pools/create", body)
        answers.append((response.status_code, response.text.replace(account, "<id>")))
    assert answers[0] == answers[1]
    assert answers[0][0] == 404 and '"field":"providerAccountId"' in answers[0][1]
    assert await row_count(db, "pools") == 0


async def test_owner_quota_defaults_to_gpu_at_2147483647(api: Api, fleet: Fleet) -> None:
    """ownerQuota defaults to gpu at 2,147,483,647."""
    site, token = await _acme(fleet)
    default = await create_pool(api, token, "acme", site)
    assert without_grants(default["quotas"]) == [
        {"resource": "gpu", "max": 2_147_483_647, "used": 0}
    ]
    given = await create_pool(api, token, "acme", site, ownerQuota={"gpu": 8, "disk.gb": 0})
    assert without_grants(given["quotas"]) == [
        {"resource": "disk.gb", "max": 0, "used": 0},
        {"resource": "gpu", "max": 8, "used": 0},
    ]


@pytest.mark.parametrize(
    ("sharing", "policy", "resource"),
    [
        ("mig", {"migLayout": ["3g.40gb", "3g.40gb"]}, "gpu.mig"),
        ("timeslice", {"sharing": {"replicas": 4}}, "gpu.slot"),
        ("mps", {"sharing": {"replicas": 4}}, "gpu.slot"),
    ],
)
async def test_shared_gpu_pools_need_their_own_row_since_a_missing_row_grants_0(
    api: Api, fleet: Fleet, sharing: str, policy: dict[str, Any], resource: str
) -> None:
    """Owners of mig, timeslice or mps pools add gpu.mig or gpu.slot rows themselves, because
    a missing row grants 0."""
    site, token = await _acme(fleet)
    bare = await create_pool(api, token, "acme", site, sharing=sharing, policy=policy)
    with_row = await create_pool(
        api, token, "acme", site, sharing=sharing, policy=policy, ownerQuota={resource: 8}
    )
    assert [q["resource"] for q in bare["quotas"]] == ["gpu"]
    assert without_grants(with_row["quotas"]) == [{"resource": resource, "max": 8, "used": 0}]
    for pool in (bare, with_row):
        await fleet.node(pool["id"], 2)
    book = {"tenantId": "acme", "resources": {resource: 1}}
    status, error = await api.fails(token, "reservations/create", {**book, "poolId": bare["id"]})
    assert (status, error["code"], error["details"]["limit"]) == (
        429,
        "RESOURCE_EXHAUSTED",
        "quota",
    )
    await api.ok(token, "reservations/create", {**book, "poolId": with_row["id"]})


POLICY_REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("exclusive", {"hugepages": {"2Mi": -1}}, "policy.hugepages.2Mi"),
    ("exclusive", {"hugepages": {"1Gi": 1_048_577}}, "policy.hugepages.1Gi"),
    ("exclusive", {"hugepages": {"4Ki": 1}}, "policy.hugepages.4Ki"),
    ("exclusive", {"kernelModules": ["Not A Module"]}, "policy.kernelModules[0]"),
    ("exclusive", {"kernelModules": ["vfio", "vfio"]}, "policy.kernelModules[1]"),
    (
        "exclusive",
        {"kubernetes": {"apiServer": JOIN_SET["apiServer"]}},
        "policy.kubernetes.token",
    ),
    (
        "exclusive",
        {"kubernetes": {**JOIN_SET, "apiServer": "http://k8s.example.com"}},
        "policy.kubernetes.apiServer",
    ),
    ("timeslice", {"sharing": {"replicas": 49}}, "policy.sharing.replicas"),
    ("mps", {"sharing": {"replicas": 0}}, "policy.sharing.replicas"),
    ("exclusive", {"sharing": {"replicas": 2}}, "policy.sharing"),
    ("exclusive", {"migLayout": ["1g.10gb"]}, "policy.migLayout"),
    ("exclusive", {"noSuchKey": True}, "policy.noSuchKey"),
]


async def test_a_policy_nodes_cant_take_is_invalid_input(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """The policy is checked as the nodes will get it (v1.1). Each module's pool-policy
    validator runs, e.g. provision's host units: hugepages, kernel modules, a kubernetes join
    set given all together or not at all, and sharing replicas up to 48. A policy nodes can't
    take is INVALID_INPUT."""
    site, token = await _acme(fleet)
    before = await row_counts(db)
    for sharing, policy, field in POLICY_REFUSED:
        body = {"tenantId": "acme", "siteId": site, "class": "metal-host", "sharing": sharing}
        status, error = await api.fails(token, "pools/create", {**body, "policy": policy})
        assert (status, error["code"], error["details"]) == (
            400,
            "INVALID_INPUT",
            {"field": field},
        ), policy
    assert await row_counts(db) == before


async def test_a_policy_nodes_can_take_is_stored_as_given(api: Api, fleet: Fleet) -> None:
    """Each module's pool-policy validator runs, e.g. provision's host units: hugepages, kernel
    modules, a kubernetes join set given all together or not at all, and sharing replicas up
    to 48."""
    site, token = await _acme(fleet)
    policy = {
        "hugepages": {"2Mi": 1024, "1Gi": 1_048_576},
        "kernelModules": ["vfio-pci", "nvidia_uvm"],
        "kubernetes": {**JOIN_SET, "labels": {"node.kubernetes.io/pool": "gpu"}},
        "sharing": {"replicas": 48},
    }
    pool = await create_pool(api, token, "acme", site, sharing="timeslice", policy=policy)
    kubernetes = {**JOIN_READ, "labels": {"node.kubernetes.io/pool": "gpu"}}
    assert pool["policy"] == {**policy, "kubernetes": kubernetes}


@pytest.mark.parametrize(
    ("kind", "policy", "field"),
    [
        ("platform", {"kubernetes": JOIN_SET}, "policy.platformOperated"),
        (
            "platform",
            {"kubernetes": JOIN_SET, "platformOperated": False},
            "policy.platformOperated",
        ),
        ("platform", {"kubernetes": JOIN_SET, "platformOperated": True}, None),
        ("platform", {"kubernetes": {"labels": {"team": "ml"}}}, None),
        ("custom", {"kubernetes": JOIN_SET}, None),
    ],
    ids=["platform-missing", "platform-false", "platform-true", "platform-no-join", "custom"],
)
async def test_platform_site_join_set_needs_platform_operated(
    api: Api, fleet: Fleet, kind: str, policy: dict[str, Any], field: str | None
) -> None:
    """On a platform (non-custom) site, a kubernetes join set also needs platformOperated:
    true: the cluster's admins get root on the machines, which keep their platform trust."""
    await fleet.tenant("acme")
    site = await fleet.site("acme", kind=kind)
    token = await fleet.caller("acme")
    body = {"tenantId": "acme", "siteId": site, "class": "metal-host", "policy": policy}
    response = await api.post(token, "pools/create", body)
    if field is None:
        assert response.status_code == 200, response.text
        read = {**policy, "kubernetes": JOIN_READ} if policy["kubernetes"] == JOIN_SET else policy
        assert response.json()["pool"]["policy"] == read
    else:
        error = response.json()["error"]
        assert (response.status_code, error["code"], error["details"]["field"]) == (
            400,
            "INVALID_INPUT",
            field,
        )


async def test_idempotency_key_derives_the_pool_id_from_tenant_caller_and_key(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """With idempotencyKey, the pool id is derived from the tenant, the caller and the key."""
    site, _ = await _acme(fleet)
    await fleet.tenant("fleet")
    beta_site = await fleet.site(await fleet.tenant("beta"))
    first_caller, first = await create_caller(db, "acme", "admin")
    _, second = await create_caller(db, "acme", "admin")
    admin_caller, admin = await create_caller(db, "fleet", "fleet-admin")

    mine = await create_pool(api, first, "acme", site, idempotencyKey="k-1")
    assert mine["id"] == derived_id("pool", "acme", first_caller, "k-1")
    other_key = await create_pool(api, first, "acme", site, idempotencyKey="k-2")
    other_caller = await create_pool(api, second, "acme", site, idempotencyKey="k-1")
    for_acme = await create_pool(api, admin, "acme", site, idempotencyKey="k-1")
    for_beta = await create_pool(api, admin, "beta", beta_site, idempotencyKey="k-1")
    assert for_beta["id"] == derived_id("pool", "beta", admin_caller, "k-1")
    ids = [p["id"] for p in (mine, other_key, other_caller, for_acme, for_beta)]
    assert len(set(ids)) == 5


async def test_retry_returns_stored_pool_without_second_iam_decision_or_event(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """A retry returns the stored pool without a second IAM decision; CONTRACT 5: same id,
    stored pool returned, no second event."""
    site, _ = await _acme(fleet)
    caller_id, token = await create_caller(db, "acme", "admin")
    body = {"tenantId": "acme", "siteId": site, "class": "metal-host", "idempotencyKey": "once"}
    first = (await api.ok(token, "pools/create", body))["pool"]
    again = (await api.ok(token, "pools/create", body))["pool"]
    assert again == first
    assert await _events(db) == [("pool.created", first["id"])]

    # Narrow the caller to viewer: a fresh create is refused, the retry is not re-decided.
    async with db.writer.begin() as conn:
        await conn.execute(
            update(RoleBinding).where(RoleBinding.caller_id == caller_id).values(role="viewer")
        )
    fresh = {**body, "idempotencyKey": "fresh"}
    status, error = await api.fails(token, "pools/create", fresh)
    assert (status, error["code"]) == (403, "PERMISSION_DENIED")
    retried = (await api.ok(token, "pools/create", body))["pool"]
    assert {k: v for k, v in retried.items() if k != "offers"} == {
        k: v for k, v in first.items() if k != "offers"
    }
    assert retried["offers"] is None  # the viewer's view: no compute:pools:share
    assert await row_count(db, "pools") == 1
    assert await _events(db) == [("pool.created", first["id"])]


@pytest.mark.parametrize("change", ["siteId", "class", "sharing", "agent", "providerAccountId"])
async def test_same_key_with_different_site_class_sharing_agent_or_account_is_conflict(
    api: Api, fleet: Fleet, db: Database, change: str
) -> None:
    """The same key with a different site, class, sharing mode, agent or provider account is
    CONFLICT."""
    site, token = await _acme(fleet)
    account = await fleet.account("acme")
    base: dict[str, Any] = {"tenantId": "acme", "siteId": site, "idempotencyKey": "k"}
    if change == "providerAccountId":
        base |= {"class": "provider", "providerAccountId": account}
    else:
        base |= {"class": "metal-host"}
    await api.ok(token, "pools/create", base)
    changed = {
        "siteId": await fleet.site("acme"),
        "class": "metal-dedicated",
        "sharing": "mig",
        "agent": "none",
        "providerAccountId": await fleet.account("acme"),
    }[change]
    before = await row_counts(db)
    status, error = await api.fails(token, "pools/create", {**base, change: changed})
    assert (status, error["code"], error["details"]["field"]) == (409, "CONFLICT", "idempotencyKey")
    assert await row_counts(db) == before


@pytest.mark.parametrize(
    ("change", "value"),
    [("gpuModel", "A100"), ("policy", {"kernelModules": ["vfio"]}), ("ownerQuota", {"gpu": 1})],
)
async def test_same_key_with_different_gpu_model_policy_or_owner_quota_is_not_conflict(
    api: Api, fleet: Fleet, db: Database, change: str, value: Any
) -> None:
    """CONTRACT 5: a different gpuModel, policy or ownerQuota under the same key is not
    CONFLICT; the retry returns the stored pool."""
    site, token = await _acme(fleet)
    body = {
        "tenantId": "acme",
        "siteId": site,
        "class": "metal-host",
        "gpuModel": "H100",
        "idempotencyKey": "k",
    }
    first = (await api.ok(token, "pools/create", body))["pool"]
    retried = (await api.ok(token, "pools/create", {**body, change: value}))["pool"]
    assert retried == first
    assert await row_count(db, "pools") == 1


async def test_explicit_agent_matching_the_default_is_the_same_request(
    api: Api, fleet: Fleet
) -> None:
    """sharing defaults to exclusive and agent to bcd: a retry that spells the defaults out is
    the same request, not CONFLICT."""
    site, token = await _acme(fleet)
    body = {"tenantId": "acme", "siteId": site, "class": "metal-host", "idempotencyKey": "k"}
    first = (await api.ok(token, "pools/create", body))["pool"]
    spelled = {**body, "agent": "bcd", "sharing": "exclusive"}
    assert (await api.ok(token, "pools/create", spelled))["pool"]["id"] == first["id"]


async def test_a_site_the_tenant_does_not_own_is_not_found(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """A site the tenant does not own is NOT_FOUND; it answers exactly as a missing site."""
    _, token = await _acme(fleet)
    await fleet.tenant("beta")
    theirs = await fleet.site("beta")
    answers = []
    for site in (theirs, MISSING_SITE):
        response = await api.post(
            token, "pools/create", {"tenantId": "acme", "siteId": site, "class": "metal-host"}
        )
        answers.append((response.status_code, response.text.replace(site, "<id>")))
    assert answers[0] == answers[1]
    assert answers[0][0] == 404 and '"field":"siteId"' in answers[0][1]
    assert await row_count(db, "pools") == 0


async def test_create_emits_pool_created(api: Api, fleet: Fleet, db: Database) -> None:
    """Emits pool.created."""
    site, token = await _acme(fleet)
    pool = await create_pool(api, token, "acme", site)
    assert await _events(db) == [("pool.created", pool["id"])]
