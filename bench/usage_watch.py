"""A `pool.usage` subscriber beside a booking round (bench/writes.py): how many usage
events one pool booked at the service's highest rate sends, how close together, and
whether the last one carries the values `pools/get` answers once the round is over
(CONTRACT section 10: at most one event per pool per BETTERCOMPUTE_USAGE_COALESCE_MS
window, the latest values). It counts and prints; it asserts nothing.

One websocket (graphql-transport-ws, the `websockets` client) as the booking tenant,
subscribed to `pool.usage` of the hot pool only; a handful of events per second, so it
takes little of the cores wrk and the service share.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect

USAGE = """subscription Usage($tenantId: String!, $poolId: ID!) {
  poolEvents(tenantId: $tenantId, poolId: $poolId, types: ["pool.usage"]) { type data }
}"""
SETTLE_S = 10.0  # how long the last event may take to arrive after the round


@dataclass
class UsageSeen:
    arrivals: list[float] = field(default_factory=list)  # monotonic seconds
    last_used: int | None = None  # the booking tenant's gpu `used` in the newest event

    def gaps_ms(self) -> list[float]:
        return [1000 * (b - a) for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]


def _used(data: dict[str, Any], tenant: str) -> int | None:
    for row in data.get("quotas", []):
        if row.get("tenantId") == tenant and row.get("resource") == "gpu":
            return int(row["used"])
    return None


class UsageWatch:
    """`async with UsageWatch(...) as seen:` subscribes before the round starts; `settle`
    after it waits for the event that carries `pools/get`'s values."""

    def __init__(self, base_url: str, token: str, tenant: str, pool_id: str) -> None:
        self._base_url = base_url
        self._token = token
        self._tenant = tenant
        self._pool_id = pool_id
        self.seen = UsageSeen()
        self.window: tuple[float, float] = (0.0, 0.0)  # the round's start and end
        self._socket: ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._arrived = asyncio.Event()

    async def __aenter__(self) -> UsageWatch:
        url = self._base_url.replace("http://", "ws://") + "/graphql"
        self._socket = await connect(url, subprotocols=["graphql-transport-ws"])  # type: ignore[list-item]
        auth = {"authorization": f"Bearer {self._token}"}
        await self._socket.send(json.dumps({"type": "connection_init", "payload": auth}))
        while json.loads(await self._socket.recv())["type"] != "connection_ack":
            pass
        variables = {"tenantId": self._tenant, "poolId": self._pool_id}
        subscribe = {"query": USAGE, "variables": variables}
        await self._socket.send(json.dumps({"id": "1", "type": "subscribe", "payload": subscribe}))
        self._reader = asyncio.create_task(self._read(self._socket))
        return self

    async def _read(self, socket: ClientConnection) -> None:
        async for raw in socket:
            message = json.loads(raw)
            if message.get("type") == "ping":
                await socket.send(json.dumps({"type": "pong"}))
            if message.get("type") == "error":  # refused: say so rather than count nothing
                raise RuntimeError(f"usage subscription refused: {message.get('payload')}")
            if message.get("type") != "next":
                continue
            event = message["payload"]["data"]["poolEvents"]
            self.seen.arrivals.append(time.monotonic())
            self.seen.last_used = _used(event["data"], self._tenant)
            self._arrived.set()

    async def settle(self, client: httpx.AsyncClient, headers: dict[str, str]) -> int:
        """`pools/get`'s gpu `used` for the tenant, once the round is over; waits (at most
        SETTLE_S) for a usage event that carries it."""
        body = {"tenantId": self._tenant, "poolId": self._pool_id}
        answer = await client.post("/api/compute/pools/get", json=body, headers=headers)
        quotas = answer.json()["pool"]["quotas"]
        used = next(int(q["used"]) for q in quotas if q["resource"] == "gpu")
        deadline = time.monotonic() + SETTLE_S
        while True:
            self._arrived.clear()
            left = deadline - time.monotonic()
            if self.seen.last_used == used or left <= 0:
                return used
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), left)

    async def __aexit__(self, *_: object) -> None:
        if self._reader is not None:
            if self._reader.done():
                self._reader.result()  # a refusal or a broken socket is the bench's failure
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._socket is not None:
            await self._socket.close()


def summary(watch: UsageWatch, used: int, window_ms: float) -> str:
    """One line: events during the round against its windows, the closest two, and
    whether the last carried `pools/get`'s values."""
    start, end = watch.window
    during = [t for t in watch.seen.arrivals if start <= t <= end]
    windows = max(1, int((end - start) * 1000 / window_ms))
    gaps = watch.seen.gaps_ms()
    closest = f"{min(gaps):.1f} ms" if gaps else "n/a"
    close = sum(1 for g in gaps if g < window_ms / 2)
    return (
        f"{len(during)} usage events in {end - start:.1f} s ({windows} windows of"
        f" {window_ms:.0f} ms), {len(watch.seen.arrivals)} in all; closest two {closest},"
        f" {close} gaps under half a window; last event's used {watch.seen.last_used}"
        f" against pools/get {used}: {'equal' if watch.seen.last_used == used else 'DIFFERENT'}"
    )
