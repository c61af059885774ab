"""Offer: a pool offered to one tenant, as its owner sees it."""

from __future__ import annotations

from collections.abc import Sequence

import strawberry

from app.capacity.views import QuotaView
from schema.types.quota import Quota


@strawberry.type(
    description="A tenant's offer of a pool: the owner always holds one, created with the "
    "pool. Shown to the owner only. Resolved from the domain's OfferView."
)
class Offer:
    tenant_id: str = strawberry.field(description="The tenant the pool is offered to.")
    include_descendants: bool = strawberry.field(
        description="Whether the offer reaches the tenant's descendant tenants too."
    )
    priority: int = strawberry.field(description="The offer's priority, -1000 to 1000.")
    quotas: Sequence[QuotaView] = strawberry.field(
        graphql_type=list[Quota], description="The offered tenant's quota rows on the pool."
    )
