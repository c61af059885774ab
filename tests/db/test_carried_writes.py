"""Blind writes carried by the event's INSERT (app/db/carried_writes.py): on PostgreSQL a
write held by `write_later` rides in the unit of work's event statement, or is sent before
any other statement, on the driver path and on the plain path alike; on SQLite it is sent
at once. Either way the rows are the same."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import bindparam, select, update

from app.db.engine import Database
from app.db.models import AuthzRow, Pool
from app.db.uow import UnitOfWork
from app.events.cursor import START
from app.events.outbox import PendingEvent
from app.events.reader import read_events
from app.metrics import instrument_engine
from tests.events.support import bare_pools, visible_outbox
from tests.support import Fleet

_POOLS: Any = Pool.__table__
# As app/capacity/pool_rows.py writes a pool's row: the columns its parameters name.
_WRITE = update(_POOLS).where(_POOLS.c.id == bindparam("pool_key"))
_MODEL = update(AuthzRow.__table__).where(AuthzRow.pool_id == bindparam("pool_key"))


def _sent() -> float:
    found = REGISTRY.get_sample_value("bettercompute_db_statements_total", {"transport": "none"})
    return found or 0.0


def _paths(db: Database) -> list[tuple[str, Database]]:
    """The database as configured (the driver path on PostgreSQL where the fence allows)
    and without driver statements (the plain path, as behind PgBouncer)."""
    return [("as configured", db), ("plain", dataclasses.replace(db, driver=None))]


async def _pool_row(db: Database, pool_id: str) -> Any:
    async with db.reader.connect() as conn:
        query = select(_POOLS.c.tenant_id, _POOLS.c.gpu_model, _POOLS.c.version)
        return (await conn.execute(query.where(_POOLS.c.id == pool_id))).one()


async def _updated(uow: UnitOfWork, pool_id: str, version: int, tenant: str, held: bool) -> None:
    """The pool's row written later (`held`), then an event for another tenant than its
    owner (its INSERT's parameters name columns of the pool's table: none may be SET)."""
    assert await uow.lock_pool(pool_id)
    if held:
        await uow.statements.write_later(
            _WRITE, {"pool_key": pool_id, "gpu_model": f"H{version}", "version": version}
        )
    uow.emit(
        PendingEvent(
            type="pool.updated",
            pool_id=pool_id,
            tenant_id=tenant,
            data={"version": version},
            audience=frozenset({tenant}),
        )
    )


async def test_a_held_write_rides_in_the_event_on_either_path(db: Database, fleet: Fleet) -> None:
    await fleet.tenant("beta")
    [pool_id] = await bare_pools(fleet, db, 1)
    instrument_engine(db.writer, "writer")  # the plain path's statements counted, as served
    version = 1
    for name, path in _paths(db):
        for _ in range(3):  # seen once (the plain path), then compiled for the driver
            sent = []
            for held in (False, True):
                version += 1
                before = _sent()
                async with UnitOfWork(path) as uow:
                    await _updated(uow, pool_id, version, "beta", held)
                sent.append(_sent() - before)
            # PostgreSQL: no statement more for the pool's row; SQLite: one.
            assert sent[1] - sent[0] == (0 if db.dialect == "postgresql" else 1), name
            row = await _pool_row(db, pool_id)
            assert (row.tenant_id, row.gpu_model, row.version) == ("acme", f"H{version}", version)
    async with visible_outbox(db) as conn:
        events = await read_events(conn, START, limit=100)
    assert [e.data["version"] for e in events] == list(range(2, version + 1))


async def test_a_held_write_is_sent_before_any_other_statement(db: Database, fleet: Fleet) -> None:
    [pool_id] = await bare_pools(fleet, db, 1)
    for name, path in _paths(db):
        async with UnitOfWork(path) as uow:
            await uow.statements.write_later(_WRITE, {"pool_key": pool_id, "gpu_model": name})
            await uow.statements.write_later(_MODEL, {"pool_key": pool_id, "gpu_model": name})
            found = await uow.statements.execute(
                select(_POOLS.c.gpu_model).where(_POOLS.c.id == bindparam("pool_id")),
                {"pool_id": pool_id},
            )
            assert found.scalar_one() == name  # the read sees the held write
        assert (await _pool_row(db, pool_id)).gpu_model == name


async def test_a_held_write_without_an_event_is_sent_at_commit_and_not_after_a_failure(
    db: Database, fleet: Fleet
) -> None:
    [pool_id] = await bare_pools(fleet, db, 1)
    async with UnitOfWork(db) as uow:
        await uow.statements.write_later(_WRITE, {"pool_key": pool_id, "gpu_model": "kept"})
    assert (await _pool_row(db, pool_id)).gpu_model == "kept"
    with pytest.raises(RuntimeError):
        async with UnitOfWork(db) as uow:
            await uow.statements.write_later(_WRITE, {"pool_key": pool_id, "gpu_model": "lost"})
            raise RuntimeError("the write fails")
    assert (await _pool_row(db, pool_id)).gpu_model == "kept"


async def test_a_unit_of_work_that_holds_nothing_sends_a_write_at_once(
    db: Database, fleet: Fleet
) -> None:
    """A fleet apply reads through the ORM session, past `uow.statements`: a held write
    would be missed by those reads, so with `holding` off `write_later` sends it at once."""
    [pool_id] = await bare_pools(fleet, db, 1)
    for holding in (True, False):
        async with UnitOfWork(db) as uow:
            uow.statements.holding = holding
            await uow.statements.write_later(
                _WRITE, {"pool_key": pool_id, "gpu_model": f"seen-{holding}"}
            )
            found = await uow.session.scalar(
                select(_POOLS.c.gpu_model).where(_POOLS.c.id == pool_id)
            )
            # Held (PostgreSQL), the ORM session's own read does not see it yet.
            held = holding and db.dialect == "postgresql"
            assert (found == f"seen-{holding}") is not held
        assert (await _pool_row(db, pool_id)).gpu_model == f"seen-{holding}"
