"""Why can I see this: the chain of checks that decides one permission on one pool.

The checks run in CONTRACT section 2's order. Those before visibility (the tenant decision,
the pool's visibility) fail exactly as `get` fails, so explain reveals nothing about a pool
the tenant cannot see; from there on, every step is something the caller could read already
(the pool's attributes, its owner, its own binding).
"""

from __future__ import annotations

from sqlalchemy import select

from app.capacity.access import resolve_actor
from app.capacity.inputs import ExplainAccessInput
from app.capacity.reads import visible_pool
from app.capacity.views import AccessExplanation, BindingView, Denial, GrantView, PoolView
from app.catalog import EXPLAIN_ACCESS, GET_POOL
from app.db.engine import Executor
from app.db.models import Offer
from app.iam.decisions import PoolAttributes, allows_pool
from app.iam.principal import Principal
from app.iam.roles import POOLS_MANAGE, POOLS_SHARE

# Decided for the pool's owner only: anyone else gets NOT_FOUND from the write (seed).
OWNER_ONLY = frozenset({POOLS_MANAGE, POOLS_SHARE})


async def grant_of(executor: Executor, tenant_id: str, pool: PoolView) -> GrantView:
    """The offer through which `tenant_id` sees the pool: the owner's own, the tenant's, or
    the nearest ancestor's with includeDescendants (load_grants' choice)."""
    offer = (
        await executor.execute(
            select(Offer.include_descendants, Offer.priority, Offer.created_at).where(
                Offer.pool_id == pool.id, Offer.tenant_id == pool.grant.tenant_id
            )
        )
    ).one_or_none()
    if pool.owned:
        via = "owner"
    else:
        via = "offer" if pool.grant.tenant_id == tenant_id else "ancestorOffer"
    if offer is None:  # an archived pool keeps only its owner's row; the owner always has one
        return GrantView(via, pool.grant.tenant_id, False, 0, None)
    return GrantView(
        via, pool.grant.tenant_id, offer.include_descendants, offer.priority, offer.created_at
    )


def _first_denial(
    principal: Principal, permission: str, pool: PoolView, attributes: PoolAttributes
) -> Denial | None:
    if permission in OWNER_ONLY and not pool.owned:
        return Denial("owner", f"{permission} is decided for the pool's owner only")
    if not principal.has(permission):
        return Denial("role", f"role {principal.role} lacks {permission}")
    values = attributes.as_binding_values()
    for key, want in sorted(principal.conditions.items()):
        if values.get(key) != want:
            # Not the pool's value: a caller its binding excludes does not read the pool.
            return Denial("where", f"the binding's condition {key}={want} does not match", key=key)
    return None


async def explain_access(
    executor: Executor, principal: Principal, inp: ExplainAccessInput
) -> AccessExplanation:
    # The tenant decision and visibility fail as `get` does: the same code, message, field.
    actor = await resolve_actor(executor, principal, inp.tenant_id, EXPLAIN_ACCESS)
    pool = await visible_pool(executor, actor, inp.pool_id)
    denial = _first_denial(principal, inp.permission, pool, pool.grant.attributes)
    # The offer is pool data: shown to a caller that may read the pool, as `get` shows it.
    readable = allows_pool(principal, GET_POOL.permission, pool.grant.attributes)
    binding = BindingView(
        caller_id=principal.caller_id,
        tenant_id=principal.tenant_id,
        role=principal.role,
        where=dict(principal.conditions),
        acting_for=inp.tenant_id,
        fleet_admin=principal.tenant_id != inp.tenant_id,
    )
    return AccessExplanation(
        allowed=denial is None,
        permission=inp.permission,
        binding=binding,
        grant=await grant_of(executor, inp.tenant_id, pool) if readable else None,
        denied_by=denial,
    )
