"""What the relay asks of the domain: the relay moves events, the domain decides who may
read each one (app/capacity/event_visibility.py), so app/events/ knows no IAM rule."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

from app.db.engine import Executor
from app.events.reader import OutboxEvent


class EventFilter(Protocol):
    """What a subscription asked for, as far as the relay reads it."""

    @property
    def tenants(self) -> tuple[str, ...]:
        """The subscriber's tenant, then its ancestors: the audiences it is offered."""
        ...

    @property
    def pool_id(self) -> str | None: ...

    @property
    def types(self) -> frozenset[str] | None: ...


F = TypeVar("F", bound=EventFilter)
F_contra = TypeVar("F_contra", bound=EventFilter, contravariant=True)


class ShownEvents(Protocol[F_contra]):
    """One batch of events, with what deciding them needs loaded once for the batch."""

    def readable(self, event: OutboxEvent, subscription: F_contra) -> OutboxEvent | None:
        """The event as this subscription may read it, or None when it is not delivered
        (the cursor still moves past it)."""
        ...


class ShownUsage(Protocol[F_contra]):
    """One usage round's changed pools, with what deciding them needs loaded once."""

    async def readable(
        self, pool_id: str, moved: frozenset[str | None], subscription: F_contra
    ) -> OutboxEvent | None:
        """The pool's `pool.usage` event as this subscription may read it (the rows its own
        query shows now), or None when it is not for it. `moved`: the tenants whose quota
        rows moved (None: the capacity rows)."""
        ...


class Visibility(Protocol[F_contra]):
    async def load(
        self, executor: Executor, events: Sequence[OutboxEvent]
    ) -> ShownEvents[F_contra]: ...

    async def load_usage(
        self, executor: Executor, changes: Mapping[str, frozenset[str | None]]
    ) -> ShownUsage[F_contra]: ...
