"""A unit of work on a leased connection (app/db/lease.py): on PostgreSQL where the fence
allows, its connection comes from the pool without a session, and a session is made only
when a statement needs the ORM; it then shares the transaction. Each test runs on the
database as configured and with the session (the plain path, as on SQLite and behind
PgBouncer): the rows, the events and the counted transactions are the same on both."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import bindparam, event, select, update

from app.db.engine import Database
from app.db.models import Pool, Tenant
from app.db.uow import UnitOfWork
from app.events.outbox import LockOrderViolation, PendingEvent, note_pool_lock
from app.metrics import instrument_engine
from tests.events.support import bare_pools
from tests.support import Fleet

_POOLS: Any = Pool.__table__
_TENANTS: Any = Tenant.__table__
_NAMED = select(_TENANTS.c.id).where(_TENANTS.c.id == bindparam("tenant"))
_LABEL = update(_POOLS).where(_POOLS.c.id == bindparam("pool_key"))


def _paths(db: Database) -> list[tuple[str, Database]]:
    return [("as configured", db), ("session", dataclasses.replace(db, driver=None))]


def _leases(db: Database) -> bool:
    return db.driver is not None and db.driver.leases


def _transactions(outcome: str) -> float:
    found = REGISTRY.get_sample_value("bettercompute_db_transactions_total", {"outcome": outcome})
    return found or 0.0


async def _gpu_model(db: Database, pool_id: str) -> str | None:
    async with db.reader.connect() as conn:
        found = await conn.execute(select(_POOLS.c.gpu_model).where(_POOLS.c.id == pool_id))
        return found.scalar_one()  # type: ignore[no-any-return]


async def test_postgresql_leases_and_the_rest_keep_the_session(db: Database) -> None:
    assert _leases(db) is (db.dialect == "postgresql" and not db.pooled_by_transaction)
    for name, path in _paths(db):
        async with UnitOfWork(path) as uow:
            assert uow.leased is (name == "as configured" and _leases(db))


async def test_each_transaction_is_counted_once_and_only_the_session_fires_its_events(
    db: Database, fleet: Fleet
) -> None:
    [pool_id] = await bare_pools(fleet, db, 1)
    instrument_engine(db.writer, "writer")  # as served
    fired: list[str] = []

    def on_commit(_: Any) -> None:
        fired.append("commit")

    event.listen(db.writer.sync_engine, "commit", on_commit)
    try:
        for name, path in _paths(db):
            for n in range(3):  # seen once (the plain path), then compiled for the driver
                fired.clear()
                commits, rollbacks = _transactions("commit"), _transactions("rollback")
                async with UnitOfWork(path) as uow:
                    await uow.statements.execute(_LABEL, {"pool_key": pool_id, "gpu_model": name})
                with pytest.raises(RuntimeError):
                    async with UnitOfWork(path) as uow:
                        await uow.statements.execute(
                            _LABEL, {"pool_key": pool_id, "gpu_model": "x"}
                        )
                        raise RuntimeError("rolled back")
                assert _transactions("commit") - commits == 1, name
                assert _transactions("rollback") - rollbacks == 1, name
                assert await _gpu_model(db, pool_id) == name
                # A leased commit is the driver's (no Connection to fire SQLAlchemy's
                # event) once its statement is compiled: the first ran on the plain path,
                # on a Connection made around the lease. A session's always fires it.
                assert fired == ([] if uow.leased and n > 0 else ["commit"]), (name, n)
    finally:
        event.remove(db.writer.sync_engine, "commit", on_commit)


async def test_the_orm_shares_the_leased_transaction(db: Database, fleet: Fleet) -> None:
    await fleet.tenant("acme")
    for name, path in _paths(db):
        for n in range(3):
            kept, dropped = f"kept-{name[:3]}{n}", f"dropped-{name[:3]}{n}"
            async with UnitOfWork(path) as uow:
                await uow.statements.execute(_NAMED, {"tenant": "acme"})  # driver first
                await uow.rows.add_tenant(kept, "acme")  # then the ORM, flushed
                # A Core statement sees the ORM's row in the same transaction.
                found = await uow.statements.execute(_NAMED, {"tenant": kept})
                assert found.scalar_one() == kept
            with pytest.raises(RuntimeError):
                async with UnitOfWork(path) as uow:
                    await uow.statements.execute(_NAMED, {"tenant": "acme"})
                    uow.session.add(Tenant(id=dropped, parent_id="acme"))  # pending, unflushed
                    raise RuntimeError("rolled back")
            async with db.reader.connect() as conn:
                assert (await conn.execute(_NAMED, {"tenant": kept})).scalar_one() == kept
                assert (await conn.execute(_NAMED, {"tenant": dropped})).first() is None


async def test_a_pending_orm_object_is_flushed_before_commit(db: Database, fleet: Fleet) -> None:
    await fleet.tenant("acme")
    for name, path in _paths(db):
        async with UnitOfWork(path) as uow:
            await uow.statements.execute(_NAMED, {"tenant": "acme"})
            uow.session.add(Tenant(id=f"late-{name[:3]}", parent_id="acme"))  # never flushed
        async with db.reader.connect() as conn:
            found = await conn.execute(_NAMED, {"tenant": f"late-{name[:3]}"})
            assert found.scalar_one() == f"late-{name[:3]}"


async def test_a_pool_noted_before_the_session_was_made_stays_noted(
    db: Database, fleet: Fleet
) -> None:
    """The outbox's lock notes (app/events/outbox.py) live in the transaction's `info`:
    noted on the statements before any session, then by a session made afterwards, both
    pools' events are accepted; a pool noted by neither is refused."""
    first, second, third = await bare_pools(fleet, db, 3)
    for _name, path in _paths(db):
        async with UnitOfWork(path) as uow:
            note_pool_lock(uow.statements, first)  # as access.lock_owned_pool_row does
            assert await uow.lock_pool(second)  # by the session (tools, tests)
            for pool_id in (first, second):
                uow.emit(PendingEvent("pool.updated", pool_id, "acme", {}, frozenset({"acme"})))
        with pytest.raises(LockOrderViolation):
            async with UnitOfWork(path) as uow:
                note_pool_lock(uow.statements, first)
                uow.emit(PendingEvent("pool.updated", third, "acme", {}, frozenset({"acme"})))
