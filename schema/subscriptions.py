"""Subscription root: `poolEvents`, the live stream of pool events (CONTRACT sections 7, 9;
docs/events.md). Resolvers translate to the domain and back; nothing else."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from datetime import datetime
from typing import Annotated, Any, Final, cast

import strawberry
from starlette.websockets import WebSocket
from strawberry.scalars import JSON

from app.capacity.event_visibility import PoolEventFilter
from app.capacity.inputs import GetPoolInput, PoolEventsInput, parse_input
from app.errors import NotFound
from app.events import relay as events_relay
from app.events.reader import OutboxEvent
from schema.context import Context
from schema.lookahead import selected_below
from schema.pool_nodes import pool_from_detail, pool_parts
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
        "get every later event exactly once."
    )
    type: str = strawberry.field(
        description="pool.created, pool.offered, pool.unoffered, pool.updated or pool.archived."
    )
    pool_id: strawberry.ID = strawberry.field(description="The pool it is about.")
    tenant_id: str = strawberry.field(description="The tenant that made the change.")
    occurred_at: datetime = strawberry.field(description="When the change committed.")
    data: JSON = strawberry.field(
        description="What changed; its keys depend on `type`. Only what the subscriber may "
        "read: another tenant's offer details reach only the owner's callers with "
        "compute:pools:share (docs/events.md)."
    )
    tenant: strawberry.Private[str]  # the subscribing tenant
    # This event's own reads, when `pool` is selected: fresh data for every event.
    scope: strawberry.Private[Context | None]
    # Without `pool`, what a subscriber receives is decided by the event as shown to it
    # (readable_event) and its request alone: the executor renders it once per request
    # for every subscriber shown the same event object (schema/executor.py). With
    # `pool`, each subscriber's answer is its own read: None, never shared.
    renderings: strawberry.Private[dict[Any, Any] | None]

    @strawberry.field(
        description="The pool as the subscribing tenant sees it now; null once it no "
        "longer can (after an unoffer or archive that removed it)."
    )
    async def pool(self, info: Info) -> Pool | None:
        ctx = self.scope
        if ctx is None:  # not selected: never resolved
            return None
        principal = await ctx.principal()
        inp = GetPoolInput.model_validate({"tenantId": self.tenant, "poolId": self.pool_id})
        parts = pool_parts(selected_below(info, ()))
        try:
            detail = await ctx.capacity.get_pool(principal, inp, parts=parts, reads=ctx.reads)
        except NotFound:
            return None
        return pool_from_detail(detail, self.tenant)


def _pool_event(event: OutboxEvent, tenant: str, scope: Context | None) -> PoolEvent:
    return PoolEvent(
        cursor=event.cursor,
        type=event.type,
        pool_id=strawberry.ID(event.pool_id),
        tenant_id=event.tenant_id,
        occurred_at=event.occurred_at,
        data=cast(JSON, event.data),
        tenant=tenant,
        scope=scope,
        renderings=event.renderings if scope is None else None,
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
        inp = parse_input(
            PoolEventsInput, {k: v for k, v in arguments.items() if v is not None}
        )
        subscription = await ctx.capacity.open_pool_events(principal, inp)
        _close_when_evicted(subscription, ctx.request)
        tenant = subscription.filter.actor.tenant_id
        reads_pool = "pool" in selected_below(info, ())
        scope: Context | None = None
        try:
            async for event in subscription.stream():
                if scope is not None:
                    await scope.reads.close()  # the previous event has been sent
                scope = ctx.fork() if reads_pool else None
                yield _pool_event(event, tenant, scope)
        finally:
            if scope is not None:
                await scope.reads.close()
