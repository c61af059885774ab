"""Two real servers over one database for `PoolEvent.pool`: `fast` (every fast mechanism
on: compiled reads, the splicing executor, the lean websocket protocol, shared frames)
and `plain` (BETTERCOMPUTE_FAST_PATH=false: stock strawberry over the domain, the
reference). Raw websocket subscribers on both; the frames compared as the text that came
over the wire (tests/events/test_compiled_event_pool.py, tests/test_event_pool_differential.py)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from websockets.asyncio.client import ClientConnection, connect

from app.capacity.service import Capacity
from app.config import Settings
from app.events.outbox import PendingEvent
from tests.events.conftest import served
from tests.events.support import wait_until

WAIT_S = 20
START = {"graphql-transport-ws": "subscribe", "graphql-ws": "start"}
RESULT = {"graphql-transport-ws": "next", "graphql-ws": "data"}
MARKER = "marker"  # `data` key of the event that ends a run's deliveries


def settings(database_url: str, fast: bool) -> Settings:
    # No allowance per client address (app/http/address_budget.py): many sockets from
    # one address; the outbox read often, for the server whose bus heard no write.
    common: dict[str, Any] = {
        "database_url": database_url,
        "unauthenticated_burst": 0,
        "event_poll_interval_s": 0.05,
    }
    return Settings(**common, fast_path=fast)


@dataclass
class Side:
    name: str
    app: Starlette
    address: str

    @property
    def capacity(self) -> Capacity:
        capacity: Capacity = self.app.state.capacity
        return capacity


@asynccontextmanager
async def two_servers(database_url: str) -> AsyncIterator[tuple[Side, Side]]:
    async with (
        served(settings(database_url, fast=True)) as (fast_app, fast_address),
        served(settings(database_url, fast=False)) as (plain_app, plain_address),
    ):
        yield Side("fast", fast_app, fast_address), Side("plain", plain_app, plain_address)


@asynccontextmanager
async def raw_subscriber(
    address: str,
    token: str,
    protocol: str,
    document: str,
    operation_id: str,
    variables: dict[str, Any],
) -> AsyncIterator[ClientConnection]:
    async with connect(f"ws://{address}/graphql", subprotocols=[protocol]) as ws:  # type: ignore[list-item]
        init = {"type": "connection_init", "payload": {"authorization": f"Bearer {token}"}}
        await ws.send(json.dumps(init))
        while json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))["type"] != "connection_ack":
            pass
        payload = {"query": document, "variables": variables}
        await ws.send(json.dumps({"type": START[protocol], "id": operation_id, "payload": payload}))
        yield ws


@dataclass(frozen=True)
class Subscriber:
    """One subscription, made alike on both servers."""

    name: str
    token: str
    protocol: str
    document: str
    variables: dict[str, Any]


@asynccontextmanager
async def subscribed(
    sides: tuple[Side, ...], subscribers: list[Subscriber]
) -> AsyncIterator[dict[tuple[str, str], ClientConnection]]:
    """Every subscriber on every side, once each side's relay holds them all live."""
    async with AsyncExitStack() as stack:
        sockets: dict[tuple[str, str], ClientConnection] = {}
        for side in sides:
            for n, sub in enumerate(subscribers):
                sockets[(side.name, sub.name)] = await stack.enter_async_context(
                    raw_subscriber(
                        side.address,
                        sub.token,
                        sub.protocol,
                        sub.document,
                        f"op-{n}",
                        sub.variables,
                    )
                )
        for side in sides:
            relay = side.app.state.relay
            await wait_until(lambda r=relay: r.live_subscriptions >= len(subscribers))
        yield sockets


async def frames_until(
    ws: ClientConnection, protocol: str, last: Callable[[dict[str, Any]], bool]
) -> list[str]:
    """The result frames, as the text that arrived, up to the one `last` holds for (given
    the frame's poolEvents object), keep-alives skipped."""
    frames: list[str] = []
    while True:
        text = await asyncio.wait_for(ws.recv(), WAIT_S)
        assert isinstance(text, str)
        message = json.loads(text)
        if message["type"] != RESULT[protocol]:
            assert message["type"] in ("ka", "ping", "pong"), text
            continue
        frames.append(text)
        event = ((message["payload"].get("data") or {}).get("poolEvents")) or {}
        if last(event):
            return frames


# The event's own cursor (the first key of `poolEvents`, when selected first) names a
# position in the delivering relay's order: on PostgreSQL two relays may write the same
# event's differently (app/events/cursor.py). Compared without it; nothing else is left out.
_EVENT_CURSOR = re.compile(r'^(\{.*?"poolEvents":\{"cursor":)"[^"]*"')


def comparable(frame: str) -> str:
    """The frame as the two servers must send it alike: all of it but the event's cursor."""
    return _EVENT_CURSOR.sub(r'\1"<cursor>"', frame, count=1)


def is_marker(event: dict[str, Any]) -> bool:
    return MARKER in (event.get("data") or {})


def marked(step: object) -> Callable[[dict[str, Any]], bool]:
    """The marker event of this step."""
    return lambda event: (event.get("data") or {}).get(MARKER, None) == step


async def emit(
    capacity: Capacity,
    pool_id: str,
    tenant_id: str,
    audience: frozenset[str],
    data: dict[str, Any],
) -> None:
    """A pool.updated event with this audience, through the real outbox writer."""
    async with capacity.unit_of_work() as uow:
        assert await uow.lock_pool(pool_id)
        uow.emit(PendingEvent("pool.updated", pool_id, tenant_id, data, audience))
