"""Pools for a response: domain views plus the nested lists the query selects, loaded for
every pool at once through the request's DataLoaders (one batch per kind of row)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from app.capacity.access import capacity_denied, offers_denied, sees_offers
from app.capacity.lending import with_lending
from app.capacity.views import CapacityView, OfferView, PoolDetail, PoolView, QuotaView
from app.iam.principal import Principal
from schema.context import Context
from schema.types.pool import Denied, Pool, pool_from_view

_NOT_LOADED: tuple[()] = ()


async def build_pools(
    ctx: Context,
    principal: Principal,
    tenant_id: str,
    views: Sequence[PoolView],
    selected: set[str],
    *,
    quotas: dict[str, tuple[QuotaView, ...]] | None = None,
) -> list[Pool]:
    """`selected` names the Pool fields the query asks for; only those are loaded.
    Per-pool IAM (capacity, offers) is decided over each view's loaded authz row."""
    loaders = ctx.loaders
    capacity_denials = {
        v.id: capacity_denied(principal, v) for v in views if "capacity" in selected
    }
    wants_offers = "offers" in selected or "lending" in selected
    # Only an owned pool has offers (or lending) to show; any other answers null, no error.
    offer_denials = {
        v.id: offers_denied(principal, v) for v in views if wants_offers and v.owned
    }
    # The lender's columns on capacity rows: where the caller may read both.
    lend_ids = [
        v.id
        for v in views
        if "capacity" in selected and capacity_denials[v.id] is None and sees_offers(principal, v)
    ]
    want_quotas = "quotas" in selected and quotas is None
    cap_ids = [pool_id for pool_id, denied in capacity_denials.items() if denied is None]
    offer_ids = [pool_id for pool_id, denied in offer_denials.items() if denied is None]

    quota_ids = [v.id for v in views] if want_quotas else []
    loaded_quotas, loaded_capacity, loaded_offers, loaded_lent = await asyncio.gather(
        # Keyed by the granting tenant: the rows the viewer books against (its own, or an
        # ancestor's whose offer includes descendants).
        loaders.quotas.load_many([(v.grant.tenant_id, v.id) for v in views if want_quotas]),
        loaders.capacity.load_many(cap_ids),
        loaders.offers.load_many(offer_ids),
        loaders.guest_totals.load_many(lend_ids),
    )
    quota_map = quotas if quotas is not None else dict(zip(quota_ids, loaded_quotas, strict=True))
    capacity_map = dict(zip(cap_ids, loaded_capacity, strict=True))
    offer_map = dict(zip(offer_ids, loaded_offers, strict=True))
    lent_map = dict(zip(lend_ids, loaded_lent, strict=True))

    def capacity_of(view: PoolView) -> Sequence[CapacityView] | Denied | None:
        if "capacity" not in selected:
            return None
        denied = capacity_denials[view.id]
        if denied is not None:
            return denied
        if view.id in lent_map:
            return with_lending(capacity_map[view.id], lent_map[view.id])
        return capacity_map[view.id]

    def offers_of(view: PoolView) -> Sequence[OfferView] | Denied | None:
        if "offers" not in selected or not view.owned:
            return None
        return offer_denials[view.id] or offer_map[view.id]

    def lending_of(view: PoolView) -> Sequence[OfferView] | Denied | None:
        if "lending" not in selected or not view.owned:
            return None
        denied = offer_denials[view.id]
        if denied is not None:
            return denied
        return [o for o in offer_map[view.id] if o.tenant_id != view.tenant_id]

    return [
        pool_from_view(
            v,
            tenant_id,
            quotas=quota_map.get(v.id, _NOT_LOADED),
            capacity=capacity_of(v),
            offers=offers_of(v),
            lending=lending_of(v),
        )
        for v in views
    ]


async def pool_from_detail(
    ctx: Context, principal: Principal, tenant_id: str, detail: PoolDetail, selected: set[str]
) -> Pool:
    """A pool a domain call returned with the tenant's quota rows (mutations, get)."""
    (pool,) = await build_pools(
        ctx, principal, tenant_id, [detail.pool], selected, quotas={detail.pool.id: detail.quotas}
    )
    return pool
