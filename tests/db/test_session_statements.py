"""A unit of work's statements (app/db/session_statements.py): built-once Core statements
on the session's own asyncpg connection where the fence allows, the plain path elsewhere,
with the same rows, the same transaction and the same errors on both."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from app.capacity.inputs import CreatePoolInput, UpdatePoolInput
from app.capacity.service import Capacity
from app.config import Settings
from app.db.engine import Database, create_database
from app.db.errors import to_domain_error
from app.db.models import Event, Pool, Tenant, utcnow
from app.db.session_statements import AutocommitStatements, SessionStatements, is_orm
from app.db.uow import UnitOfWork
from app.errors import Unavailable
from app.events.cursor import START, DeliveryState, Position
from app.events.reader import read_uncovered_query
from app.iam.callers import authenticate
from tests.support import Fleet

_TENANTS = Tenant.__table__
_NAMED = select(_TENANTS.c.id, _TENANTS.c.parent_id).where(_TENANTS.c.id == bindparam("tenant"))
_AMONG = select(_TENANTS.c.id).where(_TENANTS.c.id.in_(bindparam("ids", expanding=True)))
_RENAME = update(_TENANTS).where(_TENANTS.c.id == bindparam("tenant"))
_ADD = insert(_TENANTS)


def _driven(db: Database) -> bool:
    """Whether this database takes the driver path (PostgreSQL, not behind PgBouncer)."""
    return db.dialect == "postgresql" and not db.pooled_by_transaction


async def test_the_fence_picks_the_driver_on_postgresql_only(db: Database) -> None:
    assert (db.driver is not None) is _driven(db)
    off = create_database(db.url, Settings(compiled_reads=False))
    try:
        assert off.driver is None
    finally:
        await off.dispose()


def test_entities_and_orm_writes_stay_with_the_session() -> None:
    assert is_orm(select(Pool))
    assert is_orm(update(Pool).values(version=2))
    assert not is_orm(select(Pool.id, Pool.version))  # columns, named by mapped attributes
    assert not is_orm(_NAMED)


async def test_both_paths_answer_alike_in_the_same_transaction(db: Database, fleet: Fleet) -> None:
    await fleet.tenant("acme")
    await fleet.tenant("acme-dev", "acme")
    plain_answers = []
    async with UnitOfWork(db) as uow:
        plain = SessionStatements(uow.session, None)
        for _ in range(2):
            plain_answers.append((await plain.execute(_NAMED, {"tenant": "acme-dev"})).all())
        plain_answers.append((await plain.execute(_AMONG, {"ids": ["acme", "acme-dev"]})).all())
    async with UnitOfWork(db) as uow:
        answers = []
        for _ in range(3):  # seen once, then compiled for the driver
            answers.append((await uow.statements.execute(_NAMED, {"tenant": "acme-dev"})).all())
            answers.append(
                (await uow.statements.execute(_AMONG, {"ids": ["acme", "acme-dev"]})).all()
            )
        row = answers[-2][0]
        assert (row.id, row.parent_id) == ("acme-dev", "acme")  # rows by key, as SQLAlchemy's
        assert sorted(answers[-1]) == sorted(plain_answers[-1])
        assert answers[-2] == plain_answers[0]
    if _driven(db):
        assert db.driver is not None
        compiled = [d for d in db.driver._compiled.values() if d is not None]
        assert {d.statement for d in compiled} >= {_NAMED, _AMONG}


_LABEL_AMONG = (
    update(Pool.__table__)
    .where(Pool.__table__.c.id.in_(bindparam("ids", expanding=True)))
    .values(labels=bindparam("labels"))
)


async def test_an_in_list_beside_a_processed_value(db: Database, fleet: Fleet) -> None:
    """An IN list's statement whose other values need their type's processing (a JSON
    column's dict): on the driver, the expanded state's processors are the list's only;
    the statement's own were dropped, and the dict was sent as it is (asyncpg refused it)."""
    await fleet.tenant("acme")
    site = await fleet.site("acme")
    owner = await authenticate(db, f"Bearer {await fleet.caller('acme')}")
    body = {"tenantId": "acme", "siteId": site, "class": "metal-host"}
    made = [
        (await Capacity(db).create_pool(owner, CreatePoolInput.model_validate(body))).pool.id
        for _ in range(2)
    ]
    for n in range(3):  # seen once, then compiled for the driver
        async with UnitOfWork(db) as uow:
            await uow.statements.execute(_LABEL_AMONG, {"ids": made, "labels": {"n": str(n)}})
    async with db.reader.connect() as conn:
        found = await conn.execute(select(Pool.labels).where(Pool.id.in_(made)))
        assert [labels for (labels,) in found] == [{"n": "2"}] * 2


async def test_a_driver_statement_is_in_the_unit_of_works_transaction(
    db: Database, fleet: Fleet
) -> None:
    await fleet.tenant("acme")
    for _ in range(3):
        with pytest.raises(RuntimeError):
            async with UnitOfWork(db) as uow:
                await uow.statements.execute(_NAMED, {"tenant": "acme"})  # the transaction began
                await uow.statements.execute(_RENAME, {"tenant": "acme", "parent_id": "acme"})
                raise RuntimeError("rolled back")
    async with db.reader.connect() as conn:
        parent = (await conn.execute(_NAMED, {"tenant": "acme"})).one().parent_id
    assert parent is None  # every rename rolled back with its transaction


async def test_an_integrity_error_is_sqlalchemys_on_both_paths(db: Database, fleet: Fleet) -> None:
    await fleet.tenant("acme")
    for _ in range(3):
        with pytest.raises(IntegrityError):
            async with UnitOfWork(db) as uow:
                await uow.statements.execute(_NAMED, {"tenant": "acme"})
                await uow.statements.execute(
                    _ADD, {"id": "acme", "parent_id": None, "created_at": utcnow()}
                )


@pytest.mark.parametrize("compiled", [True, False], ids=["driver", "plain"])
async def test_a_pool_write_is_the_same_on_both_paths(
    database_url: str, compiled: bool, fleet: Fleet
) -> None:
    """The same writes with the driver path on and off leave the same answers."""
    db = create_database(database_url, Settings(compiled_reads=compiled))
    try:
        assert (db.driver is not None) is (compiled and _driven(db))
        capacity = Capacity(db)
        await fleet.tenant("acme")
        site = await fleet.site("acme")
        owner = await authenticate(db, f"Bearer {await fleet.caller('acme')}")
        created = await capacity.create_pool(
            owner,
            CreatePoolInput.model_validate(
                {"tenantId": "acme", "siteId": site, "class": "metal-host", "gpuModel": "H100"}
            ),
        )
        models = ["L40S", "H200", "H100"]
        for model in models:
            updated = await capacity.update_pool(
                owner,
                UpdatePoolInput.model_validate(
                    {"tenantId": "acme", "poolId": created.pool.id, "gpuModel": model}
                ),
            )
        assert updated.pool.version == 1 + len(models)
        assert updated.pool.gpu_model == "H100"
        assert [q.resource for q in updated.quotas] == [q.resource for q in created.quotas]
    finally:
        await db.dispose()


@pytest.mark.parametrize("compiled", [True, False], ids=["driver", "plain"])
async def test_a_connection_lost_mid_write_is_unavailable_on_both_paths(
    database_url: str, compiled: bool, fleet: Fleet
) -> None:
    """A unit of work's connection closed under it answers UNAVAILABLE (a 503), not an
    internal error, with the driver path on and off; and asyncpg's own closed-connection
    error, as the driver path would meet it mid-statement, is UNAVAILABLE too."""
    if not database_url.startswith("postgresql"):
        pytest.skip("the driver path is PostgreSQL's")
    await fleet.tenant("acme")
    db = create_database(database_url, Settings(compiled_reads=compiled))
    try:
        with pytest.raises(Exception) as raised:
            async with UnitOfWork(db) as uow:
                for _ in range(2):  # a statement's second run takes the driver path
                    await uow.statements.execute(_NAMED, {"tenant": "acme"})
                conn = await uow.statements.connection()
                raw = (await conn.get_raw_connection()).driver_connection
                assert raw is not None
                await raw.close()
                await uow.statements.execute(_NAMED, {"tenant": "acme"})
        assert isinstance(to_domain_error(raised.value), Unavailable), raised.value
    finally:
        await db.dispose()


def test_asyncpgs_closed_connection_error_is_unavailable() -> None:
    import asyncpg

    from app.db.session_statements import _adapted

    closed = asyncpg.InterfaceError("cannot perform operation: connection is closed")
    assert isinstance(to_domain_error(_adapted(closed, "SELECT 1")), Unavailable)
    assert not isinstance(to_domain_error(closed), Unavailable)  # what it was before


@pytest.mark.parametrize("begins", [True, False], ids=["driver-begin", "adapter-changed"])
async def test_a_write_begins_on_the_driver_or_leaves_begin_to_the_plain_path(
    database_url: str, begins: bool, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BEGIN is sent as SQLAlchemy's asyncpg adapter sends it, so the first statement of a
    unit of work takes the driver path; an adapter whose `_start_transaction` changed shape
    (as an upgrade could) is found at start-up, and then the plain path begins it: the same
    rows, committed and rolled back alike."""
    if not database_url.startswith("postgresql"):
        pytest.skip("the driver path is PostgreSQL's")
    if not begins:
        from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection

        original = AsyncAdapt_asyncpg_connection._start_transaction

        async def widened(self: AsyncAdapt_asyncpg_connection, isolation: str = "") -> None:
            await original(self)  # SQLAlchemy's own call still works

        monkeypatch.setattr(AsyncAdapt_asyncpg_connection, "_start_transaction", widened)
    await fleet.tenant("acme")
    db = create_database(database_url, Settings(compiled_reads=True))
    try:
        if db.pooled_by_transaction:
            pytest.skip("behind PgBouncer the plain path serves")
        assert db.driver is not None and db.driver.begins is begins
        async with UnitOfWork(db) as uow:  # seen once: the plain path
            await uow.statements.execute(_RENAME, {"tenant": "acme", "parent_id": None})
        with pytest.raises(RuntimeError):
            async with UnitOfWork(db) as uow:
                # The first statement of this unit of work, compiled: on the driver after
                # a driver BEGIN, else on the plain path, which began the transaction.
                await uow.statements.execute(_RENAME, {"tenant": "acme", "parent_id": "acme"})
                raw = await (await uow.statements.connection()).get_raw_connection()
                assert raw.driver_connection is not None
                assert raw.driver_connection.is_in_transaction()
                raise RuntimeError("rolled back")
        async with UnitOfWork(db) as uow:
            await uow.statements.execute(_NAMED, {"tenant": "acme"})
            await uow.statements.execute(_RENAME, {"tenant": "acme", "parent_id": None})
        async with db.reader.connect() as conn:
            assert (await conn.execute(_NAMED, {"tenant": "acme"})).one().parent_id is None
    finally:
        await db.dispose()


_PLANNED_CASES: list[tuple[Any, dict[str, Any]]] = [
    (_NAMED, {"tenant": "acme"}),
    # an anonymous bind's own value, a named bind used twice, a bind with a default
    (
        select(_TENANTS.c.id).where(
            _TENANTS.c.id == bindparam("tenant"),
            _TENANTS.c.parent_id.is_distinct_from(bindparam("tenant")),
            _TENANTS.c.parent_id != "x",
            _TENANTS.c.id != bindparam("other", "zeta"),
        ),
        {"tenant": "acme"},
    ),
    (select(_TENANTS.c.id).where(_TENANTS.c.id != bindparam("other", "zeta")), {"other": "y"}),
    (_LABEL_AMONG, {"labels": {"n": "1"}, "ids": ["a", "b"]}),  # an IN list: not planned
    # a JSONB value, processed by its type
    (
        update(Pool.__table__)
        .where(Pool.__table__.c.id == bindparam("pool"))
        .values(labels=bindparam("labels")),
        {"pool": "a", "labels": {"n": "1"}},
    ),
    (_RENAME.values(parent_id=bindparam("parent")), {"tenant": "acme", "parent": "A"}),
]


@pytest.mark.parametrize("n", range(len(_PLANNED_CASES)))
def test_the_argument_plan_sends_what_construct_params_sends(n: int) -> None:
    """The positional arguments read off the compiled binds once are those SQLAlchemy's
    construct_params builds per call (the type processors applied alike)."""
    from sqlalchemy.dialects import postgresql

    from app.db.session_statements import compile_for_driver

    statement, params = _PLANNED_CASES[n]
    dialect = postgresql.asyncpg.dialect()  # type: ignore[attr-defined]
    keys = tuple(sorted(params)) if isinstance(statement, type(_RENAME)) else None
    planned = compile_for_driver(statement, dialect, keys)
    assert planned is not None
    plain = dataclasses.replace(planned, plan=None)
    assert plain.plan is None
    assert (planned.plan is not None) == (not planned.expanding)
    assert planned.arguments(params) == plain.arguments(params)
    if planned.plan is not None:  # a required value left out is refused alike
        required = [a.key for a in planned.plan if a.required]
        missing = {k: v for k, v in params.items() if k != (required or [None])[0]}
        if required:
            with pytest.raises(Exception) as on_plan:
                planned.arguments(missing)
            with pytest.raises(Exception) as on_plain:
                plain.arguments(missing)
            assert str(on_plan.value) == str(on_plain.value)


def test_a_bind_computed_per_call_keeps_construct_params() -> None:
    from itertools import count

    from sqlalchemy.dialects import postgresql

    from app.db.session_statements import compile_for_driver

    numbers = count()
    statement = select(_TENANTS.c.id).where(
        _TENANTS.c.parent_id == bindparam("n", callable_=lambda: str(next(numbers)))
    )
    made = compile_for_driver(statement, postgresql.asyncpg.dialect())  # type: ignore[attr-defined]
    assert made is not None and made.plan is None
    assert [made.arguments({})[1] for _ in range(2)] == [("0",), ("1",)]
    # values carried by the statement itself (`.params()`) are construct_params' too
    carried = select(_TENANTS.c.id).where(_TENANTS.c.id == bindparam("t")).params(t="acme")
    made = compile_for_driver(carried, postgresql.asyncpg.dialect())  # type: ignore[attr-defined]
    assert made is not None and made.plan is None
    assert made.arguments({})[1] == ("acme",)


def test_an_argument_plan_that_drifts_from_construct_params_turns_the_driver_path_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plan reads SQLAlchemy's compiled binds, an internal: start-up compares it with
    construct_params on a probe and, should an upgrade make them differ, the driver path
    stays off (the plain path serves every statement)."""
    from sqlalchemy.dialects import postgresql

    from app.db import session_statements

    dialect = postgresql.asyncpg.dialect()  # type: ignore[attr-defined]
    assert session_statements._driver_problem(dialect) is None
    monkeypatch.setattr(session_statements, "_argument", lambda a, params: None)
    problem = session_statements._driver_problem(dialect)
    assert problem is not None and "argument plan" in problem


def _events_of(reads: list[Any]) -> list[list[dict[str, Any]]]:
    """The relay reads' rows by key, but the horizon, which is each snapshot's own."""
    return [
        [{k: v for k, v in r._mapping.items() if k != "read_horizon"} for r in rows]
        for rows in reads
    ]


async def test_autocommit_statements_answer_as_the_connection_does(
    db: Database, fleet: Fleet
) -> None:
    """The relay's reads (AutocommitStatements): the relay's read, whose limit is written
    into its text and whose D is an IN list, answers on the driver as on the connection;
    a NUMERIC sum, whose processing needs the cursor's type code, stays on the plain path
    and answers as ever; and each statement runs outside any transaction."""
    await fleet.tenant("acme")
    site = await fleet.site("acme")
    owner = await authenticate(db, f"Bearer {await fleet.caller('acme')}")
    body = {"tenantId": "acme", "siteId": site, "class": "metal-host"}
    for _ in range(3):
        await Capacity(db).create_pool(owner, CreatePoolInput.model_validate(body))
    async with db.reader.connect() as conn:
        first = (await conn.execute(select(Event.tx, Event.seq).order_by(Event.seq))).first()
    assert first is not None
    ahead = DeliveryState(START, (Position(first.tx, first.seq),))
    reads = [read_uncovered_query(state, limit=2) for state in (DeliveryState(START), ahead)]
    summed = select(func.sum(Event.seq) / 2)  # NUMERIC on PostgreSQL
    engine = db.relay or db.reader
    if _driven(db):
        engine = engine.execution_options(isolation_level="AUTOCOMMIT")
    async with engine.connect() as conn:
        plain = [(await conn.execute(q, p)).all() for q, p in reads]
        plain_sum = (await conn.execute(summed)).scalar_one()
    assert [len(rows) for rows in plain] == [2, 2]  # the limit held
    assert first.seq not in {r.seq for r in plain[1]}  # D's event left out
    for _ in range(3):  # seen once, then compiled for the driver
        async with engine.connect() as conn:
            statements = AutocommitStatements(conn, db.driver)
            answers = [(await statements.execute(q, p)).all() for q, p in reads]
            assert _events_of(answers) == _events_of(plain)
            assert all(isinstance(r.read_horizon, int) for rows in answers for r in rows)
            assert await statements.scalar(summed) == plain_sum
            if _driven(db):
                raw = (await conn.get_raw_connection()).driver_connection
                assert not raw.is_in_transaction()
    if _driven(db):
        assert db.driver is not None
        compiled = {d.statement for d in db.driver._compiled.values() if d is not None}
        assert compiled >= {q for q, _ in reads}
        assert summed not in compiled
