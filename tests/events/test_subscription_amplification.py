"""A caller cannot multiply the database work of every event (issue 19, item 2), through
a real uvicorn server and raw websocket clients:

- the pool an event shows is read once per event and view (tenant, role, `--where`), not
  once per subscription: N subscribers over V views cost V reads per event;
- subscriptions are bounded per caller and per tenant: one past a bound gets an `error`
  for its operation id with RESOURCE_EXHAUSTED, the socket stays open (both protocols);
- while the fan-out's reads wait (a lock held on the quota rows), a client that reads is
  not closed with 4413, the fan-out holds no more connections than its gate, and another
  tenant's events and the process's own reads go on meanwhile.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx
import orjson
import pytest
from sqlalchemy import text
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from app.capacity import pool_reads
from app.capacity.service import Capacity
from app.config import Settings
from app.db.engine import Database, create_database
from app.events.outbox import PendingEvent
from tests.events.conftest import served
from tests.events.support import emit_updates, wait_until
from tests.events.test_token_revocation import (
    BOTH,
    LEGACY_WS,
    TRANSPORT_WS,
    initialised,
    operation,
)
from tests.events.test_websocket import http_api
from tests.rest.scene import Scene
from tests.support import Fleet

WITH_POOL = """subscription {
  poolEvents(tenantId: "acme") { cursor type data pool { id version quotas { resource max } } }
}"""
LIGHT = "subscription($t: String!) { poolEvents(tenantId: $t) { cursor type data } }"
VERSION = 'query($p: ID!) { pool(tenantId: "acme", poolId: $p) { version } }'
WAIT_S = 60.0


class Socket:
    """A raw websocket whose messages are read in the background, by operation id."""

    def __init__(self, ws: ClientConnection, protocol: str) -> None:
        self.ws = ws
        self.protocol = protocol
        self.messages: list[dict[str, Any]] = []
        self.close_code: int | None = None
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                message = orjson.loads(raw)
                if message["type"] not in ("ka", "ping", "pong"):
                    self.messages.append(message)
        except ConnectionClosed as closed:
            self.close_code = closed.rcvd.code if closed.rcvd else None
        else:
            self.close_code = self.ws.close_code

    async def start(self, operation_id: str, query: str, **variables: Any) -> None:
        message = operation(self.protocol, operation_id, query, **variables)
        await self.ws.send(orjson.dumps(message).decode())

    async def stop(self, operation_id: str) -> None:
        kind = "complete" if self.protocol == TRANSPORT_WS else "stop"
        await self.ws.send(orjson.dumps({"id": operation_id, "type": kind}).decode())

    def of(self, operation_id: str, kind: str | None = None) -> list[dict[str, Any]]:
        return [
            m
            for m in self.messages
            if m.get("id") == operation_id and (kind is None or m["type"] == kind)
        ]

    def events(self, operation_id: str) -> list[dict[str, Any]]:
        return [
            m["payload"]["data"]["poolEvents"]
            for m in self.messages
            if m.get("id") == operation_id and m["type"] in ("next", "data")
        ]

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


@asynccontextmanager
async def sockets(address: str, protocol: str, *tokens: str) -> AsyncIterator[list[Socket]]:
    async with AsyncExitStack() as stack:
        opened = []
        for token in tokens:
            ws = await stack.enter_async_context(initialised(address, protocol, token))
            opened.append(Socket(ws, protocol))
        try:
            yield opened
        finally:
            for socket in opened:
                await socket.close()


def count_pool_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A spy on the domain's pool read (the real one runs): the pool ids read."""
    reads: list[str] = []
    real = pool_reads.get_pool

    async def counted(executor: Any, principal: Any, inp: Any, parts: Any) -> Any:
        reads.append(inp.pool_id)
        return await real(executor, principal, inp, parts)

    monkeypatch.setattr(pool_reads, "get_pool", counted)
    return reads


def delivered(ids: list[tuple[Socket, str]], count: int) -> bool:
    return all(len(socket.events(i)) >= count for socket, i in ids)


# --- one read per event and view -----------------------------------------------------------


