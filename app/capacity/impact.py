"""Dry runs of unoffer and archive: what the call would change, computed under the same
lock and after the same checks as the real call, writing nothing (CONTRACT section 10).

A call is described by the offers it ends (`ends`, a condition on an offer's tenant, as
the real call deletes them: app/capacity/offers.py) and, for archive, the pool's state
after it. Who loses sight of the pool is who sees it now less who would see it then,
both by the read rules (app/capacity/read_rules.py: `granted_tenants`, the grant read
from the authz rows down, and `pool_seen_by`), over the authz rows the call keeps; the
quota rows kept are those the ended offers give (`quota_offer`)."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import ColumnElement, Select, SQLColumnExpression, except_, not_, select, true
from sqlalchemy.ext.asyncio import AsyncSession

from app.capacity.access import LockedPool, reads_offers
from app.capacity.bounds import MAX_IMPACT_ITEMS
from app.capacity.read_rules import granted_tenants, pool_seen_by, quota_offer
from app.capacity.reads import reservation_view
from app.capacity.views import ImpactView
from app.db.models import AuthzRow, Offer, Pool, QuotaRow, Reservation
from app.iam.decisions import PoolAttributes
from app.iam.principal import Principal

# Which offers a call ends, as a condition on the offer's (or its authz row's) tenant.
Ends = Callable[[SQLColumnExpression[str]], ColumnElement[bool]]


def _seeing(
    pool_id: str, rows: ColumnElement[bool], archived: ColumnElement[bool] | None, name: str
) -> Select[tuple[str]]:
    """The tenants that see the pool through its authz rows matching `rows`, the pool
    archived or not as `archived` says (None: as it is)."""
    granted = granted_tenants(AuthzRow.pool_id == pool_id, rows, name=name)
    return (
        select(granted.c.id)
        .join(Pool.__table__, Pool.id == granted.c.pool_id)
        .where(pool_seen_by(granted.c.id, archived))
    )


async def _losing(
    session: AsyncSession, pool_id: str, ends: Ends, archived: ColumnElement[bool] | None
) -> list[str]:
    """Who sees the pool now and would not once the call has ended its offers."""
    before = _seeing(pool_id, true(), None, "granted_before")
    after = _seeing(pool_id, not_(ends(AuthzRow.tenant_id)), archived, "granted_after")
    lost = except_(before, after).subquery("lost")
    return list((await session.execute(select(lost.c.id).order_by(lost.c.id))).scalars())


async def _impact(
    session: AsyncSession,
    principal: Principal,
    pool: Pool | LockedPool,
    ends: Ends,
    *,
    archived: ColumnElement[bool] | None,
    every_reservation: bool,
) -> ImpactView:
    ended = list(
        (
            await session.execute(
                select(Offer.tenant_id)
                .where(Offer.pool_id == pool.id, ends(Offer.tenant_id))
                .order_by(Offer.tenant_id)
            )
        ).scalars()
    )
    losing = await _losing(session, pool.id, ends, archived)
    rows = await session.execute(
        select(QuotaRow.tenant_id, QuotaRow.resource, QuotaRow.used)
        .join_from(QuotaRow, Offer, quota_offer())
        .where(Offer.pool_id == pool.id, ends(Offer.tenant_id))
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
    """The tenant's offer ends (if it has one)."""

    def ends(tenant: SQLColumnExpression[str]) -> ColumnElement[bool]:
        return tenant == tenant_id

    return await _impact(session, principal, pool, ends, archived=None, every_reservation=False)


async def archive_impact(
    session: AsyncSession, principal: Principal, pool: Pool | LockedPool
) -> ImpactView:
    """Every offer but the owner's ends, and the pool is archived: seen by its owner only."""
    if pool.archived:  # archiving again changes nothing
        return ImpactView((), {}, (), ())

    def ends(tenant: SQLColumnExpression[str]) -> ColumnElement[bool]:
        return tenant != pool.tenant_id

    return await _impact(session, principal, pool, ends, archived=true(), every_reservation=True)
