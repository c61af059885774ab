"""The pool an event shows (`PoolEvent.pool`), read once per event and view.

A view is what decides the answer: the acting tenant, and the caller's tenant, role and
`--where` conditions (never the caller itself, nor its token). Every subscriber shown
the same event with the same view and the same selected parts shares one read, made by
the first of them and awaited by the others; so N subscribers over V views cost V reads
per event, not N (a caller opening many subscriptions costs no more reads than one).

A subscriber whose selection of `pool` compiles is answered by the statement that
answers `Query.pool` for the same selection (docs/decisions/0008, `EventPoolStatement`):
the pool as JSON, shared by the view's subscribers of that statement. Where that
statement gives no answer (a narrowed binding, a token no longer live, a pool the view
no longer sees, a failure other than the database being out of reach), the same read
goes on with the plain one, as `Query.pool` does: still one read of the event and view.

The fan-out's reads take turns through a gate of `concurrency` slots, each on a
connection of its own held for that read only: however many subscriptions select
`pool`, the fan-out holds at most that many of the process's connections, and HTTP
requests, the relay and the revocation watcher keep the rest.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from app import metrics
from app.capacity import pool_reads
from app.capacity.inputs import GetPoolInput
from app.capacity.json_reads import CompiledRead
from app.capacity.reads import Actor
from app.capacity.views import PoolDetail, PoolPart
from app.db.engine import Database
from app.errors import NotFound, Unavailable
from app.events.reader import OutboxEvent
from app.iam.principal import Principal

logger = logging.getLogger(__name__)
_ANSWERED = metrics.EVENT_POOL_COMPILED.labels("answered")
_DECLINED = metrics.EVENT_POOL_COMPILED.labels("declined")


def view_of(actor: Actor) -> tuple[Any, ...]:
    """What a pool read (and an event as shown) depends on, of the subscriber."""
    p = actor.principal
    return (actor.tenant_id, p.tenant_id, p.role, tuple(sorted(p.conditions.items())))


@dataclass(frozen=True, slots=True)
class EventPoolStatement:
    """A subscriber's `pool` as one compiled statement: `Query.pool`'s for the same
    selection, with its pages' arguments (`Pool.reservations`), and the subscriber's
    token hash, which the statement checks is live with the view's role."""

    read: CompiledRead
    paged: tuple[tuple[str, object], ...]
    token_hash: str


@dataclass(frozen=True, slots=True)
class PoolJson:
    """The pool as the compiled statement answered it: the JSON value to splice in (an
    orjson.Fragment, or parsed JSON), never null."""

    value: Any


class ReadsJson(Protocol):
    """Capacity.read_json: a compiled read's answer, or None for the plain read."""

    async def __call__(
        self,
        principal: Principal,
        token_hash: str,
        read: CompiledRead,
        args: dict[str, object],
        *,
        under_key: bool = ...,
    ) -> Any: ...


class EventPoolReads:
    def __init__(self, db: Database, concurrency: int, read_json: ReadsJson) -> None:
        self._db = db
        self._gate = asyncio.Semaphore(max(1, concurrency))
        self._read_json = read_json
        self.reads = 0  # reads made by this process (for tests)
        self.compiled = 0  # of which the compiled statement answered (for tests)

    async def pool(
        self,
        event: OutboxEvent,
        actor: Actor,
        parts: frozenset[PoolPart],
        statement: EventPoolStatement | None = None,
    ) -> PoolDetail | PoolJson | None:
        """The event's pool as the actor sees it, or None when it cannot (any more): as
        `statement` answers it, else as the plain read does (`parts` of it)."""
        view = view_of(actor)
        key: tuple[Any, ...] = (
            ("pool", view, parts)
            if statement is None
            else ("json", view, statement.read.sql, statement.paged)
        )
        shared: asyncio.Future[PoolDetail | PoolJson | None] | None = event.reads.get(key)
        if shared is None:
            shared = asyncio.ensure_future(self._read(event.pool_id, actor, parts, statement))
            event.reads[key] = shared
        # Shielded: one subscriber going away does not cancel the others' read.
        return await asyncio.shield(shared)

    async def _read(
        self,
        pool_id: str,
        actor: Actor,
        parts: frozenset[PoolPart],
        statement: EventPoolStatement | None,
    ) -> PoolDetail | PoolJson | None:
        async with self._gate:
            self.reads += 1
            metrics.EVENT_POOL_READS.inc()
            if statement is not None:
                value = await self._compiled(pool_id, actor, statement)
                if value is not None:
                    self.compiled += 1
                    return PoolJson(value)
            inp = GetPoolInput.model_validate({"tenantId": actor.tenant_id, "poolId": pool_id})
            async with self._db.reader.connect() as conn:
                try:
                    return await pool_reads.get_pool(conn, actor.principal, inp, parts)
                except NotFound:
                    return None

    async def _compiled(self, pool_id: str, actor: Actor, statement: EventPoolStatement) -> Any:
        """The statement's answer, or None for the plain read (which meets any fault but
        the database being out of reach, and reports it, as for `Query.pool`)."""
        args: dict[str, object] = {"tenantId": actor.tenant_id, "poolId": pool_id}
        args.update(statement.paged)
        try:
            value = await self._read_json(
                actor.principal, statement.token_hash, statement.read, args, under_key=True
            )
        except Unavailable:
            raise  # the plain read would only wait for it again
        except Exception:
            logger.debug("compiled event pool read failed; reading it plainly", exc_info=True)
            value = None
        (_DECLINED if value is None else _ANSWERED).inc()
        return value
