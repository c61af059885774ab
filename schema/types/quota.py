"""Quota: one quota row, (pool, tenant, resource) -> max and used."""

from __future__ import annotations

import strawberry

from schema.scalars import Long
from schema.types.access import Grant


@strawberry.type(
    description="A quota row: how much of one resource a tenant may book in one pool. "
    "A missing row grants 0. Resolved from the domain's QuotaView."
)
class Quota:
    pool_id: strawberry.ID = strawberry.field(description="The pool the row belongs to.")
    resource: str = strawberry.field(
        description="The resource: `gpu` counts whole GPUs, `gpu.mig` MIG instances, "
        "`gpu.slot` shared slots; other keys follow the seed's key pattern."
    )
    max: Long = strawberry.field(
        description="The most the tenant may book; never below `used` (an offer below what "
        "is in use is raised to it). 2147483647 (2^31 - 1, the seed's default owner quota "
        "when `create` names none) means unlimited: only the pool's capacity bounds it."
    )
    used: Long = strawberry.field(description="What the tenant's live reservations hold.")
    grant: Grant | None = strawberry.field(
        description="The offer that gives the row: the tenant's own, or the ancestor's with "
        "includeDescendants whose rows a descendant books against (read-only to it). Null "
        "on an offer's rows in `Pool.offers`, where the offer says it."
    )