async def test_the_pool_an_event_shows_is_read_once_per_view(
    database_url: str, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = count_pool_reads(monkeypatch)
    async with (
        served(Settings(database_url=database_url)) as (app, address),
        http_api(address) as api,
    ):
        s = await Scene.start(api, fleet)
        pool_id = (await s.pool())["id"]
        viewers = [await fleet.caller("acme", "viewer") for _ in range(2)]
        narrowed = await fleet.caller("acme", "viewer", **{"class": "metal-host"})
        # Seven subscriptions over three views: plain viewers (two callers, five
        # subscriptions), the admin (one), a viewer narrowed by class (one).
        plan = [(viewers[0], 3), (viewers[1], 2), (s.token, 1), (narrowed, 1)]
        async with sockets(address, TRANSPORT_WS, *(t for t, _ in plan)) as opened:
            ids = []
            for socket, (_, count) in zip(opened, plan, strict=True):
                for n in range(count):
                    await socket.start(str(n), WITH_POOL)
                    ids.append((socket, str(n)))
            # Live, not only attached: a subscription still replaying reads its own pools.
            await wait_until(lambda: app.state.relay.live_subscriptions >= len(ids), WAIT_S)
            capacity: Capacity = app.state.capacity
            reads.clear()
            made, compiled = capacity.event_reads.reads, capacity.event_reads.compiled
            for n in range(3):
                await emit_updates(capacity, pool_id, "acme", 1, start=n)
                await wait_until(lambda count=n + 1: delivered(ids, count), WAIT_S)
            made = capacity.event_reads.reads - made
            compiled = capacity.event_reads.compiled - compiled

    for socket, operation_id in ids:
        shown = socket.events(operation_id)
        assert [e["data"]["n"] for e in shown] == [0, 1, 2]
        assert [e["pool"]["id"] for e in shown] == [pool_id] * 3
    # Three events, three views: nine reads, not 3 x 7; each either Query.pool's compiled
    # statement (where reads compile: not for the narrowed view) or the plain read.
    assert made == 9
    assert reads == [pool_id] * (9 - compiled)
    if app.state.settings.compiled_reads and app.state.settings.fast_executor:
        assert compiled == 6


# --- bounds per caller and per tenant ------------------------------------------------------


@pytest.mark.parametrize("protocol", BOTH)
async def test_subscriptions_are_bounded_per_caller_and_per_tenant(
    database_url: str, fleet: Fleet, protocol: str
) -> None:
    settings = Settings(
        database_url=database_url, max_subscriptions_per_caller=3, max_subscriptions_per_tenant=5
    )
    async with served(settings) as (app, address), http_api(address) as api:
        s = await Scene.start(api, fleet)
        pool_id = (await s.pool())["id"]
        other = await fleet.caller("acme", "viewer")
        relay = app.state.relay
        async with sockets(address, protocol, s.token, s.token, other) as (a1, a2, b):
            for n in range(2):
                await a1.start(f"a{n}", LIGHT, t="acme")
            await a2.start("a2", LIGHT, t="acme")  # the caller's third, on another socket
            await wait_until(lambda: relay.subscriptions >= 3, WAIT_S)
            await a2.start("a3", LIGHT, t="acme")  # its fourth: refused
            await wait_until(lambda: bool(a2.of("a3")), WAIT_S)
            [refused] = a2.of("a3")
            errors = refused["payload"] if protocol == TRANSPORT_WS else [refused["payload"]]
            assert refused["type"] == "error", refused
            assert errors[0]["extensions"] == {
                "code": "RESOURCE_EXHAUSTED",
                "limit": "subscriptionsPerCaller",
            }
            # Another caller of the tenant: two more fit the tenant's five, then no more.
            for n in range(2):
                await b.start(f"b{n}", LIGHT, t="acme")
            await wait_until(lambda: relay.subscriptions >= 5, WAIT_S)
            await b.start("b2", LIGHT, t="acme")
            await wait_until(lambda: bool(b.of("b2")), WAIT_S)
            [refused] = b.of("b2")
            errors = refused["payload"] if protocol == TRANSPORT_WS else [refused["payload"]]
            assert errors[0]["extensions"]["limit"] == "subscriptionsPerTenant"

            if protocol == TRANSPORT_WS:  # a query over the socket holds no slot
                await a2.start("q", VERSION, p=pool_id)
                await wait_until(lambda: bool(a2.of("q", "complete")), WAIT_S)
                assert a2.of("q", "next")[0]["payload"] == {"data": {"pool": {"version": 1}}}
            # A subscription that ends gives its slot back.
            await a1.stop("a0")
            await wait_until(lambda: relay.subscriptions == 4, WAIT_S)
            await a2.start("a4", LIGHT, t="acme")
            await wait_until(lambda: relay.subscriptions == 5, WAIT_S)
            # Every socket stayed open, and every subscription it holds streams.
            await emit_updates(app.state.capacity, pool_id, "acme", 1)
            live = [(a1, "a1"), (a2, "a2"), (a2, "a4"), (b, "b0"), (b, "b1")]
            await wait_until(lambda: all(sock.events(i) for sock, i in live), WAIT_S)
            assert [sock.close_code for sock in (a1, a2, b)] == [None] * 3
            assert not a2.of("a3", "next") and not b.of("b2", "next")


# --- while the fan-out's reads wait ---------------------------------------------------------

ROLES = ("viewer", "operator", "admin")
GATE = 2  # the fan-out's reads at once (event_pool_reads)
# The relay's usage round (pool.usage, docs/decisions/0012) reads quota rows too: one task,
# one statement at a time, so at most one more session waits on their lock.
USAGE_ROUND = 1
STALL_S = 1.0
CONDITIONS = {"class": "metal-host", "owned": "true", "gpuModel": "H100"}


@asynccontextmanager
async def quota_rows_locked(database_url: str) -> AsyncIterator[None]:
    """Every read of quota rows waits while the block runs (an ACCESS EXCLUSIVE lock in a
    transaction of another engine); of the relay's own reads only its usage round, one
    statement at a time, touches them."""
    other = create_database(database_url, Settings(db_statement_timeout_s=120))
    try:
        async with other.writer.begin() as conn:
            await conn.execute(text("LOCK TABLE quota_rows IN ACCESS EXCLUSIVE MODE"))
            yield
    finally:
        await other.dispose()


@asynccontextmanager
async def update_committed_under_quota_lock(
    capacity: Capacity, database_url: str, pool_id: str
) -> AsyncIterator[None]:
    """Hold quota_rows_locked, with one pool.updated for `pool_id` (tenant acme) committed
    while it is held but deliverable: delivery waits for the oldest running write
    (docs/decisions/0012), and the lock's transaction is one, so the event's transaction
    takes its id (the pool's lock) before the lock's transaction takes one."""
    async with AsyncExitStack() as stack:
        uow = await stack.enter_async_context(capacity.unit_of_work())
        assert await uow.lock_pool(pool_id)  # its transaction id, older than the lock's
        uow.emit(
            PendingEvent(
                type="pool.updated",
                pool_id=pool_id,
                tenant_id="acme",
                data={"n": 0},
                audience=frozenset({"acme"}),
            )
        )
        locked = quota_rows_locked(database_url)
        await locked.__aenter__()
        try:
            await stack.aclose()  # commits the event, the quota rows still locked
            yield
        except BaseException as exc:
            await locked.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        await locked.__aexit__(None, None, None)


async def waiting_on_locks(db: Database) -> int:
    async with db.reader.connect() as conn:
        waiting = await conn.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
        )
        return int(waiting or 0)


