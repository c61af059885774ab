"""Offer: a pool offered to one tenant, as its owner sees it."""

from __future__ import annotations

from collections.abc import Sequence

import strawberry

from app.capacity.node_ids import offer_node_id
from app.capacity.views import OfferView, QuotaView
from schema.types.node import Node
from schema.types.quota import Quota


@strawberry.type(
    description="A tenant's offer of a pool: the owner always holds one, created with the "
    "pool. Shown to the owner only. Resolved from the domain's OfferView; `node(id:)` "
    "refetches it for the owner."
)
class Offer(Node):
    id: strawberry.ID = strawberry.field(
        description="`offer:<poolId>:<tenantId>`: the pool and the tenant it is offered to."
    )
    tenant_id: str = strawberry.field(description="The tenant the pool is offered to.")
    include_descendants: bool = strawberry.field(
        description="Whether the offer reaches the tenant's descendant tenants too."
    )
    priority: int = strawberry.field(description="The offer's priority, -1000 to 1000.")
    quotas: Sequence[QuotaView] = strawberry.field(
        graphql_type=list[Quota], description="The offered tenant's quota rows on the pool."
    )

    @classmethod
    def from_view(cls, pool_id: str, view: OfferView) -> Offer:
        return cls(
            id=strawberry.ID(offer_node_id(pool_id, view.tenant_id)),
            tenant_id=view.tenant_id,
            include_descendants=view.include_descendants,
            priority=view.priority,
            quotas=view.quotas,
        )
