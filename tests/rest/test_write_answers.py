"""A pool write answers the pool as a `get` right after it shows it to the same caller:
the owner's answer is built from the row the write holds (pool_reads.owned_pool_detail),
its offers and quota rows read with the write (issue 20), not read back as a `get` does.
For an admin (offers shown) and an operator (no compute:pools:share: offers withheld)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.rest.scene import Scene, quotas
from tests.support import Api, Fleet

Json = dict[str, Any]


@pytest.mark.parametrize("role", ["admin", "operator"])
async def test_a_writes_answer_is_what_get_shows(api: Api, fleet: Fleet, role: str) -> None:
    await fleet.tenant("acme")
    await fleet.tenant("guest")
    site = await fleet.site("acme")
    admin = await fleet.caller("acme", "admin")
    token = admin if role == "admin" else await fleet.caller("acme", role)
    quota = {"gpu": 8, "cpu": 64}
    create = {"tenantId": "acme", "siteId": site, "class": "metal-host", "ownerQuota": quota}

    async def answered(path: str, body: Json, caller: str) -> Json:
        pool: Json = (await api.ok(caller, path, body))["pool"]
        got = await api.ok(caller, "pools/get", {"tenantId": "acme", "poolId": pool["id"]})
        assert pool == got["pool"], path
        return pool

    made = await answered("pools/create", create, admin)
    pool_id = made["id"]
    await fleet.node(pool_id, 2)
    at = {"tenantId": "acme", "poolId": pool_id}
    await api.ok(admin, "pools/offer", {**at, "toTenantId": "guest", "quota": {"gpu": 2}})
    owner_offer = {**at, "toTenantId": "acme", "quota": {"gpu": 6}, "priority": 3}
    await answered("pools/offer", owner_offer, admin)  # the owner's own offer resized
    updated = await answered("pools/update", {**at, "gpuModel": "L40S"}, token)
    assert (updated["offers"] is None) == (role == "operator")
    assert [q["resource"] for q in updated["quotas"]] == ["cpu", "gpu"]
    policy = {**at, "policy": {"kernelModules": ["vfio_pci"]}}
    await answered("pools/update", policy, token)
    if role == "admin":  # an operator may not archive
        archived = await answered("pools/archive", at, token)
        assert archived["archived"] is True


async def test_an_offers_answer_is_what_get_shows_the_offered_tenant(
    api: Api, fleet: Fleet
) -> None:
    """An offer answers the pool as the offered tenant sees it: a resize that adds no row
    answers from the rows it locked (offers.offer_pool, its writes carried by its event),
    one that adds rows reads them back; each answer is what that tenant's `get` shows
    right after, its quota rows in the database's order (mixed-case names, a row in use,
    a row the resize leaves alone, the offer's flags moved and kept)."""
    s = await Scene.start(api, fleet)
    guest = await s.guest("guest")
    pool = await s.pool()
    await fleet.node(pool["id"], 4)

    async def offered(quota: dict[str, int], **flags: Any) -> Json:
        answer = await s.offer(pool["id"], "guest", quota, **flags)
        assert answer == await s.get(pool["id"], guest, "guest"), (quota, flags)
        return answer

    await offered({"gpu": 3, "Zeta": 2, "cpu": 8, "a.b": 1, "A-b": 1})
    await s.reserve(pool["id"], {"gpu": 2}, guest, "guest")
    resized = await offered({"gpu": 1})  # never below what is in use
    assert quotas(resized)["gpu"] == (2, 2)
    resized = await offered({"cpu": 4, "Zeta": 5}, priority=7)  # flags moved
    assert [q["grant"]["priority"] for q in resized["quotas"]] == [7] * 5
    await offered({"cpu": 4}, priority=7, includeDescendants=True)  # nothing resized
    grown = await offered({"cpu": 6, "nvme": 2, "B": 1})  # rows added: read back
    assert len(grown["quotas"]) == 7


async def test_a_pool_created_with_no_owner_quota_has_none(api: Api, fleet: Fleet) -> None:
    """`ownerQuota: {}` (schemathesis found it answering 500 on SQLite: an executemany of
    no rows inserted one empty quota row): the pool is made with no quota rows, on both
    dialects, and its answer is what `get` shows."""
    await fleet.tenant("acme")
    site = await fleet.site("acme")
    admin = await fleet.caller("acme", "admin")
    create = {"tenantId": "acme", "siteId": site, "class": "metal-host", "ownerQuota": {}}
    pool: Json = (await api.ok(admin, "pools/create", create))["pool"]
    assert pool["quotas"] == []
    got = await api.ok(admin, "pools/get", {"tenantId": "acme", "poolId": pool["id"]})
    assert got["pool"] == pool
