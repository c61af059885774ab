"""The processes `bench.events_fanout` drives: websocket clients and the event writer.

Each runs its own event loop (uvloop, as the server does) in its own process, so the
server, the writer and the clients never share a core's time slice in one interpreter,
and each one's CPU can be read on its own. The orchestrator talks to each over a pipe,
one command at a time: `(name, argument)` in, one answer out.
"""

from __future__ import annotations

import asyncio
import time
from multiprocessing.connection import Connection
from typing import Any

import orjson
import uvloop
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosedError

from app.db.engine import create_database
from app.db.uow import UnitOfWork
from app.events.bus import EventBus
from app.events.cursor import START, Position, decode_cursor
from app.events.outbox import PendingEvent

SUBSCRIPTION = (
    "subscription($t: String!) { poolEvents(tenantId: $t) { cursor type poolId occurredAt } }"
)
# The rich shape: the event's data and the pool as the subscriber's view sees it now.
RICH_SUBSCRIPTION = (
    "subscription($t: String!) { poolEvents(tenantId: $t) { cursor type poolId occurredAt "
    "data pool { id version quotas { resource max used } "
    "capacity { resource total allocatable booked available } } } }"
)
SHAPES = {"cheap": SUBSCRIPTION, "rich": RICH_SUBSCRIPTION}
TRY_AGAIN_LATER = 1013


class Failed:
    """A worker's answer when its command raised: the orchestrator raises it again
    (a writer that died mid-command used to leave the run waiting forever)."""

    def __init__(self, error: BaseException) -> None:
        self.message = f"{type(error).__name__}: {error}"


async def _commands(conn: Connection) -> Any:
    """The next command, read without blocking the loop (a pipe read in a thread)."""
    return await asyncio.get_running_loop().run_in_executor(None, conn.recv)


# --- clients --------------------------------------------------------------------------


async def open_subscriptions(
    address: str,
    token: str,
    tenant: str,
    subscriptions: int,
    query: str = SUBSCRIPTION,
    **options: Any,
) -> ClientConnection:
    """A graphql-transport-ws socket, acknowledged, with `subscriptions` poolEvents
    subscriptions of `tenant` (ids "0", "1", ...). A server that could not reach its
    database in time (1013, try again later: a busy shared machine) is asked again."""
    for attempt in range(20):
        try:
            return await _open_once(address, token, tenant, subscriptions, query, **options)
        except ConnectionClosedError as exc:
            if exc.rcvd is None or exc.rcvd.code != TRY_AGAIN_LATER or attempt == 19:
                raise
            await asyncio.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


async def _open_once(
    address: str, token: str, tenant: str, subscriptions: int, query: str, **options: Any
) -> ClientConnection:
    ws = await connect(
        f"ws://{address}/graphql",
        subprotocols=["graphql-transport-ws"],  # type: ignore[list-item]
        max_queue=None,
        **options,
    )
    init = {"type": "connection_init", "payload": {"authorization": f"Bearer {token}"}}
    await ws.send(orjson.dumps(init).decode())
    ack = orjson.loads(await ws.recv())
    assert ack["type"] == "connection_ack", ack
    for n in range(subscriptions):
        await ws.send(subscribe_message(str(n), query, tenant))
    return ws


def subscribe_message(operation_id: str, query: str, tenant: str) -> str:
    payload = {"query": query, "variables": {"t": tenant}}
    return orjson.dumps({"id": operation_id, "type": "subscribe", "payload": payload}).decode()


def unavailable(message: dict[str, Any]) -> bool:
    """A subscription refused because the server could not reach its database in time:
    an `error` before it ran, or its result (`next` with errors, then `complete`)."""
    payload = message.get("payload")
    if message.get("type") == "next" and isinstance(payload, dict):
        errors = payload.get("errors")
    else:
        errors = payload if message.get("type") == "error" else None
    return isinstance(errors, list) and any(
        (e.get("extensions") or {}).get("code") == "UNAVAILABLE" for e in errors
    )


