"""What one event costs the server per subscriber (issue 15): the work that can be done
once per event is done once. Real subscribers (gql over graphql-transport-ws) of a real
uvicorn server, on both dialects; the counts come from spies on the real methods."""
# (The relay's reads are counted on PostgreSQL, the dialect they are about.)

from __future__ import annotations

import asyncio
from asyncio.selector_events import _SelectorSocketTransport  # type: ignore[attr-defined]
from typing import Any

import pytest
from graphql.execution.executor import Executor
from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection
from starlette.applications import Starlette

from app.capacity.service import Capacity
from app.config import Settings
from app.events.relay import Relay
from schema.subscriptions import PoolEvent
from tests.events.conftest import served
from tests.events.support import emit_updates, settle, subscribe, wait_until
from tests.events.test_websocket import Stream, http_api, ws_client
from tests.rest.scene import Scene
from tests.support import Api, Fleet

PROTOCOL = "graphql-transport-ws"
LIGHT = """
subscription($tenantId: String!) { poolEvents(tenantId: $tenantId) { cursor type data } }
"""
OTHER = """
subscription($tenantId: String!) {
  poolEvents(tenantId: $tenantId) { cursor type data occurredAt }
}
"""
WITH_POOL = """
subscription($tenantId: String!) {
  poolEvents(tenantId: $tenantId) { cursor type data pool { id version } }
}
"""


async def subscribed(app: Starlette, count: int) -> None:
    relay: Relay = app.state.relay
    await wait_until(lambda: relay.subscriptions >= count)


async def live_streams(app: Starlette, address: str, plan: list[tuple[str, str]]) -> list[Stream]:
    """A stream per (document, token) of tenant acme, once every one is live: one still
    reading the outbox is shown its own event object, so it executes on its own."""
    streams = [
        Stream(ws_client(address, token, PROTOCOL), document, tenantId="acme")
        for document, token in plan
    ]
    await subscribed(app, len(streams))
    await wait_until(lambda: app.state.relay.live_subscriptions >= len(streams))
    return streams


def counted_executions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The cursor of each event a GraphQL execution runs for, from now on."""
    executions: list[str] = []
    execute = Executor.execute_operation

    def counted(self: Executor, serially: bool | None = None) -> Any:
        if isinstance(self.root_value, PoolEvent):
            executions.append(self.root_value.cursor)
        return execute(self, serially)

    monkeypatch.setattr(Executor, "execute_operation", counted)
    return executions


@pytest.mark.fast_path  # schema/executor.py shares the rendering
async def test_an_event_is_rendered_once_per_distinct_request(
    database_url: str, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Subscribers shown the same event with the same document and variables share one
    execution; another document is its own; a subscription reading `pool` (its own
    read) is executed for each subscriber. Each still receives exactly its event."""
    executions = counted_executions(monkeypatch)
    async with (
        served(Settings(database_url=database_url)) as (app, address),
        http_api(address) as api,
    ):
        s = await Scene.start(api, fleet)
        pool_id = (await s.pool())["id"]
        viewers = [await fleet.caller("acme", "viewer") for _ in range(4)]
        plan = [(LIGHT, viewers[0]), (LIGHT, viewers[1]), (LIGHT, viewers[2]), (OTHER, s.token)]
        plan += [(WITH_POOL, viewers[3]), (WITH_POOL, s.token)]
        streams = await live_streams(app, address, plan)
        capacity: Capacity = app.state.capacity
        await emit_updates(capacity, pool_id, "acme", 1)
        received = [await stream.next() for stream in streams]
        for stream in streams:
            await stream.close()

    cursor = received[0]["cursor"]
    assert [(e["cursor"], e["type"], e["data"]) for e in received] == [
        (cursor, "pool.updated", {"n": 0})
    ] * 6
    assert "occurredAt" in received[3] and "occurredAt" not in received[0]
    assert [e["pool"] for e in received[4:]] == [{"id": pool_id, "version": 1}] * 2
    # Six deliveries: LIGHT once for its three subscribers, OTHER once, WITH_POOL twice.
    assert executions.count(cursor) == 4


