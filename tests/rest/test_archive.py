"""pools/archive: each rule sentence of the seed's `archive` section, and CONTRACT section 5."""

from __future__ import annotations

from app.db.engine import Database
from tests.rest.scene import Scene, authz_tenants, events, offers, quota_rows
from tests.support import Api, Fleet


async def _shared_pool(s: Scene) -> tuple[dict[str, object], str]:
    """A pool with 8 GPUs offered to beta and gamma; beta holds a 2-GPU booking.
    Returns (pool, the booking's id)."""
    beta = await s.guest("beta")
    await s.guest("gamma")
    pool = await s.pool()
    pool_id = str(pool["id"])
    await s.fleet.node(pool_id, 8)
    await s.offer(pool_id, "beta", {"gpu": 4})
    await s.offer(pool_id, "gamma", {"gpu": 4})
    booking = await s.reserve(pool_id, {"gpu": 2}, beta, "beta")
    return pool, booking["id"]


async def test_archive_removes_every_offer_and_stops_new_work(api: Api, fleet: Fleet) -> None:
    """Retires a pool the tenant owns: it removes every offer and stops new work, while live
    reservations keep their bookings until they end."""
    s = await Scene.start(api, fleet)
    pool, booking = await _shared_pool(s)
    pool_id = str(pool["id"])

    archived = await s.archive(pool_id)
    assert list(offers(archived)) == ["acme"]
    assert (archived["archived"], archived["version"]) == (True, 4)  # 2 offers before
    # No new work, not even for the owner (CONTRACT 5: INVALID_STATE).
    status, error = await api.fails(
        s.token,
        "reservations/create",
        {"tenantId": "acme", "poolId": pool_id, "resources": {"gpu": 1}},
    )
    assert (status, error["code"]) == (409, "INVALID_STATE")
    # The live booking stays until it ends.
    assert (await s.capacity(pool_id))["gpu"]["booked"] == 2
    beta = await fleet.caller("beta", "operator")
    ended = await s.release(booking, beta, "beta")
    assert ended["state"] == "ended"
    assert (await s.capacity(pool_id))["gpu"]["booked"] == 0


async def test_offered_rows_drop_to_use_and_authz_rows_go(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """Each offered tenant's quota rows drop to what is in use and its authz row for the pool
    is removed."""
    s = await Scene.start(api, fleet)
    pool, _ = await _shared_pool(s)
    pool_id = str(pool["id"])
    await s.archive(pool_id)
    assert await quota_rows(db, pool_id, "beta") == {"gpu": (2, 2)}
    assert await quota_rows(db, pool_id, "gamma") == {"gpu": (0, 0)}
    assert await quota_rows(db, pool_id, "acme") == {"gpu": (2_147_483_647, 0)}
    assert await authz_tenants(db, pool_id) == {"acme"}


async def test_only_the_owner_sees_an_archived_pool(api: Api, fleet: Fleet) -> None:
    """After archiving, only the owner sees the pool, with archived: true."""
    s = await Scene.start(api, fleet)
    pool, _ = await _shared_pool(s)
    pool_id = str(pool["id"])
    await s.archive(pool_id)

    assert (await s.get(pool_id))["archived"] is True
    listed = (await api.ok(s.token, "pools/list", {"tenantId": "acme"}))["pools"]
    assert [(p["id"], p["archived"]) for p in listed] == [(pool_id, True)]
    for tenant in ("beta", "gamma"):
        token = await fleet.caller(tenant, "viewer")
        status, error = await api.fails(token, "pools/get", {"tenantId": tenant, "poolId": pool_id})
        assert (status, error["code"]) == (404, "NOT_FOUND")
        assert (await api.ok(token, "pools/list", {"tenantId": tenant}))["pools"] == []


async def test_archiving_again_returns_the_pool_unchanged(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """Archiving an archived pool returns it unchanged."""
    s = await Scene.start(api, fleet)
    pool, _ = await _shared_pool(s)
    first = await s.archive(str(pool["id"]))
    written = len(await events(db))
    again = await s.archive(str(pool["id"]))
    assert again == first
    assert len(await events(db)) == written  # CONTRACT 5: no event


async def test_archive_emits_the_tenants_whose_offers_were_removed(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """Emits pool.archived with the list of tenants whose offers were removed."""
    s = await Scene.start(api, fleet)
    pool, _ = await _shared_pool(s)
    lone = await s.pool()
    await s.archive(str(pool["id"]))
    await s.archive(lone["id"])
    archived = [e for e in await events(db) if e.type == "pool.archived"]
    assert [(e.pool_id, e.data["removedTenantIds"]) for e in archived] == [
        (pool["id"], ["beta", "gamma"]),
        (lone["id"], []),
    ]
