"""The lender's view: a guest's share of a pool (`Pool.lending`) and a ranked capacity row
of the owner's fleet (`lending`). Resolved from OfferView and LendingRowView."""

from __future__ import annotations

from collections.abc import Sequence

import strawberry

from app.capacity.views import QuotaView
from schema.scalars import Long
from schema.types.quota import Quota


@strawberry.type(description="One guest tenant's offer on a pool: its quota and use.")
class GuestLending:
    tenant_id: str = strawberry.field(description="The guest tenant.")
    include_descendants: bool = strawberry.field(
        description="Whether the offer reaches the guest's descendants (they book on its rows)."
    )
    priority: int = strawberry.field(description="The offer's priority.")
    quotas: Sequence[QuotaView] = strawberry.field(
        graphql_type=list[Quota], description="The guest's rows: max lent, used booked."
    )


@strawberry.type(
    description="One capacity row of a pool the tenant owns, with what it lent to guests."
)
class LendingRow:
    pool_id: strawberry.ID = strawberry.field(description="The pool.")
    resource: str = strawberry.field(description="The resource.")
    total: Long = strawberry.field(description="What the pool's nodes provide.")
    allocatable: Long = strawberry.field(description="What may be booked.")
    booked: Long = strawberry.field(description="What live reservations hold.")
    available: Long = strawberry.field(description="allocatable - booked.")
    offered: Long = strawberry.field(description="The sum of the guests' quota maxima.")
    guest_used: Long = strawberry.field(description="What the guests' reservations hold.")
    overcommit: float | None = strawberry.field(
        description="offered / allocatable; null when allocatable is 0."
    )