@pytest.mark.fast_path  # schema/executor.py shares the rendering
async def test_subscribers_of_one_view_share_the_execution_that_reads_pool(
    database_url: str, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pool` is read once per event and view, and with the same document and variables
    the subscribers of one view share the execution that awaits that read too: three
    sockets of one viewer and two of another caller with the same role (one view), and
    the owner's admin (another view), cost two executions and two reads per event."""
    executions = counted_executions(monkeypatch)
    async with (
        served(Settings(database_url=database_url)) as (app, address),
        http_api(address) as api,
    ):
        s = await Scene.start(api, fleet)
        pool_id = (await s.pool())["id"]
        viewer, other_viewer = [await fleet.caller("acme", "viewer") for _ in range(2)]
        tokens = [viewer] * 3 + [other_viewer] * 2 + [s.token]
        streams = await live_streams(app, address, [(WITH_POOL, token) for token in tokens])
        capacity: Capacity = app.state.capacity
        reads = capacity.event_reads.reads
        await emit_updates(capacity, pool_id, "acme", 2)
        received = [[await stream.next() for _ in range(2)] for stream in streams]
        for stream in streams:
            await stream.close()
        made = capacity.event_reads.reads - reads

    cursors = [e["cursor"] for e in received[0]]
    for got in received:
        assert [e["cursor"] for e in got] == cursors
        assert [e["pool"] for e in got] == [{"id": pool_id, "version": 1}] * 2
    assert [executions.count(c) for c in cursors] == [2, 2]
    assert made == 4


@pytest.mark.fast_path  # app/websocket_protocol.py writes a turn's frames at once
async def test_a_backlog_leaves_in_a_few_writes(
    database_url: str, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A subscriber handed 100 events at once gets them in a handful of socket writes,
    not one system call per event; all of them, in order."""
    port = 0
    server_writes: list[int] = []
    write = _SelectorSocketTransport.write

    def counted(self: Any, data: Any) -> None:
        if self.get_extra_info("sockname")[1] == port:
            server_writes.append(len(data))
        write(self, data)

    monkeypatch.setattr(_SelectorSocketTransport, "write", counted)
    async with (
        served(Settings(database_url=database_url)) as (app, address),
        http_api(address) as api,
    ):
        port = int(address.rsplit(":", 1)[1])
        s = await Scene.start(api, fleet)
        pool_id = (await s.pool())["id"]
        stream = Stream(ws_client(address, s.token, PROTOCOL), LIGHT, tenantId="acme")
        await subscribed(app, 1)
        await asyncio.sleep(0)
        server_writes.clear()
        await emit_updates(app.state.capacity, pool_id, "acme", 100)
        received = [await stream.next() for _ in range(100)]
        await stream.close()

    assert [e["data"]["n"] for e in received] == list(range(100))
    assert len(server_writes) <= 10, server_writes


@pytest.mark.parametrize("dialect", ["postgresql"])
async def test_the_relay_reads_the_outbox_without_a_transaction(
    app: Starlette, api: Api, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL a wake-up costs the relay its reads only, no BEGIN and ROLLBACK
    (counted in the relay's own task) while it delivers five events."""
    s = await Scene.start(api, fleet)
    pool_id = (await s.pool())["id"]
    relay: Relay = app.state.relay
    capacity: Capacity = app.state.capacity
    collector = await subscribe(app, s.token, "acme")
    begun: list[str] = []
    begin = AsyncAdapt_asyncpg_connection._start_transaction

    async def counted(self: AsyncAdapt_asyncpg_connection) -> None:
        task = asyncio.current_task()
        if self.isolation_level != "autocommit":  # else the driver sends no BEGIN
            begun.append(task.get_name() if task is not None else "")
        await begin(self)

    monkeypatch.setattr(AsyncAdapt_asyncpg_connection, "_start_transaction", counted)
    for n in range(5):
        await emit_updates(capacity, pool_id, "acme", 1, start=n)
        await settle(app, collector)  # one wake-up and drain per event
    await collector.close()
    assert [e.data["n"] for e in collector.events] == list(range(5))
    assert relay.cursor == collector.positions[-1]
    assert begun
    # Behind PgBouncer's transaction pooling only a transaction keeps a prepared statement
    # on the server connection that prepared it: there the relay reads in one.
    assert ("event-relay" in begun) == capacity.db.pooled_by_transaction
