"""An archive racing a booking (docs/decisions/0004): the booking either commits before the
archive or is refused with INVALID_STATE; no booking commits after an archive it did not
see. PostgreSQL only: SQLite runs one writer at a time, so the two cannot interleave.

Each test holds a lock of its own on a separate connection to stop one side at a known
point, and watches pg_stat_activity to know the other side is waiting.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.engine import Database
from tests.rest.scene import Scene, offers, quotas
from tests.support import Api, Fleet

pytestmark = pytest.mark.parametrize("dialect", ["postgresql"])  # interleaving writers

DEADLINE_S = 30.0


async def _waiting_on_locks(conn: AsyncConnection) -> list[tuple[str, str]]:
    """(wait_event, query) of every session of this database waiting on a lock."""
    rows = await conn.execute(
        text(
            "SELECT wait_event, query FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
    )
    return [(r.wait_event, r.query) for r in rows]


async def _until_waiting(db: Database, count: int, *tasks: asyncio.Task[Any]) -> None:
    """Until `count` sessions wait on a lock; none of `tasks` may finish meanwhile."""
    deadline = time.monotonic() + DEADLINE_S
    async with db.reader.connect() as conn:
        while len(await _waiting_on_locks(conn)) < count:
            for task in tasks:
                assert not task.done(), task.result()
            assert time.monotonic() < deadline, await _waiting_on_locks(conn)
            await asyncio.sleep(0.02)
            await conn.rollback()  # a fresh snapshot of pg_stat_activity


def _start(call: Awaitable[httpx.Response]) -> asyncio.Task[httpx.Response]:
    async def run() -> httpx.Response:
        return await call

    return asyncio.create_task(run())


async def _pool(s: Scene) -> str:
    pool_id = str((await s.pool())["id"])
    await s.fleet.node(pool_id, 8)
    return pool_id


def _booking(s: Scene, pool_id: str) -> Awaitable[httpx.Response]:
    body = {"tenantId": s.owner, "poolId": pool_id, "resources": {"gpu": 1}}
    return s.api.post(s.token, "reservations/create", body)


async def test_an_archive_waits_for_the_booking_in_flight(
    api: Api, fleet: Fleet, db: Database
) -> None:
    s = await Scene.start(api, fleet)
    pool_id = await _pool(s)
    async with db.writer.connect() as holder:
        # The booking stops at its last step, inserting the reservation: its foreign key
        # needs a key-share lock on the tenant row, which we hold exclusively.
        await holder.execute(text("SELECT id FROM tenants WHERE id = 'acme' FOR UPDATE"))
        booking = _start(_booking(s, pool_id))
        await _until_waiting(db, 1, booking)
        archive = _start(s.api.post(s.token, "pools/archive", s.body(pool_id)))
        # The archive waits too: for the rows the booking in flight holds.
        await _until_waiting(db, 2, booking, archive)
        await holder.rollback()
    booked, archived = await asyncio.wait_for(asyncio.gather(booking, archive), DEADLINE_S)
    assert booked.status_code == 200, booked.text
    assert archived.json()["pool"]["archived"] is True, archived.text
    # The booking committed first, so the archive left it in place, and counts it.
    assert (await s.capacity(pool_id))["gpu"]["booked"] == 1
    assert quotas(archived.json()["pool"])["gpu"][1] == 1, archived.text


async def test_an_archive_answers_the_quota_rows_as_the_last_booking_left_them(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """The archive's answer counts a booking that held the owner's quota row when the
    archive read it: the archive waits for the row, then answers its newest version (on
    PostgreSQL its withdrawal locks the owner's rows: offers._WITHDRAW_GUESTS)."""
    s = await Scene.start(api, fleet)
    pool_id = await _pool(s)
    async with db.writer.connect() as holder:
        # A booking's first step, by hand: the owner's quota row updated, not yet committed.
        await holder.execute(
            text("UPDATE quota_rows SET used = used + 1 WHERE pool_id = :pool AND tenant_id = :t"),
            {"pool": pool_id, "t": s.owner},
        )
        archive = _start(s.api.post(s.token, "pools/archive", s.body(pool_id)))
        await _until_waiting(db, 1, archive)
        await holder.commit()
    archived = await asyncio.wait_for(archive, DEADLINE_S)
    assert archived.status_code == 200, archived.text
    answered = archived.json()["pool"]
    assert quotas(answered)["gpu"][1] == 1, answered
    assert offers(answered)[s.owner]["quotas"][0]["used"] == 1, answered


async def test_a_booking_behind_an_archive_is_refused(api: Api, fleet: Fleet, db: Database) -> None:
    s = await Scene.start(api, fleet)
    pool_id = await _pool(s)
    async with db.writer.connect() as holder:
        # The archive stops right before it commits: inserting its events waits for our
        # SHARE lock on the outbox table. By then it holds every row it locks.
        await holder.execute(text("LOCK TABLE events IN SHARE MODE"))
        archive = _start(s.api.post(s.token, "pools/archive", s.body(pool_id)))
        await _until_waiting(db, 1, archive)
        booking = _start(_booking(s, pool_id))
        await _until_waiting(db, 2, archive, booking)
        await holder.rollback()
    archived, refused = await asyncio.wait_for(asyncio.gather(archive, booking), DEADLINE_S)
    assert archived.status_code == 200, archived.text
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "INVALID_STATE"
    assert (await s.capacity(pool_id))["gpu"]["booked"] == 0
