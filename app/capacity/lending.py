"""The lender's view (CONTRACT section 10): for a pool's owner, what it lent to guests
against what the pool has. Shown to whoever reads the pool's offers (owner + share)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

from sqlalchemy import bindparam

from app.capacity.access import resolve_actor, sees_offers
from app.capacity.inputs import LendingInput
from app.capacity.read_rules import guest_quotas
from app.capacity.reads import Actor, capacity_of, visible_pools
from app.capacity.views import CapacityView, LendingRowView, PoolView, guest_sums
from app.catalog import LENDING
from app.db.engine import Executor
from app.db.models import Pool, QuotaRow
from app.iam.principal import Principal

# {pool_id: {resource: (sum of guest maxima, sum of guest used)}}
GuestTotals = dict[str, dict[str, tuple[int, int]]]


# The guests' quota rows of some pools (read_rules.guest_quotas: every tenant holding an
# offer but the owner). Built once, the pools bound per call.
_GUEST_ROWS = (
    guest_quotas(Pool.__table__.c.tenant_id)
    .with_only_columns(QuotaRow.pool_id, QuotaRow.resource, QuotaRow.max, QuotaRow.used)
    .join(Pool, Pool.id == QuotaRow.pool_id)
    .where(QuotaRow.pool_id.in_(bindparam("pool_ids", expanding=True)))
)


async def guest_totals(executor: Executor, pool_ids: Sequence[str]) -> GuestTotals:
    """Per pool and resource, the guests' quota maxima and use (views.guest_sums: in
    Python, exact past 64 bits on both dialects, as the compiled read sums them)."""
    if not pool_ids:
        return {}
    rows = await executor.execute(_GUEST_ROWS, {"pool_ids": list(pool_ids)})
    held: dict[str, dict[str, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        held[r.pool_id][r.resource].append((r.max, r.used))
    return {p: {res: guest_sums(rs) for res, rs in held[p].items()} for p in pool_ids}


def with_lending(
    rows: Sequence[CapacityView], totals: dict[str, tuple[int, int]]
) -> tuple[CapacityView, ...]:
    """Capacity rows with `offered` and `guestUsed` filled in (0 where no guest has a row)."""
    return tuple(
        replace(
            r,
            offered=totals.get(r.resource, (0, 0))[0],
            guest_used=totals.get(r.resource, (0, 0))[1],
        )
        for r in rows
    )


async def lent_capacity(
    executor: Executor, principal: Principal, pools: Sequence[PoolView]
) -> dict[str, tuple[CapacityView, ...]]:
    """Each pool's capacity rows; with the lender's columns where the caller reads offers."""
    ids = [p.id for p in pools]
    rows = await capacity_of(executor, ids)
    lent = [p.id for p in pools if sees_offers(principal, p)]
    totals = await guest_totals(executor, lent)
    return {
        pool_id: with_lending(rows[pool_id], totals[pool_id])
        if pool_id in totals
        else rows[pool_id]
        for pool_id in ids
    }


def rank(row: LendingRowView) -> tuple[float, str, str]:
    """Most overcommitted first; lent capacity the pool does not have (allocatable 0) first
    of all; ties in pool and resource order. The compiled `lending` ranks by it too
    (json_reads)."""
    ratio = row.capacity.overcommit
    if ratio is None:
        ratio = math.inf if (row.capacity.offered or 0) > 0 else -1.0
    return (-ratio, row.pool_id, row.capacity.resource)


async def lending(
    executor: Executor, principal: Principal, inp: LendingInput
) -> list[LendingRowView]:
    """Every capacity row of the tenant's live pools the caller may share, with what is lent,
    the most overcommitted first: the owner's whole fleet in one request."""
    actor: Actor = await resolve_actor(executor, principal, inp.tenant_id, LENDING)
    pools = [p for p in await visible_pools(executor, actor) if p.owned and not p.archived]
    pools = [p for p in pools if sees_offers(principal, p)]
    capacity = await lent_capacity(executor, principal, pools)
    rows = [LendingRowView(p.id, row) for p in pools for row in capacity[p.id]]
    return sorted(rows, key=rank)[: inp.first]
