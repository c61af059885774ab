"""Concurrent calls through the real HTTP app (CONTRACT section 5: "No interleaving of
concurrent calls may ever book past a quota or past capacity").

The calls share one event loop and go through the app's connection pool, so on PostgreSQL
they really interleave in the database; SQLite serialises writers, which the same tests
check too.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import httpx

from app.db.engine import Database
from tests.rest.scene import Scene, authz_tenants, events, offer_tenants, quota_rows, quotas
from tests.support import Api, Fleet, by_size

# (calls, limit) by dialect and size: SQLite runs one writer at a time, so a smaller race
# shows as much there. The full size runs in the `soak` set.
SIZES = {
    ("postgresql", "full"): (200, 50),
    ("sqlite", "full"): (60, 15),
    ("postgresql", "default"): (60, 15),
    ("sqlite", "default"): (30, 8),
}
# Rounds of racing offers, unoffers and bookings.
ROUNDS = {"full": 6, "default": 3}
BY_SIZE = by_size("size", "default", "full")


async def _book_one_each(s: Scene, pool_id: str, calls: int) -> list[httpx.Response]:
    body = {"tenantId": s.owner, "poolId": pool_id, "resources": {"gpu": 1}}
    return list(
        await asyncio.gather(
            *(s.api.post(s.token, "reservations/create", body) for _ in range(calls))
        )
    )


def _outcomes(responses: list[httpx.Response]) -> Counter[str]:
    return Counter("ok" if r.status_code == 200 else r.json()["error"]["code"] for r in responses)


async def _active_gpus(s: Scene, pool_id: str) -> int:
    body = {"tenantId": s.owner, "poolId": pool_id}
    listed = await s.api.ok(s.token, "reservations/list", body)
    return sum(r["resources"]["gpu"] for r in listed["reservations"] if r["state"] == "active")


@BY_SIZE
async def test_concurrent_bookings_never_pass_the_quota(
    api: Api, fleet: Fleet, dialect: str, size: str
) -> None:
    calls, limit = SIZES[dialect, size]
    s = await Scene.start(api, fleet)
    pool = await s.pool(ownerQuota={"gpu": limit})
    await fleet.node(pool["id"], 1000)

    responses = await _book_one_each(s, pool["id"], calls)
    assert _outcomes(responses) == {"ok": limit, "RESOURCE_EXHAUSTED": calls - limit}
    assert {r.json()["error"]["details"]["limit"] for r in responses if r.status_code != 200} == {
        "quota"
    }
    assert await _active_gpus(s, pool["id"]) == limit
    assert quotas(await s.get(pool["id"])) == {"gpu": (limit, limit)}
    assert (await s.capacity(pool["id"]))["gpu"]["booked"] == limit


@BY_SIZE
async def test_concurrent_bookings_never_pass_capacity(
    api: Api, fleet: Fleet, dialect: str, size: str
) -> None:
    calls, limit = SIZES[dialect, size]
    s = await Scene.start(api, fleet)
    pool = await s.pool()  # the default owner quota: 2,147,483,647 GPUs
    await fleet.node(pool["id"], limit)

    responses = await _book_one_each(s, pool["id"], calls)
    assert _outcomes(responses) == {"ok": limit, "RESOURCE_EXHAUSTED": calls - limit}
    refused = [r.json()["error"]["details"] for r in responses if r.status_code != 200]
    assert {(d["field"], d["limit"]) for d in refused} == {("resources.gpu", "capacity")}

    # Releases racing new bookings: whatever the order, nothing passes capacity and the
    # counters match the bookings that are left.
    held = [r.json()["reservation"]["id"] for r in responses if r.status_code == 200]
    releases = [s.release(rsv_id) for rsv_id in held[: limit // 2]]
    body = {"tenantId": s.owner, "poolId": pool["id"], "resources": {"gpu": 1}}
    bookings = [s.api.post(s.token, "reservations/create", body) for _ in range(limit)]
    results: list[Any] = await asyncio.gather(*releases, *bookings)
    assert _outcomes(results[len(releases) :]).keys() <= {"ok", "RESOURCE_EXHAUSTED"}

    active = await _active_gpus(s, pool["id"])
    gpu = (await s.capacity(pool["id"]))["gpu"]
    assert limit // 2 <= active <= limit
    assert (gpu["booked"], gpu["available"]) == (active, limit - active)
    assert quotas(await s.get(pool["id"]))["gpu"][1] == active


async def test_concurrent_creates_with_one_idempotency_key_make_one_pool(
    api: Api, fleet: Fleet, db: Database
) -> None:
    s = await Scene.start(api, fleet)
    body = {"tenantId": "acme", "siteId": s.site, "class": "metal-host", "idempotencyKey": "k"}
    responses = await asyncio.gather(*(api.post(s.token, "pools/create", body) for _ in range(30)))
    assert [r.status_code for r in responses] == [200] * 30, responses[0].text
    assert {r.json()["pool"]["id"] for r in responses} == {responses[0].json()["pool"]["id"]}
    listed = (await api.ok(s.token, "pools/list", {"tenantId": "acme"}))["pools"]
    assert len(listed) == 1
    assert [e.type for e in await events(db)] == ["pool.created"]


@BY_SIZE
async def test_concurrent_offers_unoffers_and_archive_keep_offers_and_authz_rows_together(
    api: Api, fleet: Fleet, db: Database, size: str
) -> None:
    """Every offer has its authz row and every authz row its offer, whatever the interleaving;
    an unoffered tenant's rows are dropped to use, and bookings racing both stay counted."""
    s = await Scene.start(api, fleet)
    guests = ["beta", "gamma", "delta", "eps", "zeta"]
    tokens = {g: await s.guest(g, role="operator") for g in guests}
    pool = await s.pool()
    pool_id = pool["id"]
    await fleet.node(pool_id, 20)
    rng = random.Random(7)
    made: Counter[str] = Counter()

    async def offer(tenant: str, after_archive: bool = False) -> str:
        quota = {"gpu": rng.randint(0, 4)}
        body = s.body(pool_id, toTenantId=tenant, quota=quota)
        response = await api.post(
            s.token, "pools/offer", body | {"includeDescendants": rng.random() < 0.3}
        )
        if response.status_code == 200:
            return "offered"
        # Only an offer that lost the race to the archive may fail.
        assert after_archive and response.json()["error"]["code"] == "INVALID_STATE", response.text
        return "refused"

    async def unoffer(tenant: str) -> str:
        return "unoffered" if await s.unoffer(pool_id, tenant) else "noop"

    async def book(tenant: str) -> str:
        body = {"tenantId": tenant, "poolId": pool_id, "resources": {"gpu": 1}}
        response = await api.post(tokens[tenant], "reservations/create", body)
        if response.status_code == 200:
            return "booked"
        code: str = response.json()["error"]["code"]
        assert code in ("NOT_FOUND", "RESOURCE_EXHAUSTED"), response.text
        return code

    async def active(tenant: str) -> int:
        listed = await api.ok(tokens[tenant], "reservations/list", {"tenantId": tenant})
        return sum(r["resources"]["gpu"] for r in listed["reservations"] if r["state"] == "active")

    async def check_guest(g: str, offered: set[str]) -> None:
        rows = await quota_rows(db, pool_id, g)
        assert rows["gpu"][1] == await active(g), g
        assert rows["gpu"][0] >= rows["gpu"][1], g
        if g not in offered:
            assert rows["gpu"][0] == rows["gpu"][1], g
        body = {"tenantId": g, "poolId": pool_id}
        status = (await api.post(tokens[g], "pools/get", body)).status_code
        assert status == (200 if g in offered else 404), g

    async def check() -> None:
        offered = await offer_tenants(db, pool_id)
        assert offered == await authz_tenants(db, pool_id)
        await asyncio.gather(*(check_guest(g, offered) for g in guests))

    # Which call of a round lands first is the scheduler's: on a busy machine every booking
    # of a few rounds may come before its offer or after its unoffer. Race on until one
    # has landed (at most 10 times as many rounds), so the bookings did race the offers.
    for round_ in range(10 * ROUNDS[size]):
        if round_ >= ROUNDS[size] and made["booked"]:
            break
        calls = [c for g in guests for c in (offer(g), unoffer(g), book(g))]
        rng.shuffle(calls)
        made.update(await asyncio.gather(*calls))
        await check()

    async def archive() -> str:
        await s.archive(pool_id)
        return "archived"

    final = [offer(g, after_archive=True) for g in guests] + [unoffer(g) for g in guests]
    final.append(archive())
    rng.shuffle(final)
    made.update(await asyncio.gather(*final))

    assert await offer_tenants(db, pool_id) == await authz_tenants(db, pool_id) == {"acme"}
    assert (await s.get(pool_id))["archived"] is True
    written = Counter(e.type for e in await events(db, pool_id))
    assert written["pool.offered"] == made["offered"]
    assert written["pool.unoffered"] == made["unoffered"]
    assert written["pool.archived"] == made["archived"] == 1
    assert made["booked"] > 0, made  # the bookings did race the offers
    gpu = (await s.capacity(pool_id))["gpu"]
    assert gpu["booked"] == made["booked"] == sum([await active(g) for g in guests])
