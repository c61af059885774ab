"""An update reads the pool's offers, an unoffer the offer it withdraws, in the statement
that locks the pool (access.lock_owned_pool_with). PostgreSQL re-reads only the locked row
once the lock is granted, so offers committed while the write waited would be missing
from that read: the write sees the pool's version move and reads them again. PostgreSQL
only (SQLite runs one writer at a time)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from app.db.engine import Database
from tests.rest.scene import Scene, events
from tests.rest.test_archive_races import DEADLINE_S, _start, _until_waiting
from tests.support import Api, Fleet

pytestmark = pytest.mark.parametrize("dialect", ["postgresql"])  # interleaving writers

_MOVE_VERSION = "UPDATE pools SET version = version + 1 WHERE id = :id"


async def _written_while_waiting(
    s: Scene, db: Database, pool_id: str, method: str, body: dict[str, Any], *writes: str
) -> httpx.Response:
    """`method` called while another writer holds the pool, as a pool write does; that
    writer then runs `writes` (bound: `id`, the pool) and commits, granting the lock."""
    async with db.writer.connect() as holder:
        await holder.execute(
            text("SELECT id FROM pools WHERE id = :id FOR NO KEY UPDATE"), {"id": pool_id}
        )
        call = _start(s.api.post(s.token, f"pools/{method}", body))
        await _until_waiting(db, 1, call)
        for write in writes:
            await holder.execute(text(write), {"id": pool_id})
        await holder.commit()
    answered = await asyncio.wait_for(call, DEADLINE_S)
    assert answered.status_code == 200, answered.text
    return answered


async def test_update_offers_read_with_the_lock_are_never_stale(
    api: Api, fleet: Fleet, db: Database
) -> None:
    s = await Scene.start(api, fleet)
    await s.guest("early")
    await s.guest("late")
    pool_id = str((await s.pool())["id"])
    await s.offer(pool_id, "early", {"gpu": 1})
    # The other writer offers the pool to one more tenant, as offers.offer_pool writes
    # one: the offer, its quota row, the pool's version.
    answered = await _written_while_waiting(
        s,
        db,
        pool_id,
        "update",
        s.body(pool_id, gpuModel="L40S"),
        "INSERT INTO offers (pool_id, tenant_id, include_descendants, priority, created_at)"
        " VALUES (:id, 'late', false, 0, now())",
        "INSERT INTO quota_rows (pool_id, tenant_id, resource, max, used)"
        " VALUES (:id, 'late', 'gpu', 2, 0)",
        _MOVE_VERSION,
    )
    offers = {o["tenantId"]: o for o in answered.json()["pool"]["offers"]}
    assert set(offers) == {s.owner, "early", "late"}
    assert offers["late"]["quotas"] == [{"resource": "gpu", "max": 2, "used": 0}]
    assert answered.json()["pool"] == await s.get(pool_id)


async def test_an_unoffer_that_waited_reads_the_offer_again(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """An unoffer reads the offer with its lock as well: withdrawn by another writer while
    it waited, the offer is gone, and the unoffer answers `removed: false`, writing and
    emitting nothing."""
    s = await Scene.start(api, fleet)
    await s.guest("guest")
    pool_id = str((await s.pool())["id"])
    await s.offer(pool_id, "guest", {"gpu": 1})
    version = (await s.get(pool_id))["version"]
    emitted = len(await events(db, pool_id))
    # The other writer withdraws the offer, as offers.withdraw_offer does, and moves the
    # pool's version.
    answered = await _written_while_waiting(
        s,
        db,
        pool_id,
        "unoffer",
        s.body(pool_id, toTenantId="guest"),
        "DELETE FROM offers WHERE pool_id = :id AND tenant_id = 'guest'",
        _MOVE_VERSION,
    )
    assert answered.json() == {"removed": False}
    assert (await s.get(pool_id))["version"] == version + 1  # no second move
    assert len(await events(db, pool_id)) == emitted
