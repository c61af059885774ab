"""Helpers for the event tests: collect a subscription's stream, wait for the relay."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette

from app.capacity.inputs import PoolEventsInput, parse_input
from app.capacity.service import Capacity
from app.events.outbox import PendingEvent
from app.events.reader import OutboxEvent, outbox_bounds
from app.events.relay import Relay, Subscription
from app.iam.callers import authenticate


async def wait_until(condition: Callable[[], bool], within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


class Collector:
    """Reads one subscription's stream into `events` in the background."""

    def __init__(self, subscription: Subscription, delay_s: float = 0.0) -> None:
        self.subscription = subscription
        self.events: list[OutboxEvent] = []
        self._delay_s = delay_s
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for event in self.subscription.stream():
            self.events.append(event)
            if self._delay_s:
                await asyncio.sleep(self._delay_s)

    @property
    def seqs(self) -> list[int]:
        return [e.seq for e in self.events]

    def types(self) -> list[str]:
        return [e.type for e in self.events]

    @property
    def idle(self) -> bool:
        """Level with the relay and nothing left in the mailbox."""
        s = self.subscription
        return s.live and len(s.mailbox) == 0

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def subscribe(
    app: Starlette, token: str, tenant_id: str, *, delay_s: float = 0.0, **arguments: Any
) -> Collector:
    """A `poolEvents` subscription opened as the transports open it, being read."""
    capacity: Capacity = app.state.capacity
    principal = await authenticate(capacity.db, f"Bearer {token}")
    payload = {"tenantId": tenant_id, **{k: v for k, v in arguments.items() if v is not None}}
    subscription = await capacity.open_pool_events(principal, parse_input(PoolEventsInput, payload))
    return Collector(subscription, delay_s=delay_s)


async def settle(app: Starlette, *collectors: Collector) -> None:
    """Wait until the relay has fanned out every committed event and each collector
    has taken everything mailed to it."""
    relay: Relay = app.state.relay
    capacity: Capacity = app.state.capacity
    async with capacity.db.reader.connect() as conn:
        newest = (await outbox_bounds(conn)).newest
    await wait_until(lambda: relay.cursor >= newest and all(c.idle for c in collectors))


async def emit_updates(
    capacity: Capacity, pool_id: str, tenant_id: str, count: int, start: int = 0
) -> None:
    """`count` pool.updated events for one tenant in one unit of work (the real outbox
    writer and wake-up), numbered in `data.n`."""
    async with capacity.unit_of_work() as uow:
        for n in range(start, start + count):
            uow.emit(
                PendingEvent(
                    type="pool.updated",
                    pool_id=pool_id,
                    tenant_id=tenant_id,
                    data={"n": n},
                    audience=frozenset({tenant_id}),
                )
            )
