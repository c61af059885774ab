"""`pools/capacity`: one test per rule sentence of the seed's capacity section."""

from __future__ import annotations

from typing import Any

import pytest

from tests.rest.pool_calls import (
    CAPACITY_KEYS,
    HIDDEN_BY,
    MISSING_POOL,
    create_pool,
    hide_from_guest,
    offer,
)
from tests.support import Api, Fleet

LENDER_KEYS = {"offered", "guestUsed", "overcommit"}
CAPACITY_QUERY = """
query ($tenantId: String!, $poolId: ID!) {
  capacity(tenantId: $tenantId, poolId: $poolId) { resource total allocatable booked available }
}
"""


async def _capacity(api: Api, token: str, tenant: str, pool_id: str) -> list[dict[str, Any]]:
    body = {"tenantId": tenant, "poolId": pool_id}
    answer = await api.ok(token, "pools/capacity", body)
    assert set(answer) == {"capacity"}  # CONTRACT 4: {"capacity": [CapacityRow, ...]}
    rows: list[dict[str, Any]] = answer["capacity"]
    for row in rows:
        # The owner's sharer also reads the lender's columns (tests/rest/test_lending.py).
        assert set(row) in (CAPACITY_KEYS, CAPACITY_KEYS | LENDER_KEYS)
    return [{k: v for k, v in row.items() if k in CAPACITY_KEYS} for row in rows]


def _row(resource: str, total: int, booked: int = 0) -> dict[str, Any]:
    return {
        "resource": resource,
        "total": total,
        "allocatable": total,
        "booked": booked,
        "available": total - booked,
    }


@pytest.mark.parametrize(
    ("sharing", "policy", "rows"),
    [
        ("exclusive", {}, [_row("gpu", 6, booked=2)]),
        (
            "mig",
            {"migLayout": ["3g.40gb", "2g.20gb", "1g.10gb"]},
            [_row("gpu", 6, 2), _row("gpu.mig", 18)],
        ),
        ("timeslice", {"sharing": {"replicas": 4}}, [_row("gpu", 6, 2), _row("gpu.slot", 24)]),
        ("mps", {"sharing": {"replicas": 2}}, [_row("gpu", 6, 2), _row("gpu.slot", 12)]),
    ],
)
async def test_capacity_returns_one_rollup_row_per_resource(
    api: Api, fleet: Fleet, sharing: str, policy: dict[str, Any], rows: list[dict[str, Any]]
) -> None:
    """Returns one pool's rollup rows, one per resource; the same answer as
    capacity.byPool."""
    await fleet.tenant("acme")
    site, token = await fleet.site("acme"), await fleet.caller("acme")
    pool = await create_pool(api, token, "acme", site, sharing=sharing, policy=policy)
    other = await create_pool(api, token, "acme", site, sharing=sharing, policy=policy)
    for gpus in (2, 4):
        await fleet.node(pool["id"], gpus)
    await fleet.node(other["id"], 1)  # another pool's nodes stay out of this rollup
    body = {"tenantId": "acme", "poolId": pool["id"], "resources": {"gpu": 2}}
    await api.ok(token, "reservations/create", body)

    rest = await _capacity(api, token, "acme", pool["id"])
    assert rest == rows
    graphql = await api.graphql(token, CAPACITY_QUERY, {"tenantId": "acme", "poolId": pool["id"]})
    assert graphql["data"] == {"capacity": rest} and "errors" not in graphql


async def test_an_offered_tenant_sees_the_same_rollup_as_the_owner(api: Api, fleet: Fleet) -> None:
    """Returns one pool's rollup rows: the pool's, whichever tenant asks."""
    await fleet.tenant("acme")
    await fleet.tenant("beta")
    site, acme, beta = (
        await fleet.site("acme"),
        await fleet.caller("acme"),
        await fleet.caller("beta"),
    )
    pool = await create_pool(api, acme, "acme", site)
    await fleet.node(pool["id"], 8)
    await offer(api, acme, "acme", pool["id"], "beta", {"gpu": 1})
    assert await _capacity(api, beta, "beta", pool["id"]) == [_row("gpu", 8)]
    assert await _capacity(api, acme, "acme", pool["id"]) == [_row("gpu", 8)]


@pytest.mark.parametrize("hidden_by", HIDDEN_BY)
async def test_capacity_is_not_found_when_the_pool_is_not_visible(
    api: Api, fleet: Fleet, hidden_by: str
) -> None:
    """The call is NOT_FOUND when the pool is not visible to the tenant."""
    await fleet.tenant("acme")
    await fleet.tenant("beta")
    site, acme, beta = (
        await fleet.site("acme"),
        await fleet.caller("acme"),
        await fleet.caller("beta"),
    )
    created = (await create_pool(api, acme, "acme", site))["id"]
    await fleet.node(created, 2)
    pool_id = await hide_from_guest(
        api,
        acme,
        "acme",
        created,
        "beta",
        hidden_by,
        lambda: _capacity(api, beta, "beta", created),
    )

    response = await api.post(beta, "pools/capacity", {"tenantId": "beta", "poolId": pool_id})
    missing = await api.post(beta, "pools/capacity", {"tenantId": "beta", "poolId": MISSING_POOL})
    assert response.status_code == 404
    assert response.text.replace(pool_id, MISSING_POOL) == missing.text
    if hidden_by == "archived":  # the owner still sees an archived pool's rollup
        assert await _capacity(api, acme, "acme", pool_id) == [_row("gpu", 2)]
