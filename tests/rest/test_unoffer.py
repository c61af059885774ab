"""pools/unoffer: each rule sentence of the seed's `unoffer` section, and CONTRACT section 5."""

from __future__ import annotations

from app.db.engine import Database
from tests.rest.scene import Scene, authz_tenants, events, offers, quota_rows
from tests.support import Api, Fleet


async def test_unoffer_withdraws_the_offer_and_says_so(api: Api, fleet: Fleet) -> None:
    """Withdraws a pool's offer from a tenant and returns whether an offer was removed."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    await s.guest("gamma")
    pool = await s.pool()
    await s.offer(pool["id"], "beta", {"gpu": 2})
    await s.offer(pool["id"], "gamma", {"gpu": 2})

    answer = await api.ok(s.token, "pools/unoffer", s.body(pool["id"], toTenantId="beta"))
    assert answer == {"removed": True}
    assert sorted(offers(await s.get(pool["id"]))) == ["acme", "gamma"]


async def test_rows_drop_to_use_live_reservations_stay_and_the_authz_row_goes(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """That tenant's quota rows on the pool drop to what is in use, so live reservations keep
    their bookings while nothing new fits, and its authz row for the pool is removed."""
    s = await Scene.start(api, fleet)
    beta = await s.guest("beta")
    pool = await s.pool()
    await fleet.node(pool["id"], 8)
    await s.offer(pool["id"], "beta", {"gpu": 5, "nvme": 3})
    live = await s.reserve(pool["id"], {"gpu": 2}, beta, "beta")

    assert await s.unoffer(pool["id"], "beta")
    assert await quota_rows(db, pool["id"], "beta") == {"gpu": (2, 2), "nvme": (0, 0)}
    assert await authz_tenants(db, pool["id"]) == {"acme"}
    # The tenant no longer sees the pool at all.
    for method in ("get", "capacity"):
        status, error = await api.fails(
            beta, f"pools/{method}", {"tenantId": "beta", "poolId": pool["id"]}
        )
        assert (status, error["code"]) == (404, "NOT_FOUND")
    assert (await api.ok(beta, "pools/list", {"tenantId": "beta"}))["pools"] == []
    # Its booking is live and still counted against the pool.
    held = await api.ok(beta, "reservations/list", {"tenantId": "beta"})
    assert held["reservations"] == [live]
    assert (await s.capacity(pool["id"]))["gpu"]["booked"] == 2

    # Nothing new fits: re-offered without naming gpu, the dropped row keeps its value.
    await s.offer(pool["id"], "beta", {"nvme": 1})
    status, error = await api.fails(
        beta,
        "reservations/create",
        {"tenantId": "beta", "poolId": pool["id"], "resources": {"gpu": 1}},
    )
    assert (status, error["code"]) == (429, "RESOURCE_EXHAUSTED")


async def test_the_owner_cannot_be_unoffered(api: Api, fleet: Fleet, db: Database) -> None:
    """A pool cannot be unoffered from its owner (INVALID_INPUT)."""
    s = await Scene.start(api, fleet)
    pool = await s.pool()
    status, error = await api.fails(s.token, "pools/unoffer", s.body(pool["id"], toTenantId="acme"))
    assert (status, error["code"], error["details"]["field"]) == (
        400,
        "INVALID_INPUT",
        "toTenantId",
    )
    assert list(offers(await s.get(pool["id"]))) == ["acme"]
    assert await authz_tenants(db, pool["id"]) == {"acme"}


async def test_calling_it_again_answers_removed_false_and_emits_nothing(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """Calling it again answers removed: false. Emits pool.unoffered only when an offer was
    removed."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    await s.guest("never")
    pool = await s.pool()
    await s.offer(pool["id"], "beta", {"gpu": 2})

    assert await s.unoffer(pool["id"], "beta") is True
    assert await s.unoffer(pool["id"], "beta") is False
    assert await s.unoffer(pool["id"], "never") is False
    unoffered = [e for e in await events(db, pool["id"]) if e.type == "pool.unoffered"]
    assert [e.data["toTenantId"] for e in unoffered] == ["beta"]


async def test_after_an_archive_there_is_nothing_left_to_remove(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """CONTRACT 5: after an archive there is nothing left to remove ({"removed": false})."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    pool = await s.pool()
    await s.offer(pool["id"], "beta", {"gpu": 2})
    await s.archive(pool["id"])
    before = len(await events(db))
    assert await s.unoffer(pool["id"], "beta") is False
    assert len(await events(db)) == before
