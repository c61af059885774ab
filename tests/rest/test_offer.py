"""pools/offer: each rule sentence of the seed's `offer` section, and CONTRACT section 5."""

from __future__ import annotations

import pytest

from tests.rest.scene import Scene, offers, quotas
from tests.support import Api, Fleet


async def test_offer_returns_the_pool_as_the_offered_tenant_sees_it(api: Api, fleet: Fleet) -> None:
    """Offers a pool the tenant owns to another tenant with a quota, or updates an existing
    offer and its quota; returns the pool as that tenant sees it."""
    s = await Scene.start(api, fleet)
    beta = await s.guest("beta")
    pool = await s.pool(gpuModel="H100")

    seen = await s.offer(pool["id"], "beta", {"gpu": 4})
    assert seen == await s.get(pool["id"], beta, "beta")
    assert seen["owned"] is False and seen["offers"] is None and seen["tenantId"] == "acme"
    assert quotas(seen) == {"gpu": (4, 0)}

    # A second offer updates the one offer rather than adding another.
    resized = await s.offer(pool["id"], "beta", {"gpu": 9})
    assert quotas(resized) == {"gpu": (9, 0)}
    owner_view = await s.get(pool["id"])
    assert sorted(offers(owner_view)) == ["acme", "beta"]
    assert quotas(owner_view) == {"gpu": (2_147_483_647, 0)}  # the owner's rows are its own


async def test_quota_creates_and_resizes_rows_and_leaves_unnamed_rows_alone(
    api: Api, fleet: Fleet
) -> None:
    """quota creates or resizes the offered tenant's quota rows."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    pool = await s.pool()
    assert quotas(await s.offer(pool["id"], "beta", {"gpu": 4})) == {"gpu": (4, 0)}
    grown = await s.offer(pool["id"], "beta", {"gpu": 6, "nvme": 2})
    assert quotas(grown) == {"gpu": (6, 0), "nvme": (2, 0)}
    # CONTRACT 5: rows not named keep their value.
    assert quotas(await s.offer(pool["id"], "beta", {"nvme": 1})) == {"gpu": (6, 0), "nvme": (1, 0)}


async def test_a_new_maximum_below_use_is_raised_to_the_use(api: Api, fleet: Fleet) -> None:
    """A new maximum below what is in use is raised to the amount in use."""
    s = await Scene.start(api, fleet)
    beta = await s.guest("beta")
    pool = await s.pool()
    await fleet.node(pool["id"], 8)
    await s.offer(pool["id"], "beta", {"gpu": 4})
    await s.reserve(pool["id"], {"gpu": 3}, beta, "beta")

    assert quotas(await s.offer(pool["id"], "beta", {"gpu": 1})) == {"gpu": (3, 3)}
    assert quotas(await s.offer(pool["id"], "beta", {"gpu": 0})) == {"gpu": (3, 3)}
    assert quotas(await s.offer(pool["id"], "beta", {"gpu": 5})) == {"gpu": (5, 3)}


async def test_offering_to_the_owner_updates_the_owners_rows(api: Api, fleet: Fleet) -> None:
    """CONTRACT 5: offering to the owner updates the owner's rows."""
    s = await Scene.start(api, fleet)
    pool = await s.pool(ownerQuota={"gpu": 10})
    seen = await s.offer(pool["id"], "acme", {"gpu": 3, "gpu.slot": 5}, priority=4)
    assert seen["owned"] is True
    assert quotas(seen) == {"gpu": (3, 0), "gpu.slot": (5, 0)}
    assert list(offers(seen)) == ["acme"]  # still the owner's one offer
    assert offers(seen)["acme"]["priority"] == 4


