"""Bookings and releases racing each other (on PostgreSQL, the one-statement paths of
app/capacity/booking.py and booking_release.py): an idempotent create books once, a
release gives back once, and a booking that cannot fit is refused without waiting for
the row locks of the bookings in flight."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy import text

from app.db.engine import Database
from tests.rest.scene import Scene, quota_rows
from tests.support import Api, Fleet

DEADLINE_S = 30.0


async def _booked_pool(s: Scene, guest_quota: int) -> tuple[str, str]:
    """A pool with 8 GPUs offered to `beta` with `guest_quota`; beta's token."""
    beta = await s.guest("beta", role="operator")
    pool_id = str((await s.pool())["id"])
    await s.fleet.node(pool_id, 8)
    await s.offer(pool_id, "beta", {"gpu": guest_quota})
    return pool_id, beta


async def test_concurrent_creates_with_one_key_book_once(
    api: Api, fleet: Fleet, db: Database
) -> None:
    s = await Scene.start(api, fleet)
    pool_id, beta = await _booked_pool(s, 6)
    body = {"tenantId": "beta", "poolId": pool_id, "resources": {"gpu": 2}, "idempotencyKey": "k"}
    responses = await asyncio.gather(
        *(api.post(beta, "reservations/create", body) for _ in range(12))
    )
    assert [r.status_code for r in responses] == [200] * 12, responses[0].text
    assert len({r.content for r in responses}) == 1, {r.content for r in responses}
    assert await quota_rows(db, pool_id, "beta") == {"gpu": (6, 2)}
    assert (await s.capacity(pool_id))["gpu"]["booked"] == 2
    listed = await api.ok(beta, "reservations/list", {"tenantId": "beta"})
    assert len(listed["reservations"]) == 1


async def test_concurrent_releases_give_back_once(api: Api, fleet: Fleet, db: Database) -> None:
    s = await Scene.start(api, fleet)
    pool_id, beta = await _booked_pool(s, 6)
    kept = await s.reserve(pool_id, {"gpu": 1}, beta, "beta")
    ended = await s.reserve(pool_id, {"gpu": 3}, beta, "beta")
    body = {"tenantId": "beta", "reservationId": ended["id"]}
    responses = await asyncio.gather(
        *(api.post(beta, "reservations/release", body) for _ in range(12))
    )
    assert [r.status_code for r in responses] == [200] * 12, responses[0].text
    # The same answer to each: the reservation as the first release ended it.
    assert len({r.content for r in responses}) == 1, {r.content for r in responses}
    assert responses[0].json()["reservation"]["state"] == "ended"
    assert await quota_rows(db, pool_id, "beta") == {"gpu": (6, 1)}
    assert (await s.capacity(pool_id))["gpu"]["booked"] == 1
    assert (await s.release(kept["id"], beta, "beta"))["state"] == "ended"
    assert (await s.capacity(pool_id))["gpu"]["booked"] == 0


@pytest.mark.parametrize("dialect", ["postgresql"])  # row locks
async def test_a_booking_that_cannot_fit_does_not_wait_for_row_locks(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """The headroom pre-check: with the capacity spent and the rows held by a transaction
    in flight, a booking whose quota row has room is refused at once; without the check
    it would queue for its quota row's lock before it finds the capacity full."""
    s = await Scene.start(api, fleet)
    pool_id, beta = await _booked_pool(s, 2)
    await s.reserve(pool_id, {"gpu": 8})  # the owner's, from its own quota row
    body = {"tenantId": "beta", "poolId": pool_id, "resources": {"gpu": 1}}
    async with db.writer.connect() as holder:
        await holder.execute(
            text("SELECT 1 FROM quota_rows WHERE pool_id = :pool FOR UPDATE"),
            {"pool": pool_id},
        )
        await holder.execute(
            text("SELECT 1 FROM capacity_rows WHERE pool_id = :pool FOR UPDATE"),
            {"pool": pool_id},
        )
        booking = asyncio.create_task(api.post(beta, "reservations/create", body))
        deadline = time.monotonic() + DEADLINE_S
        async with db.reader.connect() as watcher:
            while not booking.done():
                waiting = (
                    await watcher.execute(
                        text(
                            "SELECT count(*) FROM pg_stat_activity WHERE datname ="
                            " current_database() AND wait_event_type = 'Lock'"
                        )
                    )
                ).scalar_one()
                await watcher.rollback()  # a fresh snapshot of pg_stat_activity
                assert waiting == 0, "the refused booking waited for a row lock"
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
        refused = await booking
        await holder.rollback()
    assert refused.status_code == 429, refused.text
    details = refused.json()["error"]["details"]
    assert (details["field"], details["limit"]) == ("resources.gpu", "capacity"), details