class Socket:
    """One websocket with `subscriptions` poolEvents subscriptions; receipt times by
    (subscription index, seq). A seq received twice by one subscription is counted."""

    floor = START  # positions up to here are ignored (this process's sockets)

    def __init__(self) -> None:
        self.received: list[dict[Position, float]] = []
        self.duplicates = 0
        self.ws: ClientConnection | None = None
        self.task: asyncio.Task[None] | None = None
        self.query, self.tenant = SUBSCRIPTION, ""
        self.retrying: set[str] = set()

    async def open(
        self, address: str, token: str, tenant: str, subscriptions: int, shape: str = "cheap"
    ) -> None:
        self.received = [{} for _ in range(subscriptions)]
        self.query, self.tenant = SHAPES[shape], tenant
        self.ws = await open_subscriptions(
            address,
            token,
            tenant,
            subscriptions,
            SHAPES[shape],
            compression=None,
            ping_interval=None,
        )
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.ws is not None
        async for raw in self.ws:
            now = time.time()
            message = orjson.loads(raw)
            # The server's database was out of reach (a busy shared machine): subscribe
            # again, once the id is free (after the `error`, or the `complete` that follows
            # an erroneous result).
            if unavailable(message):
                if message["type"] == "error":
                    await self._again(message["id"])
                else:
                    self.retrying.add(message["id"])
                continue
            if message["type"] == "complete" and message.get("id") in self.retrying:
                self.retrying.discard(message["id"])
                await self._again(message["id"])
                continue
            if (
                message["type"] != "next"
                or not message["payload"].get("data")
                or message["payload"].get("errors")
            ):
                print(f"bench client: unexpected message {message}", flush=True)
                continue
            seq = decode_cursor(message["payload"]["data"]["poolEvents"]["cursor"])
            if seq <= Socket.floor:
                continue  # a warm-up probe, not part of what is measured
            got = self.received[int(message["id"])]
            if seq in got:
                self.duplicates += 1
            got[seq] = now

    async def _again(self, operation_id: str) -> None:
        assert self.ws is not None
        await asyncio.sleep(0.2)
        await self.ws.send(subscribe_message(operation_id, self.query, self.tenant))

    def count(self) -> int:
        return sum(len(r) for r in self.received)

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if self.ws is not None:
            await self.ws.close()


async def _clients(conn: Connection, address: str) -> None:
    sockets: list[Socket] = []
    while True:
        command, argument = await _commands(conn)
        if command == "open":  # [(token, tenant, subscriptions per socket, shape)], at a time
            plan, at_a_time = argument
            opened = [Socket() for _ in plan]
            for start in range(0, len(opened), at_a_time):
                await asyncio.gather(
                    *(
                        s.open(address, *plan[i])
                        for i, s in enumerate(opened)
                        if start <= i < start + at_a_time
                    )
                )
            sockets += opened
            conn.send(sum(len(s.received) for s in opened))
        elif command == "count":
            conn.send(sum(s.count() for s in sockets))
        elif command == "ready":  # subscriptions that have received something
            conn.send(sum(1 for s in sockets for got in s.received if got))
        elif command == "floor":  # ignore seqs up to here from now on, forget them
            Socket.floor = argument
            for s in sockets:
                s.received = [{} for _ in s.received]
                s.duplicates = 0
            conn.send(None)
        elif command == "receipts":  # and forget them
            receipts = [got for s in sockets for got in s.received]
            duplicates = sum(s.duplicates for s in sockets)
            for s in sockets:
                s.received = [{} for _ in s.received]
                s.duplicates = 0
            conn.send((receipts, duplicates))
        elif command == "close":
            for s in sockets:
                await s.close()
            sockets = []
            conn.send(None)
        elif command == "stop":
            conn.send(None)
            return


def clients_main(conn: Connection, address: str) -> None:
    uvloop.run(_clients(conn, address))


# --- the writer -----------------------------------------------------------------------


