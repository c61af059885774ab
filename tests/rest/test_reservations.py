"""reservations/create, release, list (CONTRACT sections 4 and 5) and the rollup they book."""

from __future__ import annotations

from typing import Any

import pytest

from app.db.engine import Database
from tests.rest.scene import Scene, quota_rows, quotas
from tests.support import Api, Fleet


async def _exhausted(
    s: Scene,
    pool_id: str,
    resources: dict[str, int],
    token: str | None = None,
    tenant: str | None = None,
) -> dict[str, Any]:
    body = {"tenantId": tenant or s.owner, "poolId": pool_id, "resources": resources}
    status, error = await s.api.fails(token or s.token, "reservations/create", body)
    assert (status, error["code"]) == (429, "RESOURCE_EXHAUSTED"), error
    return error


async def test_a_reservation_books_the_tenants_quota_and_the_rollup(api: Api, fleet: Fleet) -> None:
    """CONTRACT 5: reservations book against the acting tenant's quota row and against the
    rollup's available."""
    s = await Scene.start(api, fleet)
    beta = await s.guest("beta", role="operator")
    pool = await s.pool()
    await fleet.node(pool["id"], 8)
    await s.offer(pool["id"], "beta", {"gpu": 4})

    booked = await s.reserve(pool["id"], {"gpu": 3}, beta, "beta")
    assert booked["id"].startswith("rsv_") and booked["endedAt"] is None
    assert {k: booked[k] for k in ("poolId", "tenantId", "resources", "state")} == {
        "poolId": pool["id"],
        "tenantId": "beta",
        "resources": {"gpu": 3},
        "state": "active",
    }
    assert quotas(await s.get(pool["id"], beta, "beta")) == {"gpu": (4, 3)}
    assert quotas(await s.get(pool["id"])) == {"gpu": (2_147_483_647, 0)}  # not the owner's
    gpu = (await s.capacity(pool["id"]))["gpu"]
    assert (gpu["total"], gpu["booked"], gpu["available"]) == (8, 3, 5)


