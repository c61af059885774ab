"""The relay's reads cost what they return, not what the outbox holds, in the plan
PostgreSQL keeps for each prepared statement (a generic plan): the events are read by
the index from the position on, and each event's audience by an index probe. With the
limit a parameter, that plan read the events table by a parallel scan and a sort; with
the audience joined, it hashed the whole audience table; both on every read, at a cost
that grew with retention (default: every event kept). Real PostgreSQL, the reader's own
statements, planned on a full outbox of events the size the service writes."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest
from sqlalchemy import Select, event, text
from sqlalchemy.ext.asyncio import AsyncConnection
from starlette.applications import Starlette

from app.capacity.service import Capacity
from app.db.engine import RELAY_APPLICATION_NAME, Database
from app.events.cursor import BIGINT_MAX, START, DeliveryState, Position
from app.events.reader import (
    committed_above_horizon_query,
    horizon_and_uncovered_query,
    read_between,
    read_events_query,
    read_uncovered_query,
)
from app.events.relay import Relay
from tests.db.faults import postgres_dsn
from tests.events.support import settle, subscribe
from tests.rest.scene import Scene
from tests.support import Api, Fleet

pytestmark = pytest.mark.parametrize("dialect", ["postgresql"])  # the planner's choice

EVENTS = 20_000
INDEX_SCANS = ("Index Scan", "Index Only Scan")


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", ()):
        found += _nodes(child)
    return found


async def _generic_plan(db: Database, statement: Select[Any], params: dict[str, Any]) -> list[Any]:
    """The nodes of the plan PostgreSQL keeps for `statement` prepared (a generic plan)."""
    expanded = statement.compile(dialect=db.writer.dialect).construct_expanded_state(params)
    values = [expanded.parameters[name] for name in expanded.positiontup or ()]
    async with db.writer.connect() as conn:
        await conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
        await conn.exec_driver_sql(f"PREPARE outbox_read AS {expanded.statement}")
        arguments = ", ".join(f"'{v}'" if isinstance(v, str) else str(int(v)) for v in values)
        execute = f"EXECUTE outbox_read({arguments})" if values else "EXECUTE outbox_read"
        found = (await conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {execute}")).scalar_one()
        await conn.exec_driver_sql("DEALLOCATE outbox_read")
        await conn.rollback()
    plan = json.loads(found) if isinstance(found, str) else found
    return _nodes(plan[0]["Plan"])


async def _grow_outbox(db: Database, events: int = EVENTS) -> None:
    """`events` more events of the size the service writes, over 50 pools, each for two
    tenants, and the statistics that say so.

    A fixture's bulk load, not a request: it runs on its own connection to the server,
    without the service's statement timeout or its client-side bound on a command, which
    a loaded CI machine has outlasted."""
    connection = await asyncpg.connect(postgres_dsn(db.url), timeout=10)
    try:
        async with connection.transaction():
            await connection.execute("SET LOCAL statement_timeout = 0")
            await connection.execute(
                "INSERT INTO events (tx, type, pool_id, tenant_id, occurred_at, data)"
                " SELECT g, 'pool.updated', 'p' || (g % 50), 'acme', now(),"
                " jsonb_build_object('version', g, 'note', repeat('x', 400))"
                " FROM generate_series(1, $1::int) AS g",
                events,
                timeout=None,
            )
            await connection.execute(
                "INSERT INTO event_audience (seq, tenant_id)"
                " SELECT seq, t FROM events, (VALUES ('acme'), ('guest')) AS a(t)"
                " WHERE NOT EXISTS (SELECT 1 FROM event_audience x WHERE x.seq = events.seq)",
                timeout=None,
            )
            await connection.execute("ANALYZE events", timeout=None)
            await connection.execute("ANALYZE event_audience", timeout=None)
    finally:
        await connection.close()


@pytest.fixture
async def full_outbox(db: Database) -> None:
    await _grow_outbox(db)


SETTLED = Position(EVENTS - 5, 0)
READS = {
    "the relay's read": read_uncovered_query(DeliveryState(SETTLED), limit=500),
    "the relay's read, events delivered ahead": read_uncovered_query(
        DeliveryState(SETTLED, (Position(EVENTS - 2, EVENTS - 2),)), limit=500
    ),
    "a subscription's replay, its tenants' audiences": read_events_query(
        SETTLED, limit=500, tenants=["acme"]
    ),
    "the relay's check for an event it has not covered": horizon_and_uncovered_query(
        DeliveryState(SETTLED, (Position(EVENTS - 2, EVENTS - 2),))
    ),
    "whether committed events wait above the horizon": committed_above_horizon_query(),
}


@pytest.mark.parametrize("name", list(READS))
async def test_an_events_audience_is_read_by_index_whatever_the_outbox_holds(
    db: Database, full_outbox: None, name: str
) -> None:
    statement, params = READS[name]
    nodes = await _generic_plan(db, statement, params)
    on_audience = [n for n in nodes if n.get("Relation Name") == "event_audience"]
    for node in on_audience:  # a probe by the event's seq, not a pass over the table
        assert node["Node Type"] in INDEX_SCANS, (name, node)
        assert "seq = " in node.get("Index Cond", ""), (name, node)
    on_events = [n for n in nodes if n.get("Relation Name") == "events"]
    assert on_events, f"{name}: the plan reads no events: {nodes}"
    for node in on_events:  # from the position (or the horizon) on, in the index's order
        assert node["Node Type"] in INDEX_SCANS, (name, node)
        assert "tx" in node.get("Index Cond", ""), (name, node)


_PLANS_OF_RELAY_READS = (
    "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
    " WHERE statement LIKE '%read_horizon%' AND statement NOT LIKE '%pg_prepared_statements%'"
)


async def _small_outbox(db: Database) -> None:
    """Statistics of the outbox as this test finds it (an earlier test's may linger): the
    plans below are made for a small one."""
    async with db.writer.begin() as conn:
        await conn.execute(text("ANALYZE events"))
        await conn.execute(text("ANALYZE event_audience"))


async def test_the_relays_reads_are_planned_for_their_position_as_the_outbox_grows(
    db: Database,
) -> None:
    """The relay reads on connections of its own (engine.RELAY_SETTINGS) where each read is
    planned for the position it reads from. On the service's shared pool the statement,
    prepared while the outbox was small, kept a generic plan (a scan and a sort of the
    whole table) as the outbox grew: seen in `bench.writes` (docs/performance.md)."""
    if db.pooled_by_transaction:
        pytest.skip("behind PgBouncer every statement is the unnamed one, planned each time")
    assert db.relay is not None
    await _small_outbox(db)
    statement, params = READS["the relay's read"]
    async with db.relay.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
        # Past the five custom plans after which PostgreSQL may keep a generic one.
        for _ in range(8):
            await conn.execute(statement, params)
        await _grow_outbox(db)
        for _ in range(3):
            await conn.execute(statement, params)
        plans = (await conn.exec_driver_sql(_PLANS_OF_RELAY_READS)).all()
    assert plans, "the relay's read was not prepared on its connection"
    assert all(generic == 0 for generic, _ in plans), plans
    assert sum(custom for _, custom in plans) >= 11, plans


_PLANS_OF_REPLAY_READS = (
    "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
    " WHERE statement LIKE '%FROM events%LIMIT%' AND statement NOT LIKE '%read_horizon%'"
    " AND statement NOT LIKE '%pg_prepared_statements%'"
)


async def test_a_replays_reads_are_planned_for_their_position_on_a_shared_connection(
    db: Database,
) -> None:
    """A subscription's replay reads on the service's shared pool, whose other statements
    keep their generic plans: `read_between` plans its own reads for their position, for
    its transaction only, as the relay's connections plan theirs."""
    if db.pooled_by_transaction:
        pytest.skip("behind PgBouncer every statement is the unnamed one, planned each time")
    target = DeliveryState(Position(BIGINT_MAX, BIGINT_MAX))

    await _small_outbox(db)

    async def replay(conn: AsyncConnection) -> None:
        await read_between(conn, DeliveryState(SETTLED), target, limit=500, tenants=["acme"])
        await conn.rollback()

    async with db.reader.connect() as conn:
        for _ in range(8):  # past the five custom plans, as above
            await replay(conn)
        await _grow_outbox(db)
        for _ in range(3):
            await replay(conn)
        plans = (await conn.exec_driver_sql(_PLANS_OF_REPLAY_READS)).all()
    assert plans, "the replay's read was not prepared on its connection"
    assert all(generic == 0 for generic, _ in plans), plans
    assert sum(custom for _, custom in plans) >= 11, plans


async def test_a_replays_read_asks_for_its_own_plans_only_where_plans_are_kept(
    db: Database,
) -> None:
    """On a shared connection the replay's read first sets its plans for the transaction
    (one statement); behind PgBouncer, where every statement is the unnamed one, parsed
    and planned for its values each time, it sends none: a round trip for nothing."""
    sent: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        sent.append((statement, parameters))

    await _grow_outbox(db, 3)
    target = DeliveryState(Position(BIGINT_MAX, BIGINT_MAX))
    event.listen(db.reader.sync_engine, "before_cursor_execute", record)
    try:
        async with db.reader.connect() as conn:
            events = await read_between(
                conn, DeliveryState(START), target, limit=500, tenants=["acme"]
            )
            await conn.rollback()
    finally:
        event.remove(db.reader.sync_engine, "before_cursor_execute", record)
    assert events, "the replay read nothing"
    assert any("FROM events" in statement for statement, _ in sent), sent
    planning = [s for s, parameters in sent if "plan_cache_mode" in str(parameters)]
    assert len(planning) == (0 if db.pooled_by_transaction else 1), sent


async def test_a_running_relay_reads_on_its_own_connections(
    app: Starlette, api: Api, fleet: Fleet
) -> None:
    """The service's relay, woken by real writes, prepares its reads on the connections of
    `Database.relay` (each planned for its position), not on the shared pool's."""
    capacity: Capacity = app.state.capacity
    db = capacity.db
    if db.pooled_by_transaction:
        pytest.skip("behind PgBouncer the relay reads on the shared pool")
    assert db.relay is not None
    s = await Scene.start(api, fleet)
    watcher = await subscribe(app, s.token, "acme")
    pool_id = (await s.pool())["id"]
    for n in range(8):
        await api.ok(s.token, "pools/update", s.body(pool_id, policy={"singleTenant": n % 2 == 0}))
        await settle(app, watcher)
    relay: Relay = app.state.relay
    await relay.stop()  # its held connection back to the pool, which the test reads
    async with db.relay.connect() as one, db.relay.connect() as other:  # all of its pool
        plans = [
            row
            for conn in (one, other)
            for row in (await conn.exec_driver_sql(_PLANS_OF_RELAY_READS)).all()
        ]
        names = {
            (await conn.exec_driver_sql("SHOW application_name")).scalar_one()
            for conn in (one, other)
        }
    await relay.start()
    await watcher.close()
    assert names == {RELAY_APPLICATION_NAME}
    assert plans, "the relay's reads were not prepared on its own connections"
    assert all(generic == 0 for generic, _ in plans), plans
    assert sum(custom for _, custom in plans) >= 8, plans
