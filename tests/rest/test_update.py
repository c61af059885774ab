"""pools/update: each rule sentence of the seed's `update` section, and CONTRACT section 5."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import select

from app.db.engine import Database
from app.db.models import Site
from tests.rest.scene import Scene, events, fetch
from tests.support import Api, Fleet

JOIN_SET = {
    "apiServer": "https://k8s.example.com:6443",
    "token": "abcdef.0123456789abcdef",
    "caCertHash": "sha256:" + "a" * 64,
}


async def _update(s: Scene, pool_id: str, **fields: Any) -> dict[str, Any]:
    pool: dict[str, Any] = (await s.api.ok(s.token, "pools/update", s.body(pool_id, **fields)))[
        "pool"
    ]
    return pool


async def _refused(s: Scene, pool_id: str, **fields: Any) -> tuple[str, str | None]:
    """(code, details.field) of an update that must fail; the pool must be unchanged."""
    before = await s.get(pool_id)
    _, error = await s.api.fails(s.token, "pools/update", s.body(pool_id, **fields))
    assert await s.get(pool_id) == before
    return error["code"], error["details"].get("field")


@pytest.mark.parametrize(
    "change",
    [
        {"policy": {"kernelModules": ["vfio_pci"]}},
        {"gpuModel": "A100"},
        {"policy": {"singleTenant": True}, "gpuModel": "L40S"},
    ],
    ids=["policy", "gpuModel", "both"],
)
async def test_update_replaces_fields_and_increments_the_version(
    api: Api, fleet: Fleet, change: dict[str, Any]
) -> None:
    """Replaces the policy, the GPU model, or both, of a pool the tenant owns, and returns the
    pool with its version incremented."""
    s = await Scene.start(api, fleet)
    pool = await s.pool(gpuModel="H100")
    updated = await _update(s, pool["id"], **change)
    assert updated["version"] == 2
    assert updated["policy"] == change.get("policy", {})
    assert updated["gpuModel"] == change.get("gpuModel", "H100")
    assert updated == await s.get(pool["id"])
    assert (await _update(s, pool["id"], gpuModel="B200"))["version"] == 3


async def test_the_new_policy_replaces_the_old_one_whole(api: Api, fleet: Fleet) -> None:
    """The new policy replaces the old one as a whole, ..."""
    s = await Scene.start(api, fleet)
    pool = await s.pool(policy={"hugepages": {"1Gi": 8}, "kernelModules": ["nvidia"]})
    updated = await _update(s, pool["id"], policy={"kernelModules": ["vfio_pci"]})
    assert updated["policy"] == {"kernelModules": ["vfio_pci"]}
    assert (await _update(s, pool["id"], policy={}))["policy"] == {}


# One per validator module (each is unit-tested in tests/capacity/test_policy.py).
BAD_POLICIES = [
    ({"hugepage": {"2Mi": 1}}, "policy.hugepage"),
    ({"hugepages": {"2Mi": 1_048_577}}, "policy.hugepages.2Mi"),
    ({"kubernetes": {"apiServer": JOIN_SET["apiServer"]}}, "policy.kubernetes.token"),
    ({"sharing": {"replicas": 4}}, "policy.sharing"),  # an exclusive pool
    ({"prewarmImages": ["ubuntu"]}, "policy.prewarmImages[0]"),
]


@pytest.mark.parametrize(("policy", "field"), BAD_POLICIES, ids=[f for _, f in BAD_POLICIES])
async def test_the_new_policy_is_checked_as_on_create(
    api: Api, fleet: Fleet, policy: dict[str, Any], field: str
) -> None:
    """... and is checked as on create: the pool-policy validators, ... (create: a policy
    nodes can't take is INVALID_INPUT)."""
    s = await Scene.start(api, fleet)
    pool = await s.pool()
    assert await _refused(s, pool["id"], policy=policy) == ("INVALID_INPUT", field)


async def test_a_platform_sites_kubernetes_join_needs_platform_operated(
    api: Api, fleet: Fleet
) -> None:
    """... and platformOperated for a platform site's Kubernetes join."""
    s = await Scene.start(api, fleet, site_kind="platform")
    pool = await s.pool()
    assert await _refused(s, pool["id"], policy={"kubernetes": JOIN_SET}) == (
        "INVALID_INPUT",
        "policy.platformOperated",
    )
    joined = {"kubernetes": JOIN_SET, "platformOperated": True}
    read = {"kubernetes": {**JOIN_SET, "tokenSet": True}, "platformOperated": True}
    del read["kubernetes"]["token"]  # write-only (CONTRACT section 6)
    assert (await _update(s, pool["id"], policy=joined))["policy"] == read

    custom_site = await fleet.site("acme", kind="custom")
    custom = await s.pool(siteId=custom_site)
    assert (await _update(s, custom["id"], policy={"kubernetes": JOIN_SET}))["version"] == 2


async def test_a_request_with_neither_field_is_invalid_input(api: Api, fleet: Fleet) -> None:
    """A request with neither field is INVALID_INPUT."""
    s = await Scene.start(api, fleet)
    pool = await s.pool()
    code, _ = await _refused(s, pool["id"])
    assert code == "INVALID_INPUT"


@pytest.mark.parametrize(
    ("field", "value"),
    [("class", "vps-host"), ("siteId", "site_" + "0" * 26), ("sharing", "mig"), ("agent", "none")],
)
async def test_class_site_sharing_and_agent_cannot_change(
    api: Api, fleet: Fleet, field: str, value: str
) -> None:
    """Class, site, sharing mode and agent cannot change."""
    s = await Scene.start(api, fleet)
    pool = await s.pool()
    assert await _refused(s, pool["id"], gpuModel="A100", **{field: value}) == (
        "INVALID_INPUT",
        field,
    )


async def test_updating_an_archived_pool_is_invalid_state(api: Api, fleet: Fleet) -> None:
    """CONTRACT 5: updating an archived pool is INVALID_STATE."""
    s = await Scene.start(api, fleet)
    pool = await s.pool()
    await s.archive(pool["id"])
    code, _ = await _refused(s, pool["id"], gpuModel="A100")
    assert code == "INVALID_STATE"


# -- singleTenant --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("offers", "refused"),
    [
        ([], False),
        ([("beta", False)], False),
        ([("beta", False), ("gamma", False)], True),
        ([("beta", True)], True),
        ([("acme", True)], True),  # the owner's own offer counts too
    ],
    ids=["owner-only", "one-tenant", "two-tenants", "descendants", "owner-descendants"],
)
async def test_single_tenant_is_refused_while_shared(
    api: Api, fleet: Fleet, offers: list[tuple[str, bool]], refused: bool
) -> None:
    """Turning policy.singleTenant on is INVALID_STATE while more than one tenant, or any
    tenant with includeDescendants, holds an offer."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    await s.guest("gamma")
    pool = await s.pool()
    for tenant, descendants in offers:
        await s.offer(pool["id"], tenant, {"gpu": 1}, includeDescendants=descendants)
    change = {"policy": {"singleTenant": True}}
    if refused:
        assert await _refused(s, pool["id"], **change) == (
            "INVALID_STATE",
            "policy.singleTenant",
        )
    else:
        assert (await _update(s, pool["id"], **change))["policy"] == {"singleTenant": True}


# -- the rollup and the agents -------------------------------------------------------------


async def test_a_new_mig_layout_never_repartitions_booked_gpus(api: Api, fleet: Fleet) -> None:
    """A new migLayout in a mig pool never repartitions booked GPUs; each node takes the new
    layout once its GPUs are idle."""
    s = await Scene.start(api, fleet)
    pool = await s.pool(
        sharing="mig",
        policy={"migLayout": ["3g.40gb", "3g.40gb"]},
        ownerQuota={"gpu": 100, "gpu.mig": 100},
    )
    await fleet.node(pool["id"], 2)
    assert (await s.capacity(pool["id"]))["gpu.mig"]["total"] == 4
    booking = await s.reserve(pool["id"], {"gpu.mig": 3})

    await _update(s, pool["id"], policy={"migLayout": ["7g.80gb"]})
    mig = (await s.capacity(pool["id"]))["gpu.mig"]
    assert (mig["total"], mig["allocatable"], mig["booked"], mig["available"]) == (2, 3, 3, 0)

    await s.release(booking["id"])
    mig = (await s.capacity(pool["id"]))["gpu.mig"]
    assert (mig["total"], mig["allocatable"], mig["booked"], mig["available"]) == (2, 2, 0, 2)
    _, error = await api.fails(
        s.token,
        "reservations/create",
        {"tenantId": "acme", "poolId": pool["id"], "resources": {"gpu.mig": 3}},
    )
    assert error["code"] == "RESOURCE_EXHAUSTED"


async def test_fewer_replicas_never_take_back_booked_slots(api: Api, fleet: Fleet) -> None:
    """The same rule for a timeslice pool's sharing.replicas (gpu.slot = GPUs x replicas)."""
    s = await Scene.start(api, fleet)
    pool = await s.pool(
        sharing="timeslice",
        policy={"sharing": {"replicas": 4}},
        ownerQuota={"gpu.slot": 100},
    )
    await fleet.node(pool["id"], 2)
    await s.reserve(pool["id"], {"gpu.slot": 6})
    await _update(s, pool["id"], policy={"sharing": {"replicas": 2}})
    slot = (await s.capacity(pool["id"]))["gpu.slot"]
    assert (slot["total"], slot["allocatable"], slot["booked"]) == (4, 6, 6)
    await _update(s, pool["id"], policy={"sharing": {"replicas": 8}})
    slot = (await s.capacity(pool["id"]))["gpu.slot"]
    assert (slot["total"], slot["allocatable"], slot["booked"]) == (16, 16, 6)


