"""Rules found in review: the owner cannot share a timeslice, mps or tenant-node pool
with its subtree through its own offer, and a booking near 2^63 is refused, not a 500."""

from __future__ import annotations

import pytest

from tests.rest.scene import Scene
from tests.support import Api, Fleet

MAX = 2**63 - 1


@pytest.mark.parametrize("sharing", ["timeslice", "mps"])
async def test_owner_offer_with_descendants_on_a_shared_gpu_pool_is_invalid_state(
    api: Api, fleet: Fleet, sharing: str
) -> None:
    """Seed: INVALID_STATE "when a timeslice or mps pool ... is offered to anyone but its
    owner"; including descendants in the owner's own offer offers it to them."""
    s = await Scene.start(api, fleet)
    await s.guest("acme-lab", parent=s.owner)
    pool_id = (await s.pool(sharing=sharing))["id"]
    body = s.body(pool_id, toTenantId=s.owner, quota={"gpu": 4}, includeDescendants=True)
    status, error = await api.fails(s.token, "pools/offer", body)
    assert (status, error["code"]) == (409, "INVALID_STATE")
    await s.offer(pool_id, s.owner, {"gpu": 4})  # resizing its own rows stays allowed


async def test_owner_offer_with_descendants_on_a_tenant_node_pool_is_invalid_state(
    api: Api, fleet: Fleet
) -> None:
    s = await Scene.start(api, fleet)
    pool_id = (await s.pool())["id"]
    await fleet.node(pool_id, 4, owner=s.owner)
    body = s.body(pool_id, toTenantId=s.owner, quota={"gpu": 4}, includeDescendants=True)
    status, error = await api.fails(s.token, "pools/offer", body)
    assert (status, error["code"]) == (409, "INVALID_STATE")


async def test_a_booking_that_would_overflow_the_counter_is_resource_exhausted(
    api: Api, fleet: Fleet
) -> None:
    s = await Scene.start(api, fleet)
    pool_id = (await s.pool(ownerQuota={"gpu": MAX}))["id"]
    await fleet.node(pool_id, 8)
    book = {"tenantId": s.owner, "poolId": pool_id, "resources": {"gpu": 1}}
    await api.ok(s.token, "reservations/create", book)
    status, error = await api.fails(
        s.token, "reservations/create", {**book, "resources": {"gpu": MAX}}
    )
    assert (status, error["code"], error["details"]["field"]) == (
        429,
        "RESOURCE_EXHAUSTED",
        "resources.gpu",
    )
