"""Opening a `poolEvents` subscription (Capacity.open_pool_events).

Checks run in CONTRACT section 2's order: input validation (the cursor included), then
the coarse IAM decision on the tenant, made once, at subscribe time. Each event is then
decided on its own as it is delivered (event_visibility.py), with the caller's current
binding: a rebinding re-scopes the open subscription (app/iam/bindings.py). A `poolId` the tenant
cannot see is not refused: the stream simply carries nothing of it, so a client that
resumes after losing a pool still gets the event that told it so.
"""

from __future__ import annotations

from app.capacity.access import resolve_actor
from app.capacity.event_visibility import PoolEventFilter
from app.capacity.inputs import PoolEventsInput
from app.catalog import LIST_POOLS
from app.db.engine import Database
from app.events.cursor import decode_resume
from app.events.relay import Relay, Subscription
from app.iam.bindings import LiveBindings
from app.iam.principal import Principal


async def open_pool_events(
    relay: Relay[PoolEventFilter],
    db: Database,
    bindings: LiveBindings,
    principal: Principal,
    inp: PoolEventsInput,
) -> Subscription[PoolEventFilter]:
    """A subscription for `poolEvents(tenantId, poolId, types, after)`; iterate its
    `stream()` for the events."""
    after = decode_resume(inp.after) if inp.after is not None else None
    async with db.reader.connect() as conn:
        # Decided as `list` is: compute:pools:read on the tenant.
        actor = await resolve_actor(conn, principal, inp.tenant_id, LIST_POOLS)
    event_filter = PoolEventFilter(
        actor=actor,
        pool_id=inp.pool_id,
        types=frozenset(inp.types) if inp.types is not None else None,
        binding=bindings.live(principal),  # re-scoped by a rebinding (app/iam/bindings.py)
    )
    return await relay.open(event_filter, after)