async def test_include_descendants_and_priority_are_stored_with_the_offer(
    api: Api, fleet: Fleet
) -> None:
    """includeDescendants and priority (default 0) are stored with the offer."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    await s.guest("gamma")
    child = await s.guest("beta-dev", parent="beta")
    pool = await s.pool()

    await s.offer(pool["id"], "gamma", {"gpu": 1})
    await s.offer(pool["id"], "beta", {"gpu": 2}, includeDescendants=True, priority=-7)
    stored = offers(await s.get(pool["id"]))
    assert stored["gamma"] == {
        "tenantId": "gamma",
        "includeDescendants": False,
        "priority": 0,
        "quotas": [{"resource": "gpu", "max": 1, "used": 0}],
    }
    assert (stored["beta"]["includeDescendants"], stored["beta"]["priority"]) == (True, -7)
    # The stored flag is live: the child tenant sees the pool through its parent's offer.
    assert (await s.get(pool["id"], child, "beta-dev"))["id"] == pool["id"]

    # Updating the offer replaces both; the child loses sight of the pool.
    await s.offer(pool["id"], "beta", {"gpu": 2})
    stored = offers(await s.get(pool["id"]))
    assert (stored["beta"]["includeDescendants"], stored["beta"]["priority"]) == (False, 0)
    status, error = await api.fails(
        child, "pools/get", {"tenantId": "beta-dev", "poolId": pool["id"]}
    )
    assert (status, error["code"]) == (404, "NOT_FOUND")


# -- INVALID_STATE -------------------------------------------------------------------------


async def _refused(s: Scene, pool_id: str, to: str, **fields: object) -> str | None:
    status, error = await s.api.fails(
        s.token, "pools/offer", s.body(pool_id, toTenantId=to, quota={"gpu": 1}, **fields)
    )
    assert (status, error["code"]) == (409, "INVALID_STATE"), error
    field: str | None = error["details"].get("field")
    return field


async def test_an_archived_pool_cannot_be_offered(api: Api, fleet: Fleet) -> None:
    """INVALID_STATE when the pool is archived, ..."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    pool = await s.pool()
    await s.archive(pool["id"])
    assert await _refused(s, pool["id"], "beta") == "poolId"
    assert await _refused(s, pool["id"], "acme") == "poolId"


async def test_a_refused_offer_answers_alike_whether_the_target_tenant_exists(
    api: Api, fleet: Fleet
) -> None:
    """No tenant-existence oracle: the state rules come before the target tenant's
    existence, so an archived, shared-GPU or taken singleTenant pool answers an offer to a
    missing toTenantId exactly as one to an existing tenant."""
    s = await Scene.start(api, fleet)
    for tenant in ("beta", "gamma"):
        await s.guest(tenant)
    archived = (await s.pool())["id"]
    await s.archive(archived)
    shared = (await s.pool(sharing="timeslice"))["id"]
    single = (await s.pool(policy={"singleTenant": True}))["id"]
    await s.offer(single, "gamma", {"gpu": 1})
    for pool_id in (archived, shared, single):
        answers = []
        for target in ("beta", "nobody"):
            body = s.body(pool_id, toTenantId=target, quota={"gpu": 1})
            answers.append(await api.fails(s.token, "pools/offer", body))
        assert answers[0] == answers[1], pool_id
        assert answers[0][1]["code"] == "INVALID_STATE"
    # Where the pool would take the offer, it takes it alike too (test_offer_tenant_oracle).


@pytest.mark.parametrize("sharing", ["timeslice", "mps"])
async def test_a_shared_gpu_pool_is_offered_only_to_its_owner(
    api: Api, fleet: Fleet, sharing: str
) -> None:
    """... when a timeslice or mps pool ... is offered to anyone but its owner, ..."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    pool = await s.pool(sharing=sharing)
    assert await _refused(s, pool["id"], "beta") == "toTenantId"
    assert quotas(await s.offer(pool["id"], "acme", {"gpu.slot": 8}))["gpu.slot"] == (8, 0)
    assert list(offers(await s.get(pool["id"]))) == ["acme"]


async def test_a_pool_holding_tenant_owned_nodes_is_offered_only_to_its_owner(
    api: Api, fleet: Fleet
) -> None:
    """... or a pool holding tenant-owned nodes is offered to anyone but its owner, ..."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    pool = await s.pool()
    await fleet.node(pool["id"], 2)
    await s.offer(pool["id"], "beta", {"gpu": 1})  # platform-owned nodes only: fine
    await fleet.node(pool["id"], 4, owner="acme")
    assert await _refused(s, pool["id"], "beta") == "toTenantId"
    assert quotas(await s.offer(pool["id"], "acme", {"gpu": 6})) == {"gpu": (6, 0)}


