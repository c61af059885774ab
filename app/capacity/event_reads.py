"""The pool an event shows (`PoolEvent.pool`), read once per event and view.

A view is what decides the answer: the acting tenant, and the caller's tenant, role and
`--where` conditions (never the caller itself, nor its token). Every subscriber shown
the same event with the same view and the same selected parts shares one read, made by
the first of them and awaited by the others; so N subscribers over V views cost V reads
per event, not N (a caller opening many subscriptions costs no more reads than one).

The fan-out's reads take turns through a gate of `concurrency` slots, each on a
connection of its own held for that read only: however many subscriptions select
`pool`, the fan-out holds at most that many of the process's connections, and HTTP
requests, the relay and the revocation watcher keep the rest.
"""

from __future__ import annotations

import asyncio
from typing import Any

from app import metrics
from app.capacity import pool_reads
from app.capacity.inputs import GetPoolInput
from app.capacity.reads import Actor
from app.capacity.views import PoolDetail, PoolPart
from app.db.engine import Database
from app.errors import NotFound
from app.events.reader import OutboxEvent


def view_of(actor: Actor) -> tuple[Any, ...]:
    """What a pool read (and an event as shown) depends on, of the subscriber."""
    p = actor.principal
    return (actor.tenant_id, p.tenant_id, p.role, tuple(sorted(p.conditions.items())))


class EventPoolReads:
    def __init__(self, db: Database, concurrency: int = 2) -> None:
        self._db = db
        self._gate = asyncio.Semaphore(max(1, concurrency))
        self.reads = 0  # reads made by this process (for tests)

    async def pool(
        self, event: OutboxEvent, actor: Actor, parts: frozenset[PoolPart]
    ) -> PoolDetail | None:
        """The event's pool as the actor sees it, or None when it cannot (any more)."""
        key = ("pool", view_of(actor), parts)
        shared: asyncio.Future[PoolDetail | None] | None = event.reads.get(key)
        if shared is None:
            shared = asyncio.ensure_future(self._read(event.pool_id, actor, parts))
            event.reads[key] = shared
        # Shielded: one subscriber going away does not cancel the others' read.
        return await asyncio.shield(shared)

    async def _read(
        self, pool_id: str, actor: Actor, parts: frozenset[PoolPart]
    ) -> PoolDetail | None:
        inp = GetPoolInput.model_validate({"tenantId": actor.tenant_id, "poolId": pool_id})
        async with self._gate:
            self.reads += 1
            metrics.EVENT_POOL_READS.inc()
            async with self._db.reader.connect() as conn:
                try:
                    return await pool_reads.get_pool(conn, actor.principal, inp, parts)
                except NotFound:
                    return None