async def test_a_descendant_books_against_the_ancestors_row(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """CONTRACT 5: ... (or, for a descendant, the row of the ancestor whose offer includes
    descendants)."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    child = await s.guest("beta-dev", parent="beta")
    grandchild = await s.guest("beta-dev-1", parent="beta-dev")
    pool = await s.pool()
    await fleet.node(pool["id"], 8)
    await s.offer(pool["id"], "beta", {"gpu": 3}, includeDescendants=True)

    await s.reserve(pool["id"], {"gpu": 1}, child, "beta-dev")
    await s.reserve(pool["id"], {"gpu": 2}, grandchild, "beta-dev-1")
    assert await quota_rows(db, pool["id"], "beta") == {"gpu": (3, 3)}
    assert await quota_rows(db, pool["id"], "beta-dev") == {}
    # It sees the ancestor's rows it books on, read-only (CONTRACT section 10).
    assert quotas(await s.get(pool["id"], child, "beta-dev")) == {"gpu": (3, 3)}
    error = await _exhausted(s, pool["id"], {"gpu": 1}, child, "beta-dev")
    assert error["details"]["field"] == "resources.gpu"


async def test_without_include_descendants_a_child_cannot_book(api: Api, fleet: Fleet) -> None:
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    child = await s.guest("beta-dev", parent="beta")
    pool = await s.pool()
    await fleet.node(pool["id"], 8)
    await s.offer(pool["id"], "beta", {"gpu": 3})
    body = {"tenantId": "beta-dev", "poolId": pool["id"], "resources": {"gpu": 1}}
    status, error = await api.fails(child, "reservations/create", body)
    assert (status, error["code"]) == (404, "NOT_FOUND")


async def test_quota_exhaustion_books_nothing(api: Api, fleet: Fleet) -> None:
    """CONTRACT 5: either would be exceeded: RESOURCE_EXHAUSTED (here the quota)."""
    s = await Scene.start(api, fleet)
    beta = await s.guest("beta")
    pool = await s.pool()
    await fleet.node(pool["id"], 8)
    await s.offer(pool["id"], "beta", {"gpu": 2})
    await s.reserve(pool["id"], {"gpu": 1}, beta, "beta")

    error = await _exhausted(s, pool["id"], {"gpu": 2}, beta, "beta")
    assert error["details"]["field"] == "resources.gpu"
    # A resource with no row: a missing row grants 0.
    error = await _exhausted(s, pool["id"], {"gpu": 1, "nvme": 1}, beta, "beta")
    assert error["details"]["field"] == "resources.nvme"
    assert quotas(await s.get(pool["id"], beta, "beta")) == {"gpu": (2, 1)}
    assert (await s.capacity(pool["id"]))["gpu"]["booked"] == 1


async def test_capacity_exhaustion_books_nothing(api: Api, fleet: Fleet) -> None:
    """CONTRACT 5: either would be exceeded: RESOURCE_EXHAUSTED (here the rollup)."""
    s = await Scene.start(api, fleet)
    pool = await s.pool(ownerQuota={"gpu": 100, "gpu.mig": 100})
    error = await _exhausted(s, pool["id"], {"gpu": 1})  # no nodes: no capacity
    assert error["details"]["field"] == "resources.gpu"

    await fleet.node(pool["id"], 4)
    await s.reserve(pool["id"], {"gpu": 3})
    error = await _exhausted(s, pool["id"], {"gpu": 2})
    assert error["details"]["field"] == "resources.gpu"
    # An exclusive pool has no gpu.mig in its rollup, whatever the quota says.
    error = await _exhausted(s, pool["id"], {"gpu": 1, "gpu.mig": 1})
    assert error["details"]["field"] == "resources.gpu.mig"
    assert quotas(await s.get(pool["id"])) == {"gpu": (100, 3), "gpu.mig": (100, 0)}
    gpu = (await s.capacity(pool["id"]))["gpu"]
    assert (gpu["booked"], gpu["available"]) == (3, 1)


async def test_release_returns_the_booking_and_twice_is_a_no_op(api: Api, fleet: Fleet) -> None:
    """CONTRACT 4: .../release ... releasing twice is a no-op."""
    s = await Scene.start(api, fleet)
    pool = await s.pool(ownerQuota={"gpu": 5})
    await fleet.node(pool["id"], 8)
    booking = await s.reserve(pool["id"], {"gpu": 4})
    kept = await s.reserve(pool["id"], {"gpu": 1})

    ended = await s.release(booking["id"])
    assert ended["state"] == "ended" and ended["endedAt"] is not None
    assert {k: ended[k] for k in ("id", "resources", "createdAt")} == {
        k: booking[k] for k in ("id", "resources", "createdAt")
    }
    assert await s.release(booking["id"]) == ended
    assert quotas(await s.get(pool["id"])) == {"gpu": (5, 1)}
    assert (await s.capacity(pool["id"]))["gpu"]["booked"] == 1
    assert (await s.release(kept["id"]))["state"] == "ended"


async def test_a_reservation_of_another_tenant_is_not_found(api: Api, fleet: Fleet) -> None:
    s = await Scene.start(api, fleet)
    beta = await s.guest("beta")
    pool = await s.pool()
    await fleet.node(pool["id"], 2)
    booking = await s.reserve(pool["id"], {"gpu": 1})
    status, error = await api.fails(
        beta, "reservations/release", {"tenantId": "beta", "reservationId": booking["id"]}
    )
    assert (status, error["code"], error["details"]["field"]) == (
        404,
        "NOT_FOUND",
        "reservationId",
    )


async def test_release_after_unoffer_works(api: Api, fleet: Fleet, db: Database) -> None:
    """The seed: live reservations keep their bookings until they end; so their holder can
    end them after the offer is gone."""
    s = await Scene.start(api, fleet)
    beta = await s.guest("beta")
    pool = await s.pool()
    await fleet.node(pool["id"], 8)
    await s.offer(pool["id"], "beta", {"gpu": 4})
    booking = await s.reserve(pool["id"], {"gpu": 3}, beta, "beta")
    await s.unoffer(pool["id"], "beta")

    assert (await s.release(booking["id"], beta, "beta"))["state"] == "ended"
    assert (await quota_rows(db, pool["id"], "beta"))["gpu"][1] == 0
    assert (await s.capacity(pool["id"]))["gpu"]["booked"] == 0


async def test_an_idempotency_key_retry_returns_the_same_reservation(
    api: Api, fleet: Fleet
) -> None:
    """CONTRACT 4: create takes an idempotencyKey; a retry books nothing more."""
    s = await Scene.start(api, fleet)
    pool = await s.pool(ownerQuota={"gpu": 5})
    await fleet.node(pool["id"], 8)
    first = await s.reserve(pool["id"], {"gpu": 2}, idempotencyKey="job-1")
    assert await s.reserve(pool["id"], {"gpu": 2}, idempotencyKey="job-1") == first
    assert quotas(await s.get(pool["id"])) == {"gpu": (5, 2)}

    body = {"tenantId": "acme", "poolId": pool["id"], "resources": {"gpu": 3}}
    status, error = await api.fails(
        s.token, "reservations/create", body | {"idempotencyKey": "job-1"}
    )
    assert (status, error["code"]) == (409, "CONFLICT")
    # Another caller's key is its own.
    other = await fleet.caller("acme", "operator")
    second = await s.reserve(pool["id"], {"gpu": 2}, other, idempotencyKey="job-1")
    assert second["id"] != first["id"]
    assert quotas(await s.get(pool["id"])) == {"gpu": (5, 4)}


async def test_list_by_pool_and_used_equals_the_active_reservations(api: Api, fleet: Fleet) -> None:
    """CONTRACT 4: .../list ({tenantId, poolId?}); quota `used` is the sum of what the active
    reservations book."""
    s = await Scene.start(api, fleet)
    beta = await s.guest("beta")
    first = await s.pool(ownerQuota={"gpu": 50})
    second = await s.pool(ownerQuota={"gpu": 50})
    for pool in (first, second):
        await fleet.node(pool["id"], 16)
    made = [
        await s.reserve(pool["id"], {"gpu": n})
        for pool, n in [(first, 1), (second, 2), (first, 3), (first, 4), (second, 5)]
    ]
    await s.release(made[2]["id"])

    def listed(answer: dict[str, Any]) -> list[tuple[str, str]]:
        return [(r["id"], r["state"]) for r in answer["reservations"]]

    everything = await api.ok(s.token, "reservations/list", {"tenantId": "acme"})
    assert [r["id"] for r in everything["reservations"]] == [r["id"] for r in made]
    in_first = await api.ok(
        s.token, "reservations/list", {"tenantId": "acme", "poolId": first["id"]}
    )
    assert listed(in_first) == [
        (made[0]["id"], "active"),
        (made[2]["id"], "ended"),
        (made[3]["id"], "active"),
    ]
    for pool in (first, second):
        answer = await api.ok(
            s.token, "reservations/list", {"tenantId": "acme", "poolId": pool["id"]}
        )
        active = sum(
            r["resources"]["gpu"] for r in answer["reservations"] if r["state"] == "active"
        )
        assert quotas(await s.get(pool["id"]))["gpu"][1] == active
        assert (await s.capacity(pool["id"]))["gpu"]["booked"] == active
    assert (await api.ok(beta, "reservations/list", {"tenantId": "beta"}))["reservations"] == []
    status, error = await api.fails(
        beta, "reservations/list", {"tenantId": "beta", "poolId": first["id"]}
    )
    assert (status, error["code"]) == (404, "NOT_FOUND")


# -- the rollup ----------------------------------------------------------------------------

ROLLUPS = [
    # (sharing, policy, GPUs per node, expected capacity totals)
    ("exclusive", {}, (3, 1), {"gpu": 4}),
    ("timeslice", {"sharing": {"replicas": 3}}, (3, 1), {"gpu": 4, "gpu.slot": 12}),
    ("mps", {}, (2, 2), {"gpu": 4, "gpu.slot": 4}),
    ("mig", {"migLayout": ["2g.20gb", "2g.20gb", "3g.40gb"]}, (4,), {"gpu": 4, "gpu.mig": 12}),
]


@pytest.mark.parametrize(
    ("sharing", "policy", "nodes", "totals"), ROLLUPS, ids=[r[0] for r in ROLLUPS]
)
async def test_the_rollup_counts_units_from_the_nodes(
    api: Api,
    fleet: Fleet,
    sharing: str,
    policy: dict[str, Any],
    nodes: tuple[int, ...],
    totals: dict[str, int],
) -> None:
    """CONTRACT 1: gpu counts whole GPUs; gpu.mig counts MIG instances (mig pools); gpu.slot
    counts shared slots (timeslice and mps pools: GPUs x replicas)."""
    s = await Scene.start(api, fleet)
    quota = dict.fromkeys(totals, 1000)
    pool = await s.pool(sharing=sharing, policy=policy, ownerQuota=quota)
    assert await s.capacity(pool["id"]) == {}  # create: an empty rollup
    for gpus in nodes:
        await fleet.node(pool["id"], gpus)
    rows = await s.capacity(pool["id"])
    assert {r: (row["total"], row["allocatable"], row["available"]) for r, row in rows.items()} == {
        r: (n, n, n) for r, n in totals.items()
    }
    # The finest unit books down to zero and no further.
    unit = max(totals, key=lambda r: (totals[r], r))
    await s.reserve(pool["id"], {unit: totals[unit]})
    assert (await s.capacity(pool["id"]))[unit]["available"] == 0
    await _exhausted(s, pool["id"], {unit: 1})


async def test_a_narrowed_binding_decides_every_reservation_method_per_pool(
    api: Api, fleet: Fleet
) -> None:
    """CONTRACT 2: a binding narrowed by pool attributes applies only to matching pools, on
    every reservation method: create, release, and list with or without poolId. A
    reservation that outlives its offer is decided on its pool's attributes all the same."""
    s = await Scene.start(api, fleet)
    h100 = (await s.pool(gpuModel="H100"))["id"]
    a100 = (await s.pool(gpuModel="A100"))["id"]
    # beta lends acme an H100 pool, then withdraws the offer: acme's booking there stays.
    await fleet.tenant("beta")
    beta = await fleet.caller("beta", "admin")
    beta_site = await fleet.site("beta")
    body = {"tenantId": "beta", "siteId": beta_site, "class": "metal-host", "gpuModel": "H100"}
    lent = (await api.ok(beta, "pools/create", body))["pool"]["id"]
    for pool_id in (h100, a100, lent):
        await fleet.node(pool_id, 8)
    offer = {"tenantId": "beta", "poolId": lent, "toTenantId": "acme"}
    await api.ok(beta, "pools/offer", offer | {"quota": {"gpu": 4}})
    in_h100, in_a100, in_lent = [await s.reserve(p, {"gpu": 1}) for p in (h100, a100, lent)]
    await api.ok(beta, "pools/unoffer", offer)
    narrowed = await fleet.caller("acme", "operator", gpuModel="H100")

    listed = await api.ok(narrowed, "reservations/list", {"tenantId": "acme"})
    assert {r["id"] for r in listed["reservations"]} == {in_h100["id"], in_lent["id"]}
    listed = await api.ok(narrowed, "reservations/list", {"tenantId": "acme", "poolId": h100})
    assert [r["id"] for r in listed["reservations"]] == [in_h100["id"]]
    denied = [
        ("reservations/list", {"tenantId": "acme", "poolId": a100}),
        ("reservations/release", {"tenantId": "acme", "reservationId": in_a100["id"]}),
        ("reservations/create", {"tenantId": "acme", "poolId": a100, "resources": {"gpu": 1}}),
    ]
    for path, request in denied:
        status, error = await api.fails(narrowed, path, request)
        assert (status, error["code"]) == (403, "PERMISSION_DENIED"), path
    everything = await api.ok(s.token, "reservations/list", {"tenantId": "acme"})
    assert {r["id"]: r["state"] for r in everything["reservations"]} == {
        r["id"]: "active" for r in (in_h100, in_a100, in_lent)
    }
    assert (await s.release(in_h100["id"], narrowed))["state"] == "ended"
    assert (await s.release(in_lent["id"], narrowed))["state"] == "ended"
    assert (await s.capacity(a100))["gpu"]["booked"] == 1
