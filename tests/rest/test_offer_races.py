"""An offer reads what it checks (the target's offer, the pool's offers, tenant-owned
nodes, the target tenant) and locks the target's quota rows in the statement that locks
the pool, after the pool's lock (access.locking_first). That statement's snapshot
is older than the lock when it waited: the quota rows it locks are re-read at their
newest version, and anything else is read again when the pool's row has a newer version
than the snapshot's. PostgreSQL only (SQLite runs one writer at a time).

Each test stops the offer at a known point with a lock held on another connection (or by
a real unit of work), and watches pg_stat_activity to know the offer waits."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from app.capacity.nodes import join_node
from app.db.engine import Database
from app.db.uow import UnitOfWork
from tests.rest.scene import Scene, events, offers, quotas
from tests.rest.test_archive_races import DEADLINE_S, _start, _until_waiting
from tests.support import Api, Fleet

pytestmark = pytest.mark.parametrize("dialect", ["postgresql"])  # interleaving writers

CHANGE_FROM_2_TO_5 = {"path": "/offers/beta/quota/gpu", "before": 2, "after": 5}


async def test_an_offer_behind_a_tenant_owned_nodes_join_is_refused(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """The node's join locks the pool and commits while the offer waits for it: its node
    is not in the offer's snapshot, but the row it wrote is newer, so the offer reads
    again and refuses (a pool holding tenant-owned nodes is offered only to its owner)."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    pool_id = str((await s.pool())["id"])
    await fleet.node(pool_id, 2)
    async with UnitOfWork(db) as uow:
        await join_node(uow, pool_id, 4, s.owner)
        body = s.body(pool_id, toTenantId="beta", quota={"gpu": 1})
        offer = _start(s.api.post(s.token, "pools/offer", body))
        await _until_waiting(db, 1, offer)
    refused = await asyncio.wait_for(offer, DEADLINE_S)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "INVALID_STATE"
    assert refused.json()["error"]["details"]["field"] == "toTenantId"
    assert list(offers(await s.get(pool_id))) == [s.owner]


async def test_an_offer_that_waited_for_the_pool_reads_an_offer_made_meanwhile(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """Another writer offers the pool to the same tenant while the offer waits for the
    pool: read again, the offer is a resize of that one (not a second insert)."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    pool_id = str((await s.pool())["id"])
    async with db.writer.connect() as holder:
        await holder.execute(
            text("SELECT id FROM pools WHERE id = :id FOR NO KEY UPDATE"), {"id": pool_id}
        )
        body = s.body(pool_id, toTenantId="beta", quota={"gpu": 5})
        offer = _start(s.api.post(s.token, "pools/offer", body))
        await _until_waiting(db, 1, offer)
        # As offers.offer_pool writes one: the offer, its quota row, the pool's version.
        for write in (
            "INSERT INTO offers (pool_id, tenant_id, include_descendants, priority, created_at)"
            " VALUES (:id, 'beta', false, 0, now())",
            "INSERT INTO quota_rows (pool_id, tenant_id, resource, max, used)"
            " VALUES (:id, 'beta', 'gpu', 2, 1)",
            "UPDATE pools SET version = version + 1 WHERE id = :id",
        ):
            await holder.execute(text(write), {"id": pool_id})
        await holder.commit()
    answered = await asyncio.wait_for(offer, DEADLINE_S)
    assert answered.status_code == 200, answered.text
    assert quotas(answered.json()["pool"]) == {"gpu": (5, 1)}
    # Its event: a change of the quota from 2 to 5, not a new offer.
    (offered,) = [e for e in await events(db, pool_id) if e.type == "pool.offered"]
    assert offered.data["changes"] == [CHANGE_FROM_2_TO_5], offered.data


async def test_an_offer_locks_the_quota_rows_at_their_newest_version(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """A booking's quota-row update commits while the offer waits for that row: the offer
    resizes from the row as the booking left it (`used` 3), never below what is in use."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    pool_id = str((await s.pool())["id"])
    await s.offer(pool_id, "beta", {"gpu": 4})
    async with db.writer.connect() as holder:
        await holder.execute(
            text("UPDATE quota_rows SET used = 3 WHERE pool_id = :id AND tenant_id = 'beta'"),
            {"id": pool_id},
        )
        body = s.body(pool_id, toTenantId="beta", quota={"gpu": 1})
        offer = _start(s.api.post(s.token, "pools/offer", body))
        await _until_waiting(db, 1, offer)
        await holder.commit()
    answered = await asyncio.wait_for(offer, DEADLINE_S)
    assert answered.status_code == 200, answered.text
    assert quotas(answered.json()["pool"]) == {"gpu": (3, 3)}
