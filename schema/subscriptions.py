"""Subscription root: `poolEvents`, the live stream of pool events (CONTRACT sections 7, 9;
docs/events.md). Resolvers translate to the domain and back; nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator
from datetime import datetime
from typing import Annotated, Any, Final, cast

import strawberry
from starlette.websockets import WebSocket
from strawberry.http.exceptions import WebSocketDisconnected
from strawberry.scalars import JSON

from app.capacity.event_reads import EventPoolStatement, PoolJson, view_of
from app.capacity.event_visibility import PoolEventFilter
from app.capacity.inputs import PoolEventsInput, parse_input
from app.capacity.service import Capacity
from app.errors import DomainError
from app.events import relay as events_relay
from app.events.reader import OutboxEvent
from app.iam.callers import bearer_token_hash
from schema.compiled_reads import CompiledReads
from schema.context import Context
from schema.lookahead import selected_below
from schema.operations import sent_operation_name
from schema.pool_nodes import pool_from_detail, pool_parts
from schema.shared_frames import NO_KEY, current_writer, request_key
from schema.spliced import Spliced
from schema.types.pool import Pool

Info = strawberry.Info[Context, None]

# The close code for a connection whose client stopped reading (docs/events.md): the
# client should reconnect and resubscribe with `after` = the last cursor it received.
SLOW_CONSUMER_CLOSE: Final = 4413
_closing: set[asyncio.Task[None]] = set()  # close tasks, kept alive until done


@strawberry.type(
    description="A pool event (CONTRACT section 7), as the subscribing tenant receives it."
)
class PoolEvent:
    cursor: str = strawberry.field(
        description="Opaque. Resubscribe with `after` set to the last cursor received to "
        "get every later event exactly once (and, for `pool.usage`, the latest usage of "
        "every pool that changed since)."
    )
    type: str = strawberry.field(
        description="pool.created, pool.offered, pool.unoffered, pool.updated, pool.archived "
        "or pool.usage (state, not history: the usage rows after bookings and releases, "
        "at most one per pool per coalescing window)."
    )
    pool_id: strawberry.ID = strawberry.field(description="The pool it is about.")
    tenant_id: str = strawberry.field(description="The tenant that made the change.")
    occurred_at: datetime = strawberry.field(description="When the change committed.")
    data: JSON = strawberry.field(
        description="What changed; its keys depend on `type` (pool.usage: `quotas` "
        "[{tenantId, resource, max, used}] and `capacity` [{resource, booked, available}], "
        "the rows after the change). Only what the subscriber may read: another tenant's "
        "offer details reach only the owner's callers with compute:pools:share "
        "(docs/events.md)."
    )
    tenant: strawberry.Private[str]  # the subscribing tenant
    # Set when `pool` is selected: the subscription whose event this is, whose caller's
    # current binding decides the read (app/capacity/event_reads.py).
    subscription: strawberry.Private[events_relay.Subscription[PoolEventFilter] | None]
    capacity: strawberry.Private[Capacity | None]
    # What a subscriber receives is decided by the event as shown to it (readable_event),
    # its view (tenant, role, `--where`) when it reads `pool`, and its request: the
    # executor renders it once per request for every subscriber given the same dict here
    # (schema/executor.py): the event object's own, or, with `pool`, the event's per view.
    renderings: strawberry.Private[dict[Any, Any]]
    source: strawberry.Private[OutboxEvent]
    # Set when `pool` may be answered by Query.pool's compiled statement.
    compiles: strawberry.Private[_Compiles | None]

    @strawberry.field(
        description="The pool as the subscribing tenant sees it now; null once it no "
        "longer can (after an unoffer or archive that removed it). Read once per event "
        "for every subscriber with the same view (tenant, role and binding conditions)."
    )
    async def pool(self, info: Info) -> Pool | None:
        subscription, capacity = self.subscription, self.capacity
        if subscription is None or capacity is None:  # not selected: never resolved
            return None
        parts = pool_parts(selected_below(info, ()))
        statement = None if self.compiles is None else self.compiles.statement(info, capacity)
        actor = subscription.filter.actor
        with subscription.preparing():  # our read, not the client's stall
            found = await capacity.event_reads.pool(self.source, actor, parts, statement)
        if isinstance(found, PoolJson):  # its JSON goes into the rendering as it is
            return cast(Pool, Spliced(found.value))
        return None if found is None else pool_from_detail(found, self.tenant)


@dataclasses.dataclass(frozen=True, slots=True)
class _Compiles:
    """What a subscription's `pool` needs to be answered by Query.pool's statement: the
    plans (its text's, schema/compiled_reads.py) and the caller's token hash, which the
    statement checks as it does for Query.pool."""

    reads: CompiledReads
    operation_name: str | None
    token_hash: str

    def statement(self, info: Info, capacity: Capacity) -> EventPoolStatement | None:
        query = info.query
        if query is None:
            return None
        raw = info._raw_info
        # Made per read, not kept: an idle subscription holds only what this class does.
        variables = self.reads.variables(info.operation, raw.variable_values)
        if variables is None:
            return None
        found = self.reads.event_pool(
            query,
            self.operation_name,
            str(raw.path.key),
            list(raw.field_nodes),
            variables,
            capacity,
        )
        if found is None:
            return None
        read, args = found
        return EventPoolStatement(read, tuple(args.items()), self.token_hash)


def _compiles(info: Info) -> _Compiles | None:
    """Where `pool` may be compiled: compiled reads on, an executor that splices, a store
    that compiles reads, a caller with a bearer token (the statement checks it)."""
    ctx = info.context
    if ctx.compiled is None or not ctx.capacity.compiles_reads:
        return None
    try:
        token_hash = bearer_token_hash(ctx.authorization())
    except DomainError:
        return None
    return _Compiles(ctx.compiled, sent_operation_name.get(), token_hash)


def _renderings(
    event: OutboxEvent,
    subscription: events_relay.Subscription[PoolEventFilter],
    capacity: Capacity | None,
) -> dict[Any, Any]:
    """Where the subscriber's rendering of `event` is shared: the event object's own, or
    with `pool` selected (rendered once per event and view) its view's."""
    if capacity is not None:
        return cast(
            "dict[Any, Any]",
            event.reads.setdefault(("rendering", view_of(subscription.filter.actor)), {}),
        )
    return event.renderings


def _pool_event(
    event: OutboxEvent,
    tenant: str,
    subscription: events_relay.Subscription[PoolEventFilter],
    capacity: Capacity | None,
    renderings: dict[Any, Any],
    compiles: _Compiles | None,
) -> PoolEvent:
    # Made per subscriber that executes, never kept in `renderings`: it refers to the
    # event, and a cycle through it would keep every event until a full collection.
    return PoolEvent(
        cursor=event.cursor,
        type=event.type,
        pool_id=strawberry.ID(event.pool_id),
        tenant_id=event.tenant_id,
        occurred_at=event.occurred_at,
        data=cast(JSON, event.data),
        tenant=tenant,
        subscription=subscription if capacity is not None else None,
        capacity=capacity,
        renderings=renderings,
        source=event,
        compiles=compiles,
    )


def _close_when_evicted(
    subscription: events_relay.Subscription[PoolEventFilter], request: object
) -> None:
    if not isinstance(request, WebSocket):
        return

    def close() -> None:
        task = asyncio.create_task(
            request.close(SLOW_CONSUMER_CLOSE, "too slow: resubscribe with after=<last cursor>")
        )
        _closing.add(task)
        task.add_done_callback(_closing.discard)

    subscription.on_evict = close


@strawberry.type(description="Live streams.")
class Subscription:
    @strawberry.subscription(
        description="Pool events the tenant may see, in commit order, each once. Without "
        "`after`, from now; with `after`, every later event (replayed from the outbox), then "
        "live. Checked as compute:pools:read on the tenant when subscribing; each event is "
        "delivered only if the tenant may see it (docs/events.md)."
    )
    async def pool_events(
        self,
        info: Info,
        tenant_id: Annotated[
            str, strawberry.argument(description="The tenant the caller acts for.")
        ],
        pool_id: Annotated[
            strawberry.ID | None, strawberry.argument(description="Only this pool's events.")
        ] = None,
        types: Annotated[
            list[str] | None, strawberry.argument(description="Only these event types.")
        ] = None,
        after: Annotated[
            str | None,
            strawberry.argument(description="Resume after this cursor (`PoolEvent.cursor`)."),
        ] = None,
    ) -> AsyncGenerator[PoolEvent, None]:
        ctx = info.context
        principal = await ctx.principal()
        arguments = {"tenantId": tenant_id, "poolId": pool_id, "types": types, "after": after}
        inp = parse_input(PoolEventsInput, {k: v for k, v in arguments.items() if v is not None})
        subscription = await ctx.capacity.open_pool_events(principal, inp)
        _close_when_evicted(subscription, ctx.request)
        tenant = subscription.filter.actor.tenant_id
        reads_pool = "pool" in selected_below(info, ())
        # strawberry caches the selection on `info` (a cached_property: deleting it is how
        # its cache is let go), which this generator keeps while it lives: ~1.5 KB a
        # subscription, for nothing once read. (Nothing to let go if it stops caching.)
        with contextlib.suppress(AttributeError):
            del info.selected_fields
        capacity = ctx.capacity if reads_pool else None
        compiles = _compiles(info) if reads_pool else None
        writer = current_writer.get()  # set by our websocket handlers when frames are shared
        key = request_key(info.operation, info.variable_values)
        executed = reads_pool  # the previous event (or the opening) read through ctx
        async for event in subscription.stream():
            if executed:
                # What the previous event read through this context (`reservations`) is
                # let go: its connection back to the pool, nothing stale kept for the next.
                # (A shared frame read nothing through it.)
                await ctx.refresh_reads()
                executed = False
            renderings = _renderings(event, subscription, capacity)
            if writer is not None and key is not NO_KEY:
                payload = await writer.payload(
                    renderings, key, info.operation, subscription.preparing
                )
                if payload is not None:  # rendered for an identical request: sent as is
                    try:
                        await writer.send(payload)
                        continue
                    except WebSocketDisconnected:
                        pass  # strawberry's path meets the closed socket as it always does
            executed = reads_pool
            yield _pool_event(event, tenant, subscription, capacity, renderings, compiles)