@pytest.mark.parametrize("dialect", ["postgresql"])  # the lock that makes the reads wait
async def test_a_reading_client_is_not_closed_while_the_fan_out_waits_for_its_reads(
    database_url: str, db: Database, fleet: Fleet
) -> None:
    settings = Settings(
        database_url=database_url,
        subscriber_stall_timeout_s=STALL_S,  # the reads below wait far longer than this
        db_pool_size=4,
        db_max_overflow=2,
        db_direct_pool_size=0,  # every read of the process through the one pool
        db_statement_timeout_s=120,
        event_pool_reads=GATE,
    )
    async with served(settings) as (app, address), http_api(address) as api:
        s = await Scene.start(api, fleet)
        pool_id = (await s.pool(gpuModel="H100"))["id"]
        # 24 views (3 roles x 8 narrowings that all match the pool), one caller each.
        tokens = []
        for role, size in itertools.product(ROLES, range(4)):
            for keys in itertools.combinations(CONDITIONS, size):
                tokens.append(await fleet.caller("acme", role, **{k: CONDITIONS[k] for k in keys}))
        g = await Scene.start(api, fleet, owner="globex")
        globex_pool = (await g.pool())["id"]
        relay = app.state.relay
        async with (
            sockets(address, TRANSPORT_WS, *tokens) as readers,
            sockets(address, LEGACY_WS, g.token) as (bystander,),
        ):
            for reader in readers:
                await reader.start("1", WITH_POOL)
            await bystander.start("1", LIGHT, t="globex")
            await wait_until(lambda: relay.subscriptions >= len(tokens) + 1, WAIT_S)
            capacity: Capacity = app.state.capacity
            async with update_committed_under_quota_lock(capacity, database_url, pool_id):
                # The fan-out's reads queue behind the lock: no more of them hold a
                # connection than its gate lets through, for longer than the stall timeout.
                loop = asyncio.get_running_loop()
                most = await waiting_on_locks(db)
                started = loop.time()
                while most == 0:
                    assert loop.time() - started < WAIT_S, "no fan-out read waited on the lock"
                    await asyncio.sleep(0.05)
                    most = await waiting_on_locks(db)
                deadline = loop.time() + 3 * STALL_S
                while loop.time() < deadline:
                    most = max(most, await waiting_on_locks(db))
                    await asyncio.sleep(0.1)
                assert most <= GATE + USAGE_ROUND, most
                # ...so the process's reads and writes go on meanwhile. (Another tenant's
                # event commits, but no event is delivered while the lock's transaction,
                # which holds a transaction id, is open: delivery waits for the oldest
                # running write, docs/decisions/0012.)
                await emit_updates(capacity, globex_pool, "globex", 1)
                async with httpx.AsyncClient(base_url=f"http://{address}") as client:
                    ready = await client.get("/readyz", timeout=WAIT_S)
                assert ready.status_code == 200, ready.text
                assert not any(r.events("1") for r in readers)  # still waiting for the lock
            # The lock gone, every reader gets its event, and none was closed as too slow.
            await wait_until(lambda: bool(bystander.events("1")), WAIT_S)
            await wait_until(lambda: all(r.events("1") or r.close_code for r in readers), WAIT_S)
            assert [r.close_code for r in readers] == [None] * len(readers)  # no 4413
            for reader in readers:
                assert reader.events("1")[0]["pool"]["id"] == pool_id
