"""Every size the domain accepts has a bound (app/capacity/bounds.py).

A quota map holds at most MAX_RESOURCES resources; a tenant holds at most MAX_RESOURCES
quota rows on one pool across successive offers (rows not named keep their value); a pool
holds at most MAX_OFFERS_PER_POOL offers, its owner's included.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.capacity import offers as offers_module
from app.capacity.bounds import MAX_OFFERS_PER_POOL, MAX_RESOURCES
from app.db.engine import Database
from tests.rest.pool_calls import MISSING_POOL, MISSING_SITE, row_counts
from tests.rest.scene import Scene, events, offers, quota_rows
from tests.support import Api, Fleet


def _resources(count: int, prefix: str = "r") -> dict[str, int]:
    return {f"{prefix}{i:05d}": 1 for i in range(count)}


@pytest.mark.parametrize(
    ("path", "field", "body"),
    [
        ("pools/create", "ownerQuota", {"siteId": MISSING_SITE, "class": "metal-host"}),
        ("pools/offer", "quota", {"poolId": MISSING_POOL, "toTenantId": "nobody"}),
        ("reservations/create", "resources", {"poolId": MISSING_POOL}),
    ],
    ids=["ownerQuota", "offer-quota", "reservation-resources"],
)
# 10,000 keys (about 150 KB) is the largest map the request body limit (1 MiB) lets reach
# validation; the 100,000 keys is refused before that, with 413.
@pytest.mark.parametrize("size", [MAX_RESOURCES + 1, 10_000])
async def test_a_map_of_too_many_resources_is_invalid_input_before_any_lookup(
    api: Api, fleet: Fleet, db: Database, path: str, field: str, body: dict[str, Any], size: int
) -> None:
    """More than MAX_RESOURCES keys is INVALID_INPUT naming the map, and input validation
    comes before any existence check (CONTRACT 2's order): the site or pool is missing here."""
    s = await Scene.start(api, fleet)
    before = await row_counts(db)
    request = {"tenantId": s.owner, **body, field: _resources(size)}
    status, error = await api.fails(s.token, path, request)
    assert (status, error["code"], error["details"]) == (400, "INVALID_INPUT", {"field": field})
    assert await row_counts(db) == before


async def test_a_map_of_max_resources_is_accepted(api: Api, fleet: Fleet) -> None:
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    pool = await s.pool(ownerQuota=_resources(MAX_RESOURCES, "own"))
    seen = await s.offer(pool["id"], "beta", _resources(MAX_RESOURCES))
    assert len(seen["quotas"]) == MAX_RESOURCES
    assert len(offers(await s.get(pool["id"]))["acme"]["quotas"]) == MAX_RESOURCES


async def test_the_openapi_document_states_the_bound(api: Api) -> None:
    document = (await api.client.get("/api/openapi.json")).json()
    schemas = document["components"]["schemas"]
    found = {
        (name, prop): schema["maxProperties"]
        for name, model in schemas.items()
        for prop, schema in model.get("properties", {}).items()
        if prop in ("ownerQuota", "quota", "resources")
        for schema in (schema, *schema.get("anyOf", ()))
        if "maxProperties" in schema
    }
    assert sorted(prop for _, prop in found) == ["ownerQuota", "quota", "resources"], found
    assert set(found.values()) == {MAX_RESOURCES}


async def test_successive_offers_cannot_pile_up_more_rows_than_one_map(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """Rows not named keep their value, so offers of disjoint maps would add up: an offer
    that would leave the tenant more than MAX_RESOURCES rows on the pool is
    RESOURCE_EXHAUSTED (details.limit quotaRowsPerTenant) and writes nothing."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    pool_id = str((await s.pool())["id"])
    await s.offer(pool_id, "beta", _resources(MAX_RESOURCES - 1, "a"), priority=5)
    before = (await row_counts(db), await quota_rows(db, pool_id, "beta"), await events(db))

    body = s.body(pool_id, toTenantId="beta", quota=_resources(2, "b"), priority=9)
    status, error = await api.fails(s.token, "pools/offer", body)
    assert (status, error["code"]) == (429, "RESOURCE_EXHAUSTED")
    assert error["details"] == {
        "field": "quota",
        "limit": "quotaRowsPerTenant",
        "max": MAX_RESOURCES,
    }
    after = (await row_counts(db), await quota_rows(db, pool_id, "beta"), await events(db))
    assert after == before
    assert offers(await s.get(pool_id))["beta"]["priority"] == 5

    # Up to the bound, and resizing rows it already holds, is fine.
    assert len((await s.offer(pool_id, "beta", _resources(1, "b")))["quotas"]) == MAX_RESOURCES
    assert len((await s.offer(pool_id, "beta", _resources(3, "a")))["quotas"]) == MAX_RESOURCES
    # Rows outlive an unoffer (they drop to use), so a new offer counts them too.
    await s.unoffer(pool_id, "beta")
    _, error = await api.fails(s.token, "pools/offer", body)
    assert error["details"]["limit"] == "quotaRowsPerTenant"


async def _offers_up_to(api: Api, fleet: Fleet, db: Database, bound: int) -> None:
    """A new offer past the bound (the owner's own offer included) is RESOURCE_EXHAUSTED
    (details.limit offersPerPool) and writes nothing, whether or not toTenantId exists;
    offers already held can still be resized, and an unoffer makes room."""
    s = await Scene.start(api, fleet)
    pool_id = str((await s.pool())["id"])
    guests = [f"guest{i:03d}" for i in range(bound)]
    for guest in guests:
        await fleet.tenant(guest)
    for guest in guests[:-2]:
        await s.offer(pool_id, guest, {"gpu": 1})
    assert len(offers(await s.get(pool_id))) == bound - 1
    await s.offer(pool_id, guests[-2], {"gpu": 1})  # the last one that fits
    before = (await row_counts(db), await events(db))

    answers = []
    for target in (guests[-1], "nobody"):
        body = s.body(pool_id, toTenantId=target, quota={"gpu": 1})
        status, error = await api.fails(s.token, "pools/offer", body)
        assert (status, error["code"]) == (429, "RESOURCE_EXHAUSTED")
        answers.append(error)
    assert answers[0] == answers[1]
    assert answers[0]["details"] == {"field": "toTenantId", "limit": "offersPerPool", "max": bound}
    assert (await row_counts(db), await events(db)) == before

    await s.offer(pool_id, guests[0], {"gpu": 2})  # a resize is no new offer
    await s.unoffer(pool_id, guests[0])
    await s.offer(pool_id, guests[-1], {"gpu": 1})


async def test_a_pool_holds_at_most_max_offers(
    api: Api, fleet: Fleet, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule at a small bound, so the default run stays fast; the soak test below runs
    it at MAX_OFFERS_PER_POOL itself."""
    monkeypatch.setattr(offers_module, "MAX_OFFERS_PER_POOL", 5)
    await _offers_up_to(api, fleet, db, 5)


@pytest.mark.soak
async def test_a_pool_holds_at_most_max_offers_at_full_size(
    api: Api, fleet: Fleet, db: Database
) -> None:
    await _offers_up_to(api, fleet, db, MAX_OFFERS_PER_POOL)
