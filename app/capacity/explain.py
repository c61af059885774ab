"""Why can I see this: the chain of checks that decides one permission on one pool.

The checks run in CONTRACT section 2's order. Those before visibility (the tenant decision,
the pool's visibility) fail exactly as `get` fails, so explain reveals nothing about a pool
the tenant cannot see; from there on, every step is something the caller could read already
(the pool's attributes, its owner, its own binding).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, select

from app.capacity.access import resolve_actor
from app.capacity.inputs import ExplainAccessInput
from app.capacity.reads import granted_as, visible_pool
from app.capacity.views import AccessExplanation, BindingView, Denial, Grant, GrantView
from app.catalog import EXPLAIN_ACCESS, GET_POOL
from app.db.engine import Executor
from app.db.models import Offer
from app.iam.decisions import PoolAttributes, allows_pool
from app.iam.principal import Principal
from app.iam.roles import POOLS_MANAGE, POOLS_SHARE

# Decided for the pool's owner only: anyone else gets NOT_FOUND from the write (seed).
OWNER_ONLY = frozenset({POOLS_MANAGE, POOLS_SHARE})


@dataclass(frozen=True, slots=True)
class OfferTerms:
    """The terms of the offer that grants the pool (the grant tenant's offer row)."""

    include_descendants: bool
    priority: int
    offered_at: datetime


# The offer row of the grant tenant, built once (bound: pool_id, tenant_id).
_OFFER = select(Offer.include_descendants, Offer.priority, Offer.created_at).where(
    Offer.pool_id == bindparam("pool_id"), Offer.tenant_id == bindparam("tenant_id")
)


async def offer_of(executor: Executor, pool_id: str, grant: Grant) -> OfferTerms | None:
    """The offer through which the grant tenant holds the pool (the owner's own, the
    tenant's, or the nearest ancestor's with includeDescendants: load_grants' choice)."""
    offer = (
        await executor.execute(_OFFER, {"pool_id": pool_id, "tenant_id": grant.tenant_id})
    ).one_or_none()
    return None if offer is None else OfferTerms(*offer)


def grant_view(tenant_id: str, owned: bool, grant: Grant, offer: OfferTerms | None) -> GrantView:
    """How the tenant holds the pool: as its owner, by its own offer, or an ancestor's."""
    via = "owner" if owned else "offer" if grant.tenant_id == tenant_id else "ancestorOffer"
    if offer is None:  # an archived pool keeps only its owner's row; the owner always has one
        return GrantView(via, grant.tenant_id, False, 0, None)
    return GrantView(
        via, grant.tenant_id, offer.include_descendants, offer.priority, offer.offered_at
    )


def shows_grant(principal: Principal, grant: Grant) -> bool:
    """The offer is pool data: shown to a caller that may read the pool, as `get` shows it."""
    return allows_pool(principal, GET_POOL.permission, grant.attributes)


def _first_denial(
    principal: Principal, permission: str, owned: bool, attributes: PoolAttributes
) -> Denial | None:
    if permission in OWNER_ONLY and not owned:
        return Denial("owner", f"{permission} is decided for the pool's owner only")
    if not principal.has(permission):
        return Denial("role", f"role {principal.role} lacks {permission}")
    values = attributes.as_binding_values()
    for key, want in sorted(principal.conditions.items()):
        if values.get(key) != want:
            # Not the pool's value: a caller its binding excludes does not read the pool.
            return Denial("where", f"the binding's condition {key}={want} does not match", key=key)
    return None


def explanation(
    principal: Principal,
    inp: ExplainAccessInput,
    owned: bool,
    grant: Grant,
    offer: OfferTerms | None,
) -> AccessExplanation:
    """The explanation of a pool the tenant sees (`owned`: it is the pool's owner), given
    the grant that lets it see the pool and that grant's offer: the plain read's and the
    compiled read's (json_reads' access statement reads the same facts in one statement)."""
    denial = _first_denial(principal, inp.permission, owned, grant.attributes)
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
        grant=grant_view(inp.tenant_id, owned, grant, offer)
        if shows_grant(principal, grant)
        else None,
        denied_by=denial,
    )


def explained(
    principal: Principal, inp: ExplainAccessInput, facts: dict[str, Any]
) -> AccessExplanation:
    """`explanation` of the facts the compiled statement read (json_reads: the pool's
    owner, the grant tenant, its authz row's attributes, its offer's terms)."""
    attributes = PoolAttributes(
        facts["gpuModel"], facts["class"], facts["sharing"], facts["region"], facts["owned"]
    )
    grant = granted_as(inp.tenant_id, facts["grant"], attributes)
    terms = facts["offer"]
    offer = (
        None
        if terms is None
        else OfferTerms(terms["d"], terms["p"], datetime.fromisoformat(terms["at"]))
    )
    return explanation(principal, inp, facts["owner"] == inp.tenant_id, grant, offer)


async def explain_access(
    executor: Executor, principal: Principal, inp: ExplainAccessInput
) -> AccessExplanation:
    # The tenant decision and visibility fail as `get` does: the same code, message, field.
    actor = await resolve_actor(executor, principal, inp.tenant_id, EXPLAIN_ACCESS)
    pool = await visible_pool(executor, actor, inp.pool_id)
    shown = shows_grant(principal, pool.grant)
    offer = await offer_of(executor, pool.id, pool.grant) if shown else None
    return explanation(principal, inp, pool.owned, pool.grant, offer)
