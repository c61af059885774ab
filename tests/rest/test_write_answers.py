"""A pool write answers the pool as a `get` right after it shows it to the same caller:
the owner's answer is built from the row the write holds (pool_reads.owned_pool_detail),
its offers and quota rows read with the write (issue 20), not read back as a `get` does.
For an admin (offers shown) and an operator (no compute:pools:share: offers withheld)."""

from __future__ import annotations

from typing import Any

import pytest

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
