"""Dry runs of unoffer and archive: what the call would change, computed under the same
lock and after the same checks as the real call, writing nothing (CONTRACT section 10)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.capacity.access import LockedPool, reads_offers
from app.capacity.bounds import MAX_IMPACT_ITEMS
from app.capacity.reads import reservation_view
from app.capacity.views import ImpactView
from app.db.models import AuthzRow, Offer, Pool, QuotaRow, Reservation, Tenant
from app.iam.decisions import PoolAttributes
from app.iam.principal import Principal


async def _descendants(session: AsyncSession, roots: Iterable[str]) -> set[str]:
    roots = list(roots)
    if not roots:
        return set()
    tree = select(Tenant.id).where(Tenant.parent_id.in_(roots)).cte("tree", recursive=True)
    tree = tree.union_all(select(Tenant.id).join(tree, Tenant.parent_id == tree.c.id))
    return set((await session.execute(select(tree.c.id))).scalars())


async def _seeing(session: AsyncSession, offers: Mapping[str, bool]) -> set[str]:
    """Every tenant that sees a (non-archived) pool with these offers: {tenant:
    includeDescendants}: the offered tenants and the descendants their offers reach."""
    reached = await _descendants(session, [t for t, desc in offers.items() if desc])
    return set(offers) | reached


async def _impact(
    session: AsyncSession,
    principal: Principal,
    pool: Pool | LockedPool,
    ended: list[str],
    remaining: Mapping[str, bool],
    *,
    every_reservation: bool,
) -> ImpactView:
    offers = {
        o.tenant_id: o.include_descendants
        for o in (await session.execute(select(Offer).where(Offer.pool_id == pool.id))).scalars()
    }
    losing = sorted(await _seeing(session, offers) - await _seeing(session, remaining))
    rows = await session.execute(
        select(QuotaRow.tenant_id, QuotaRow.resource, QuotaRow.used)
        .where(QuotaRow.pool_id == pool.id, QuotaRow.tenant_id.in_(ended))
        .order_by(QuotaRow.tenant_id, QuotaRow.resource)
    )
    kept: dict[str, dict[str, int]] = {t: {} for t in ended}
    for r in rows:
        kept[r.tenant_id][r.resource] = r.used
    owner_row = await session.get_one(AuthzRow, (pool.tenant_id, pool.id))
    attributes = PoolAttributes(
        owner_row.gpu_model, owner_row.pool_class, owner_row.sharing, owner_row.region, True
    )
    shows_guests = reads_offers(principal, True, attributes)
    query = select(Reservation.__table__).where(
        Reservation.pool_id == pool.id, Reservation.state == "active"
    )
    if not every_reservation:
        query = query.where(Reservation.tenant_id.in_(losing))
    if not shows_guests:
        # As pool.archived's event shows it: no guest's data to a caller without share.
        query = query.where(Reservation.tenant_id == pool.tenant_id)
    # One more than is listed tells whether the list was cut.
    found = await session.execute(query.order_by(Reservation.id).limit(MAX_IMPACT_ITEMS + 1))
    reservations = [reservation_view(r) for r in found]
    if not shows_guests:
        losing, kept, ended = [], {}, []
    truncated = len(losing) > MAX_IMPACT_ITEMS or len(reservations) > MAX_IMPACT_ITEMS
    return ImpactView(
        tenants_losing_access=tuple(losing[:MAX_IMPACT_ITEMS]),
        quota_kept=kept,
        reservations=tuple(reservations[:MAX_IMPACT_ITEMS]),
        offers_ended=tuple(ended),
        truncated=truncated,
    )


async def unoffer_impact(
    session: AsyncSession, principal: Principal, pool: Pool | LockedPool, tenant_id: str
) -> ImpactView:
    offers = (await session.execute(select(Offer).where(Offer.pool_id == pool.id))).scalars()
    remaining = {o.tenant_id: o.include_descendants for o in offers if o.tenant_id != tenant_id}
    ended = [tenant_id] if await session.get(Offer, (pool.id, tenant_id)) else []
    return await _impact(session, principal, pool, ended, remaining, every_reservation=False)


async def archive_impact(
    session: AsyncSession, principal: Principal, pool: Pool | LockedPool
) -> ImpactView:
    if pool.archived:  # archiving again changes nothing
        return ImpactView((), {}, (), ())
    offers = (await session.execute(select(Offer).where(Offer.pool_id == pool.id))).scalars()
    ended = [o.tenant_id for o in offers if o.tenant_id != pool.tenant_id]
    # Once archived only the owner sees the pool (its descendants included, whatever its
    # own offer says).
    remaining = {pool.tenant_id: False}
    return await _impact(session, principal, pool, ended, remaining, every_reservation=True)
