"""CapacityRow: one resource of a pool's rollup."""

from __future__ import annotations

import strawberry

from schema.scalars import Long


@strawberry.type(
    description="One resource of a pool's capacity rollup, following its nodes and policy. "
    "Resolved from the domain's CapacityView."
)
class CapacityRow:
    resource: str = strawberry.field(description="The resource: gpu, gpu.mig or gpu.slot.")
    total: Long = strawberry.field(description="What the pool's nodes provide.")
    allocatable: Long = strawberry.field(
        description="What may be booked; stays at least `booked` while bookings last."
    )
    booked: Long = strawberry.field(description="What live reservations hold.")
    available: Long = strawberry.field(description="allocatable - booked: what still fits.")
    offered: Long | None = strawberry.field(
        description="The lender's view: the sum of the guests' quota maxima for the resource. "
        "Shown to the owner with compute:pools:share; null for everyone else."
    )
    guest_used: Long | None = strawberry.field(
        description="The lender's view: what the guests' reservations hold; null as `offered`."
    )
    overcommit: float | None = strawberry.field(
        description="The lender's view: offered / allocatable (above 1: more promised than "
        "the pool has); null as `offered`, or when allocatable is 0."
    )
