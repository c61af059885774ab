"""Opening a `poolEvents` subscription: the transports call this, nothing else.

Checks run in CONTRACT section 2's order: input validation (the cursor included), then
the coarse IAM decision on the tenant, made once, at subscribe time. Each event is then
decided on its own as it is delivered (app/events/visibility.py). A `poolId` the tenant
cannot see is not refused: the stream simply carries nothing of it, so a client that
resumes after losing a pool still gets the event that told it so.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from app.capacity.access import resolve_actor
from app.capacity.inputs import MethodInput, PoolId, TenantId, parse_input
from app.events.cursor import decode_cursor
from app.events.relay import Relay, Subscription
from app.events.visibility import EventFilter
from app.iam.principal import Principal
from app.iam.roles import POOLS_READ

EventType = Literal[
    "pool.created", "pool.offered", "pool.unoffered", "pool.updated", "pool.archived"
]


class PoolEventsInput(MethodInput):
    tenant_id: TenantId = Field(alias="tenantId")
    pool_id: PoolId | None = Field(default=None, alias="poolId")
    types: Annotated[list[EventType], Field(max_length=5)] | None = None
    after: Annotated[str, StringConstraints(max_length=64)] | None = None


async def open_pool_events(
    relay: Relay, principal: Principal, arguments: dict[str, object]
) -> Subscription:
    """A subscription for `poolEvents(tenantId, poolId, types, after)`; iterate its
    `stream()` for the events."""
    inp = parse_input(PoolEventsInput, {k: v for k, v in arguments.items() if v is not None})
    after = decode_cursor(inp.after) if inp.after is not None else None
    async with relay.db.reader.connect() as conn:
        actor = await resolve_actor(conn, principal, inp.tenant_id, POOLS_READ)
    event_filter = EventFilter(
        actor=actor,
        pool_id=inp.pool_id,
        types=frozenset(inp.types) if inp.types is not None else None,
    )
    return await relay.open(event_filter, after)
