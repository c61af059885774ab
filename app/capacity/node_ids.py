"""Global object ids (Relay's `Node`, CONTRACT section 10 "Client caches and Relay").

A pool's node id is its REST id (`pool_<ulid>`), so scripts move between REST and GraphQL
with one id. An offer is named by its pool and the tenant it goes to:
`offer:<poolId>:<tenantId>`. The pool as an offered tenant sees it (what `offer` answers)
has an id of its own, `offered:<poolId>:<tenantId>`, so that no normalized cache (Relay
keys records by `id` alone) files it under the acting tenant's view of the pool. Pool ids
hold no ':', so the tenant id (which may) is everything after the second one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from app.capacity.views import OfferView

OFFER_PREFIX = "offer:"
OFFERED_PREFIX = "offered:"


@dataclass(frozen=True, slots=True)
class NodeRef:
    kind: Literal["pool", "offer"]
    pool_id: str
    tenant_id: str | None = None  # an offer's tenant


@dataclass(frozen=True, slots=True)
class PoolOffer:
    """An offer found by its node id, with the pool it belongs to."""

    pool_id: str
    offer: OfferView


def offer_node_id(pool_id: str, tenant_id: str) -> str:
    return f"{OFFER_PREFIX}{pool_id}:{tenant_id}"


def offered_pool_id(pool_id: str, tenant_id: str) -> str:
    return f"{OFFERED_PREFIX}{pool_id}:{tenant_id}"


def parse_node_id(value: str) -> NodeRef | None:
    """The object a node id names; None for a form the service never gives out (the
    offered view is not refetchable: `node` answers a pool as the caller's tenant sees it)."""
    if value.startswith("pool_") and ":" not in value:
        return NodeRef("pool", value)
    if value.startswith(OFFER_PREFIX):
        pool_id, sep, tenant_id = value[len(OFFER_PREFIX) :].partition(":")
        if sep and pool_id.startswith("pool_") and tenant_id:
            return NodeRef("offer", pool_id, tenant_id)
    return None
