"""Pools for a response: which parts of each pool the query selects, and the domain's read
model as GraphQL Pool objects. The domain reads the parts for a whole page at once and
decides each one's IAM (`Capacity.list_pools`, `get_pool`, `pool_parts`); nothing here
reads or decides."""

from __future__ import annotations

from app.capacity.views import POOL_PARTS, PoolDetail, PoolPart
from schema.types.pool import OfferedPool, Pool, offered_pool_from_view, pool_from_view


def pool_parts(selected: set[str]) -> frozenset[PoolPart]:
    """The selected Pool fields that are parts of the read model."""
    return frozenset(part for part in POOL_PARTS if part in selected)


def pool_from_detail(detail: PoolDetail, tenant_id: str) -> Pool:
    """`tenant_id`: the acting tenant (the pool of an offer is shown as the offered tenant
    sees it, while its reservations stay the acting tenant's)."""
    return pool_from_view(
        detail.pool,
        tenant_id,
        quotas=detail.quotas,
        capacity=detail.capacity,
        offers=detail.offers,
        lending=detail.lending,
    )


def offered_pool_from_detail(detail: PoolDetail, tenant_id: str, offered_to: str) -> OfferedPool:
    """What `offerPool` answers: the pool as `offered_to` sees it (the seed's rule), as an
    OfferedPool whose cache identity is not the acting tenant's Pool."""
    return offered_pool_from_view(
        detail.pool,
        tenant_id,
        offered_to,
        quotas=detail.quotas,
        capacity=detail.capacity,
        offers=detail.offers,
        lending=detail.lending,
    )
