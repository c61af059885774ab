"""A client that stops reading while events flow (full size, `soak`: 100,000 small events;
the default run: 10,000 events of about 1 KiB, enough to fill the sockets), against a real
server process:
the server's memory stays bounded, the stalled client is closed with 4413 (it gets what
was already in its socket first, with no gap), it resumes from its last cursor with
nothing lost or repeated, and a client reading alongside receives everything."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from app.capacity.service import Capacity
from app.db.engine import Database
from app.events.bus import EventBus
from app.events.cursor import encode_cursor
from app.events.outbox import PendingEvent
from app.events.reader import outbox_bounds
from tests.events.processes import Served, bettercompute_serve
from tests.events.support import visible_outbox, wait_until
from tests.rest.scene import Scene
from tests.support import Api, Fleet


@dataclass(frozen=True)
class Size:
    events: int
    padding: int  # bytes of filler per event, so fewer events fill the sockets


SIZES = {"default": Size(10_000, 1000), "full": Size(100_000, 0)}
PER_TRANSACTION = 1000
# Deadlines bound a hang, not the speed: a busy machine may be many times slower.
WAIT_S = 300
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
    # No client pings: once the server has closed, a pong or ping from a client that reads
    # late would be answered with a reset, which drops what its socket still holds.
    ws = await connect(
        f"ws://{address}/graphql",
        subprotocols=["graphql-transport-ws"],  # type: ignore[list-item]
        sock=sock,
        ping_interval=None,
        open_timeout=WAIT_S,
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


async def flood(size: Size, capacity: Capacity, pool_id: str) -> None:
    filler = {"filler": "x" * size.padding} if size.padding else {}
    for start in range(0, size.events, PER_TRANSACTION):
        async with capacity.unit_of_work() as uow:
            assert await uow.lock_pool(pool_id)  # as the domain's writes lock it
            for n in range(start, start + PER_TRANSACTION):
                data = {"n": n, **filler}
                uow.emit(PendingEvent("pool.updated", pool_id, "acme", data, frozenset({"acme"})))


@asynccontextmanager
async def peak_rss(server: Served) -> AsyncIterator[list[int]]:
    """Samples the server's resident memory while the block runs; yields [peak KiB]. The
    sampler is stopped however the block ends, before the server can exit under it."""
    peak = [server.rss_kib()]

    async def sample() -> None:
        while True:
            try:
                peak[0] = max(peak[0], server.rss_kib())
            except FileNotFoundError:  # the server has exited: the test reports why
                return
            await asyncio.sleep(0.2)

    sampling = asyncio.create_task(sample())
    try:
        yield peak
    finally:
        sampling.cancel()
        await asyncio.gather(sampling, return_exceptions=True)


@pytest.mark.parametrize("dialect", ["postgresql"])  # as production runs several processes
@pytest.mark.parametrize("size", ["default", pytest.param("full", marks=pytest.mark.soak)])
async def test_a_client_that_stops_reading_is_closed_and_memory_stays_bounded(
    database_url: str, db: Database, redis_url: str, size: str
) -> None:
    fleet = Fleet(db)
    bus = EventBus(redis_url)
    await bus.connect()
    capacity = Capacity(db, bus.notify)
    env = {
        "BETTERCOMPUTE_DATABASE_URL": database_url,
        "BETTERCOMPUTE_BROADCAST_URL": redis_url,
        # No server pings either: the stalled client would answer them late (see above).
        "BETTERCOMPUTE_KEEPALIVE_SECONDS": "3600",
    }
    try:
        async with bettercompute_serve(**env) as server:
            await _run(SIZES[size], server, fleet, capacity)
    finally:
        await bus.disconnect()


async def _run(size: Size, server: Served, fleet: Fleet, capacity: Capacity) -> None:
    events = size.events
    async with httpx.AsyncClient(base_url=f"http://{server.address}") as client:
        s = await Scene.start(Api(client), fleet)
        pool_id = (await s.pool())["id"]
    healthy_ns: list[int] = []
    healthy_cursors: list[str] = []
    # Both resume after the same cursor, so neither misses the first events however long
    # the server takes to start their subscriptions.
    # Else "newest" may be short of the last commit.
    async with visible_outbox(capacity.db) as conn:
        start = encode_cursor((await outbox_bounds(conn)).newest)
    healthy = await open_stream(server.address, s.token, after=start)
    reading = asyncio.create_task(read_all(healthy, healthy_ns, healthy_cursors))
    # Not read, for now.
    stalled = await open_stream(server.address, s.token, after=start, small_buffer=True)
    await asyncio.sleep(0.5)  # let the server's memory settle before the baseline
    before = server.rss_kib()
    async with peak_rss(server) as sampled:
        started = time.monotonic()
        await flood(size, capacity, pool_id)
        flooded = time.monotonic() - started
        await wait_until(lambda: len(healthy_ns) >= events, within_s=WAIT_S)
        behind = time.monotonic() - started - flooded
        # The stalled subscription is let go once its socket has been full for 8 s (default).
        await wait_until(lambda: "evicting a subscription" in server.output(), within_s=WAIT_S)
        evicted = time.monotonic() - started
    peak = sampled[0]
    print(
        f"\n{events} events committed in {flooded:.1f} s, all received by the reading client "
        f"{behind:.1f} s after the last commit; stalled client evicted {evicted:.1f} s after "
        f"the flood began; server RSS {before / 1024:.0f} MiB, peak {peak / 1024:.0f} MiB"
    )
    assert healthy_ns == list(range(events))  # the reading client lost nothing
    assert (peak - before) / 1024 < MAX_GROWTH_MIB

    # The stalled client reads again: what its socket held, in order, then 4413.
    got: list[int] = []
    cursors: list[str] = []
    assert await read_all(stalled, got, cursors) == 4413
    assert got == list(range(len(got)))
    # Resuming after its last cursor gives exactly the rest.
    resumed = await open_stream(server.address, s.token, after=cursors[-1] if cursors else start)
    rest: list[int] = []
    finishing = asyncio.create_task(read_all(resumed, rest, []))
    await wait_until(lambda: len(got) + len(rest) >= events, within_s=WAIT_S)
    await asyncio.sleep(0.2)
    assert got + rest == list(range(events))
    for ws in (resumed, healthy):
        await ws.close()
    await asyncio.gather(finishing, reading)