class Writer:
    """Commits `pool.updated` events through the real unit of work, outbox and broker
    wake-up; records each seq's commit time (when the transaction returned)."""

    def __init__(self, database_url: str, redis_url: str) -> None:
        self.db = create_database(database_url)
        self.bus = EventBus(redis_url)
        self.committed: dict[Position, float] = {}
        self.transactions: list[float] = []  # seconds from start to commit, each

    async def emit(
        self, pool_id: str, tenant: str, count: int = 1, audience: frozenset[str] | None = None
    ) -> None:
        began = time.perf_counter()
        to = audience or frozenset({tenant})

        async def committed(newest: Position) -> None:  # after the commit, before the wake-up
            now = time.time()
            self.transactions.append(time.perf_counter() - began)
            for seq in range(newest.seq - count + 1, newest.seq + 1):  # one transaction's
                self.committed[Position(newest.tx, seq)] = now
            await self.bus.notify(newest)

        async with UnitOfWork(self.db, committed) as uow:
            await uow.lock_pool(pool_id)  # as the domain's writes do (app/events/outbox.py)
            for n in range(count):
                uow.emit(PendingEvent("pool.updated", pool_id, tenant, {"n": n}, to))

    async def steady(
        self, targets: list[tuple[str, str]], rate: float, seconds: float
    ) -> dict[str, Any]:
        """`rate` events a second on a fixed schedule, round-robin over (pool, tenant),
        each commit started on time whether or not earlier ones have returned."""
        interval = 1 / rate
        total = int(rate * seconds)
        emitting: set[asyncio.Task[None]] = set()
        start = time.perf_counter()
        behind = 0.0  # how late the schedule ran at worst (the writer's loop was busy)
        for i in range(total):
            pool_id, tenant = targets[i % len(targets)]
            behind = max(behind, time.perf_counter() - (start + i * interval))
            task = asyncio.create_task(self.emit(pool_id, tenant))
            emitting.add(task)
            task.add_done_callback(emitting.discard)
            delay = start + (i + 1) * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        await asyncio.gather(*emitting)
        took = sorted(self.transactions)
        self.transactions = []
        return {
            "events": total,
            "elapsed": time.perf_counter() - start,
            "behind": behind,
            "transaction_p50": took[len(took) // 2],
            "transaction_p99": took[min(len(took) - 1, int(0.99 * len(took)))],
        }


async def _writer(conn: Connection, database_url: str, redis_url: str) -> None:
    writer = Writer(database_url, redis_url)
    await writer.bus.connect()
    try:
        while True:
            command, argument = await _commands(conn)
            try:
                done = await _write(writer, command, argument)
            except Exception as exc:  # answered, so the run stops with it instead of waiting
                conn.send(Failed(exc))
                continue
            conn.send(done)
            if command == "stop":
                return
    finally:
        await writer.bus.disconnect()
        await writer.db.dispose()


async def _write(writer: Writer, command: str, argument: Any) -> Any:
    if command == "steady":  # (targets, rate, seconds)
        return await writer.steady(*argument)
    if command == "each":  # one event for every (pool, tenant), one at a time
        for pool_id, tenant in argument:
            await writer.emit(pool_id, tenant)
        return None
    if command == "sequential":  # (pool, tenant, n): seconds per transaction
        pool_id, tenant, n = argument
        started = time.perf_counter()
        for _ in range(n):
            await writer.emit(pool_id, tenant)
        return (time.perf_counter() - started) / n
    if command == "burst":  # (pool, tenant, events, per transaction[, audience])
        pool_id, tenant, events, per_transaction, *rest = argument
        audience = frozenset(rest[0]) if rest else None
        for _ in range(events // per_transaction):
            await writer.emit(pool_id, tenant, per_transaction, audience)
        return None
    if command == "committed":  # and forget them
        committed, writer.committed = writer.committed, {}
        return committed
    if command == "stop":
        return None
    raise ValueError(f"unknown command {command!r}")


def writer_main(conn: Connection, database_url: str, redis_url: str) -> None:
    uvloop.run(_writer(conn, database_url, redis_url))
