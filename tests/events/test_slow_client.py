"""A client that stops reading while 100,000 events flow, against a real server process:
the server's memory stays bounded, the stalled client is closed with 4413 (it gets what
was already in its socket first, with no gap), it resumes from its last cursor with
nothing lost or repeated, and a client reading alongside receives everything."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from app.capacity.service import Capacity
from app.db.engine import Database
from app.events.bus import EventBus
from app.events.outbox import PendingEvent
from tests.events.processes import Served, bettercompute_serve
from tests.events.support import wait_until
from tests.rest.scene import Scene
from tests.support import Api, Fleet

EVENTS = 100_000
PER_TRANSACTION = 1000
DOCUMENT = (
    'subscription($after: String) { poolEvents(tenantId: "acme", after: $after) { cursor data } }'
)
# Bounded mailboxes keep the growth to a few MiB; holding the stalled client's events
# (a mailbox without a bound) takes about 60 MiB more.
MAX_GROWTH_MIB = 32


async def open_stream(
    address: str, token: str, after: str | None = None, *, small_buffer: bool = False
) -> ClientConnection:
    sock = None
    if small_buffer:  # so that a client that stops reading soon fills the server's socket
        host, port = address.split(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    ws = await connect(
        f"ws://{address}/graphql",
        subprotocols=["graphql-transport-ws"],  # type: ignore[list-item]
        sock=sock,
    )
    init = {"type": "connection_init", "payload": {"authorization": f"Bearer {token}"}}
    await ws.send(orjson.dumps(init).decode())
    assert orjson.loads(await ws.recv())["type"] == "connection_ack"
    payload = {"query": DOCUMENT, "variables": {"after": after}}
    await ws.send(orjson.dumps({"id": "1", "type": "subscribe", "payload": payload}).decode())
    return ws


def event_of(raw: str | bytes) -> dict[str, Any] | None:
    message = orjson.loads(raw)
    if message["type"] != "next":
        return None
    event: dict[str, Any] = message["payload"]["data"]["poolEvents"]
    return event


async def read_all(ws: ClientConnection, into: list[int], cursors: list[str]) -> int | None:
    """Read until the server closes; returns its close code."""
    try:
        async for raw in ws:
            event = event_of(raw)
            if event is not None:
                into.append(event["data"]["n"])
                cursors.append(event["cursor"])
    except ConnectionClosed:
        pass
    return ws.close_code


async def flood(capacity: Capacity, pool_id: str) -> None:
    for start in range(0, EVENTS, PER_TRANSACTION):
        async with capacity.unit_of_work() as uow:
            for n in range(start, start + PER_TRANSACTION):
                uow.emit(
                    PendingEvent("pool.updated", pool_id, "acme", {"n": n}, frozenset({"acme"}))
                )


@pytest.mark.parametrize("dialect", ["postgresql"])  # as production runs several processes
async def test_a_client_that_stops_reading_is_closed_and_memory_stays_bounded(
    database_url: str, db: Database, redis_url: str
) -> None:
    fleet = Fleet(db)
    bus = EventBus(redis_url)
    await bus.connect()
    capacity = Capacity(db, bus.notify)
    env = {"BETTERCOMPUTE_DATABASE_URL": database_url, "BETTERCOMPUTE_BROADCAST_URL": redis_url}
    try:
        async with bettercompute_serve(**env) as server:
            await _run(server, fleet, capacity)
    finally:
        await bus.disconnect()


async def _run(server: Served, fleet: Fleet, capacity: Capacity) -> None:
    async with httpx.AsyncClient(base_url=f"http://{server.address}") as client:
        s = await Scene.start(Api(client), fleet)
        pool_id = (await s.pool())["id"]
    healthy_ns: list[int] = []
    healthy_cursors: list[str] = []
    healthy = await open_stream(server.address, s.token)
    reading = asyncio.create_task(read_all(healthy, healthy_ns, healthy_cursors))
    stalled = await open_stream(server.address, s.token, small_buffer=True)  # not read, for now
    await asyncio.sleep(0.5)
    before = server.rss_kib()
    peak = before

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, server.rss_kib())
            await asyncio.sleep(0.2)

    sampling = asyncio.create_task(sample())
    started = time.monotonic()
    await flood(capacity, pool_id)
    flooded = time.monotonic() - started
    await wait_until(lambda: len(healthy_ns) >= EVENTS, within_s=120)
    behind = time.monotonic() - started - flooded
    # The stalled subscription is let go once its socket has been full for 8 s (default).
    await wait_until(lambda: "evicting a subscription" in server.output(), within_s=30)
    evicted = time.monotonic() - started
    sampling.cancel()
    print(
        f"\n{EVENTS} events committed in {flooded:.1f} s, all received by the reading client "
        f"{behind:.1f} s after the last commit; stalled client evicted {evicted:.1f} s after "
        f"the flood began; server RSS {before / 1024:.0f} MiB, peak {peak / 1024:.0f} MiB"
    )
    assert healthy_ns == list(range(EVENTS))  # the reading client lost nothing
    assert (peak - before) / 1024 < MAX_GROWTH_MIB

    # The stalled client reads again: what its socket held, in order, then 4413.
    got: list[int] = []
    cursors: list[str] = []
    assert await read_all(stalled, got, cursors) == 4413
    assert got == list(range(len(got)))
    # Resuming after its last cursor gives exactly the rest.
    resumed = await open_stream(server.address, s.token, after=cursors[-1] if cursors else None)
    rest: list[int] = []
    finishing = asyncio.create_task(read_all(resumed, rest, []))
    await wait_until(lambda: len(got) + len(rest) >= EVENTS, within_s=120)
    await asyncio.sleep(0.2)
    assert got + rest == list(range(EVENTS))
    for ws in (resumed, healthy):
        await ws.close()
    await asyncio.gather(finishing, reading)
