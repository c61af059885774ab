"""The per-caller and per-tenant subscription bounds at the websocket edge (both
protocols, schema/websockets.py): a subscribe past a bound gets the protocol's `error`
for that operation id with RESOURCE_EXHAUSTED, and the socket stays open.

A slot is taken before the operation starts and given back when its task ends, however
it ends (complete, stop, error, the socket closing). Only subscriptions count: a query
or mutation sent over the socket answers once and holds nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from graphql import (
    GraphQLError,
    GraphQLFormattedError,
    OperationDefinitionNode,
    OperationType,
    parse,
)

from app import metrics
from app.events.bounds import SubscriptionBounds
from schema.context import Context


@dataclass(slots=True)
class Slot:
    bounds: SubscriptionBounds
    caller_id: str
    tenant_id: str
    held: bool = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.bounds.give_back(self.caller_id, self.tenant_id)

    def hold_until_done(self, task: asyncio.Task[object] | None) -> None:
        """Given back when the operation's task ends; at once when none was started."""
        if task is None or task.done():
            self.release()
        else:
            task.add_done_callback(lambda _: self.release())


def _refused(bound: str, limit: int) -> GraphQLFormattedError:
    return {
        "message": f"at most {limit} open subscriptions per {bound}",
        "extensions": {
            "code": "RESOURCE_EXHAUSTED",
            "limit": "subscriptionsPerCaller" if bound == "caller" else "subscriptionsPerTenant",
        },
    }


def is_subscription(payload: Mapping[str, object], max_tokens: int) -> bool:
    """Whether the operation the payload runs is a subscription (a document that does not
    parse is not: it is refused later, as it would be anyway)."""
    query, name = payload.get("query"), payload.get("operationName")
    if not isinstance(query, str):
        return False
    try:
        document = parse(query, no_location=True, max_tokens=max_tokens)
    except GraphQLError:
        return False
    operations = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
    if isinstance(name, str) and name:
        operations = [o for o in operations if o.name is not None and o.name.value == name]
    return len(operations) == 1 and operations[0].operation is OperationType.SUBSCRIPTION


async def take_slot(
    context: Context, payload: Mapping[str, object]
) -> Slot | GraphQLFormattedError | None:
    """A slot for this operation, the error that refuses it, or None (not a subscription,
    or no bounds in this process)."""
    bounds: SubscriptionBounds | None = getattr(
        context.request.app.state, "subscription_bounds", None
    )
    if bounds is None or not is_subscription(payload, context.settings.max_tokens):
        return None
    principal = await context.principal()
    refused = bounds.take(principal.caller_id, principal.tenant_id)
    if refused is not None:
        metrics.SUBSCRIPTIONS_REFUSED.labels(refused).inc()
        limit = bounds.per_caller if refused == "caller" else bounds.per_tenant
        return _refused(refused, limit)
    return Slot(bounds, principal.caller_id, principal.tenant_id)
