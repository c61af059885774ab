"""In-process websocket subscribers and an event producer, for bench/scale_out.py: many
subscribers spread over several serve processes, each receipt timed against its commit.
(bench/events_fanout.py runs its clients in processes of their own instead.)"""

from __future__ import annotations

import asyncio
import time

import orjson
from websockets.asyncio.client import ClientConnection

from app.capacity.service import Capacity
from app.db.engine import Database
from app.events.bus import EventBus
from app.events.cursor import Position, decode_cursor
from app.events.outbox import PendingEvent
from bench.fanout_workers import open_subscriptions


class Subscriber:
    """One websocket with one poolEvents subscription, recording receipt times by seq."""

    def __init__(self) -> None:
        self.received: dict[Position, float] = {}
        self.ws: ClientConnection | None = None
        self.task: asyncio.Task[None] | None = None

    async def open(self, address: str, token: str, tenant: str, subscriptions: int = 1) -> None:
        self.ws = await open_subscriptions(address, token, tenant, subscriptions)
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.ws is not None
        async for raw in self.ws:
            now = time.time()
            message = orjson.loads(raw)
            if message["type"] == "next":
                seq = decode_cursor(message["payload"]["data"]["poolEvents"]["cursor"])
                self.received[seq] = now

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if self.ws is not None:
            await self.ws.close()


async def open_all(address: str, plan: list[tuple[str, str]]) -> list[Subscriber]:
    """Open one subscriber per (token, tenant), 50 at a time."""
    subscribers = [Subscriber() for _ in plan]
    for start in range(0, len(plan), 50):
        await asyncio.gather(
            *(
                s.open(address, *plan[i])
                for i, s in enumerate(subscribers)
                if start <= i < start + 50
            )
        )
    return subscribers


class Producer:
    """Commits events through the real unit of work; records each seq's commit time."""

    def __init__(self, db: Database, bus: EventBus) -> None:
        self.committed: dict[Position, float] = {}
        self._bus = bus

        async def notify(seq: Position) -> None:
            self.committed.setdefault(seq, time.time())
            await bus.notify(seq)

        self.capacity = Capacity(db, notify)

    async def emit(self, pool_id: str, tenant: str, count: int = 1) -> None:
        async with self.capacity.unit_of_work() as uow:
            await uow.lock_pool(pool_id)  # as the domain's writes do (app/events/outbox.py)
            for n in range(count):
                uow.emit(
                    PendingEvent("pool.updated", pool_id, tenant, {"n": n}, frozenset({tenant}))
                )