async def _agent_revision(db: Database, site_id: str) -> int:
    rows = await fetch(db, select(Site.agent_revision).where(Site.id == site_id))
    return int(rows[0].agent_revision)


async def test_a_prewarm_images_change_refreshes_the_sites_agents(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """A change to prewarmImages refreshes the desired state of the site's agents."""
    s = await Scene.start(api, fleet)
    pool = await s.pool()
    other_site = await fleet.site("acme")
    start = await _agent_revision(db, s.site)
    images = ["nvcr.io/nvidia/pytorch:24.05-py3"]

    await _update(s, pool["id"], policy={"prewarmImages": images})
    assert await _agent_revision(db, s.site) == start + 1
    await _update(s, pool["id"], policy={"prewarmImages": images, "kernelModules": ["nvidia"]})
    await _update(s, pool["id"], gpuModel="H100")
    assert await _agent_revision(db, s.site) == start + 1  # images unchanged
    await _update(s, pool["id"], policy={})
    assert await _agent_revision(db, s.site) == start + 2
    assert await _agent_revision(db, other_site) == start  # another site's agents: untouched


async def test_concurrent_prewarm_changes_of_one_sites_pools_each_refresh_its_agents(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """Eight pools of one site change their prewarmImages at once: the site's revision
    moves by eight (an increment read and written back by each would lose some)."""
    s = await Scene.start(api, fleet)
    pools = [(await s.pool())["id"] for _ in range(8)]
    start = await _agent_revision(db, s.site)
    images = ["nvcr.io/nvidia/pytorch:24.05-py3"]
    await asyncio.gather(*(_update(s, p, policy={"prewarmImages": images}) for p in pools))
    assert await _agent_revision(db, s.site) == start + 8


async def test_authz_rows_are_refreshed_for_the_owner_and_every_offered_tenant(
    api: Api, fleet: Fleet
) -> None:
    """The pool's authz rows are refreshed for the owner and every offered tenant."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    await s.guest("gamma")
    pool = await s.pool(gpuModel="H100")
    await s.offer(pool["id"], "beta", {"gpu": 1})
    await s.offer(pool["id"], "gamma", {"gpu": 1})
    narrowed = {
        (tenant, model): await fleet.caller(tenant, "viewer", gpuModel=model)
        for tenant in ("acme", "beta", "gamma")
        for model in ("H100", "A100")
    }

    async def seen(tenant: str, model: str) -> bool:
        body = {"tenantId": tenant}
        listed = (await api.ok(narrowed[(tenant, model)], "pools/list", body))["pools"]
        return [p["id"] for p in listed] == [pool["id"]]

    for tenant in ("acme", "beta", "gamma"):
        assert (await seen(tenant, "H100"), await seen(tenant, "A100")) == (True, False)
    await _update(s, pool["id"], gpuModel="A100")
    for tenant in ("acme", "beta", "gamma"):
        assert (await seen(tenant, "H100"), await seen(tenant, "A100")) == (False, True)


async def test_a_narrowed_binding_cannot_move_a_pool_outside_itself(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """CONTRACT 2: a binding narrowed to gpuModel=H100 applies only to H100 pools, so its
    update must leave the pool an H100 pool (as its create must make one). Decided before
    the state rules, like the permission on the pool."""
    s = await Scene.start(api, fleet)
    pool = await s.pool(gpuModel="H100")
    narrowed = await fleet.caller("acme", "operator", gpuModel="H100")
    before = await s.get(pool["id"])
    for change in ({"gpuModel": "A100"}, {"gpuModel": "A100", "policy": {}}):
        _, error = await api.fails(narrowed, "pools/update", s.body(pool["id"], **change))
        assert error["code"] == "PERMISSION_DENIED", change
    assert await s.get(pool["id"]) == before
    assert [e.type for e in await events(db, pool["id"])] == ["pool.created"]
    # Within the binding it may update, gpuModel included.
    body = s.body(pool["id"], gpuModel="H100", policy={"kernelModules": ["vfio_pci"]})
    assert (await api.ok(narrowed, "pools/update", body))["pool"]["version"] == 2
    # Archived, the permission still comes first.
    await s.archive(pool["id"])
    _, error = await api.fails(narrowed, "pools/update", s.body(pool["id"], gpuModel="A100"))
    assert error["code"] == "PERMISSION_DENIED"
