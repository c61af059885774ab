"""Node: Relay's global object identification (app/capacity/node_ids.py has the forms)."""

from __future__ import annotations

import strawberry


@strawberry.interface(
    description="An object `node(id:)` refetches (the Relay spec's Node). A Pool's id is "
    "its REST id, `pool_<ulid>`; an Offer's is `offer:<poolId>:<tenantId>`."
)
class Node:
    id: strawberry.ID = strawberry.field(description="The object's global id.")