async def test_a_single_tenant_pool_refuses_include_descendants(api: Api, fleet: Fleet) -> None:
    """... or when a policy.singleTenant pool is offered with includeDescendants ..."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    pool = await s.pool(policy={"singleTenant": True})
    assert await _refused(s, pool["id"], "beta", includeDescendants=True) == "includeDescendants"
    assert await _refused(s, pool["id"], "acme", includeDescendants=True) == "includeDescendants"
    assert list(offers(await s.get(pool["id"]))) == ["acme"]


async def test_a_single_tenant_pool_already_offered_refuses_another_tenant(
    api: Api, fleet: Fleet
) -> None:
    """... or is already offered to another tenant."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    await s.guest("gamma")
    pool = await s.pool(policy={"singleTenant": True})
    await s.offer(pool["id"], "beta", {"gpu": 1})
    assert await _refused(s, pool["id"], "gamma") == "toTenantId"
    # The tenant that holds it may have its offer resized, and the owner its own rows.
    assert quotas(await s.offer(pool["id"], "beta", {"gpu": 3})) == {"gpu": (3, 0)}
    await s.offer(pool["id"], "acme", {"gpu": 5})
    # Once withdrawn, the pool may go to someone else.
    assert await s.unoffer(pool["id"], "beta")
    await s.offer(pool["id"], "gamma", {"gpu": 1})
    assert sorted(offers(await s.get(pool["id"]))) == ["acme", "gamma"]


# -- the authz row -------------------------------------------------------------------------

ATTRIBUTES = [
    # (binding key, value the offered tenant's row carries, a value it does not)
    ("gpuModel", "H100", "A100"),
    ("class", "metal-dedicated", "metal-host"),
    ("sharing", "mig", "exclusive"),
    ("region", "ap-south", "eu-west"),
    ("owned", "false", "true"),
]


@pytest.mark.parametrize(("key", "match", "mismatch"), ATTRIBUTES, ids=[a[0] for a in ATTRIBUTES])
async def test_the_authz_row_carries_the_pool_attributes_for_the_offered_tenant(
    api: Api, fleet: Fleet, key: str, match: str, mismatch: str
) -> None:
    """The pool's IAM authz row is written for the offered tenant, with the attributes
    gpuModel, class, sharing, region and owned."""
    await fleet.tenant("acme")
    site = await fleet.site("acme", region="ap-south")
    s = Scene(api, fleet, "acme", await fleet.caller("acme"), site)
    narrowed = await s.guest("beta", role="viewer", **{key: match})
    other = await fleet.caller("beta", "viewer", **{key: mismatch})
    pool = await s.pool(**{"class": "metal-dedicated"}, gpuModel="H100", sharing="mig")
    listed = {"tenantId": "beta"}

    assert (await api.ok(narrowed, "pools/list", listed))["pools"] == []  # no row yet
    await s.offer(pool["id"], "beta", {"gpu.mig": 2})
    assert [p["id"] for p in (await api.ok(narrowed, "pools/list", listed))["pools"]] == [
        pool["id"]
    ]
    assert (await s.get(pool["id"], narrowed, "beta"))["id"] == pool["id"]
    assert (await api.ok(other, "pools/list", listed))["pools"] == []


@pytest.mark.parametrize("method", ["offer", "unoffer", "update", "archive"])
async def test_only_the_owner_can_call_it(api: Api, fleet: Fleet, method: str) -> None:
    """Only the owner can offer, unoffer, update or archive a pool; anyone else gets
    `NOT_FOUND` (the seed's group rule), even a tenant the pool is offered to."""
    s = await Scene.start(api, fleet)
    beta = await s.guest("beta")
    pool = await s.pool()
    await s.offer(pool["id"], "beta", {"gpu": 1})
    extra = {
        "offer": {"toTenantId": "beta", "quota": {"gpu": 9}},
        "unoffer": {"toTenantId": "beta"},
        "update": {"gpuModel": "A100"},
        "archive": {},
    }[method]
    body = {"tenantId": "beta", "poolId": pool["id"], **extra}
    status, error = await api.fails(beta, f"pools/{method}", body)
    assert (status, error["code"]) == (404, "NOT_FOUND")
    assert (await s.get(pool["id"]))["version"] == 2  # the one offer's
