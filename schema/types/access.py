"""Access: the answer of `access` (why can I see this), resolved from AccessExplanation."""

from __future__ import annotations

from datetime import datetime

import strawberry
from strawberry.scalars import JSON


@strawberry.type(
    description="The offer through which a tenant sees a pool. Resolved from GrantView."
)
class Grant:
    via: str | None = strawberry.field(
        description="`owner`, `offer` (the tenant's own) or `ancestorOffer` (an ancestor's "
        "with includeDescendants). Set on `access`; null on quota rows."
    )
    tenant_id: str = strawberry.field(
        description="The tenant the offer is to: the owner, the tenant, or the ancestor."
    )
    include_descendants: bool = strawberry.field(
        description="Whether the offer reaches the tenant's descendants."
    )
    priority: int = strawberry.field(description="The offer's priority, -1000 to 1000.")
    offered_at: datetime | None = strawberry.field(description="When the offer was made.")


@strawberry.type(description="The calling principal's one role binding.")
class AccessBinding:
    caller_id: strawberry.ID = strawberry.field(description="The caller, `caller_<ulid>`.")
    tenant_id: str = strawberry.field(description="The caller's own tenant.")
    role: str = strawberry.field(description="viewer, operator, admin or fleet-admin.")
    where: JSON = strawberry.field(
        description="The binding's conditions on pool attributes (`--where`), {} when none."
    )
    acting_for: str = strawberry.field(description="The tenant the caller acts for.")
    fleet_admin: bool = strawberry.field(
        description="Whether it acts for another tenant as the fleet's admin."
    )


@strawberry.type(description="The first check that refuses the permission.")
class AccessDenial:
    check: str = strawberry.field(
        description="`owner` (decided for the pool's owner only), `role` (the role lacks "
        "the permission) or `where` (a binding condition does not match the pool)."
    )
    message: str = strawberry.field(description="What failed, for a person.")
    key: str | None = strawberry.field(description="The binding condition, for `where`.")


@strawberry.type(
    description="Whether the calling principal holds a permission on a pool as the tenant, "
    "and the chain that decides it (CONTRACT section 2's order)."
)
class Access:
    allowed: bool = strawberry.field(description="Whether the permission is granted.")
    permission: str = strawberry.field(description="The permission asked about.")
    binding: AccessBinding = strawberry.field(description="The caller's binding.")
    grant: Grant | None = strawberry.field(
        description="The offer that lets the tenant see the pool; null when the caller's "
        "binding does not let it read the pool."
    )
    denied_by: AccessDenial | None = strawberry.field(
        description="The first check that fails; null when allowed."
    )
