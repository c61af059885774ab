"""The lender's view (CONTRACT section 10): for a pool's owner, what it lent to guests
against what the pool has. Shown to whoever reads the pool's offers (owner + share).

What a pool lent, and how the owner's rows rank by it, are read_rules' (`capacity_lent`,
`lending_order`), as the compiled reads' (json_reads): summed and ranked by the database."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import Row, bindparam, select

from app.capacity.access import resolve_actor, sees_offers
from app.capacity.inputs import LendingInput
from app.capacity.read_rules import capacity_lent, lending_order, whole
from app.capacity.reads import Actor, capacity_of, visible_pools
from app.capacity.views import CapacityView, LendingRowView, PoolView
from app.catalog import LENDING
from app.db.engine import Executor
from app.db.models import CapacityRow
from app.iam.principal import Principal

# {pool_id: {resource: (sum of guest maxima, sum of guest used)}}
GuestTotals = dict[str, dict[str, tuple[int, int]]]

# The capacity rows of some pools of one owner, with what each lent; built once, the
# owner and the pools bound per call.
_LENT = capacity_lent(
    bindparam("owner"), CapacityRow.pool_id.in_(bindparam("pool_ids", expanding=True))
).subquery("lent")
_TOTALS = select(_LENT)
# ... the first `first` of them in the owner's ranking.
_RANKED = select(_LENT).order_by(*lending_order(_LENT)).limit(bindparam("first"))


def _sums(row: Row[Any]) -> tuple[int, int]:
    """`offered` and `guestUsed` of a `capacity_lent` row, exact (from their halves)."""
    offered = whole(row.offered_high, row.offered_low)
    return offered, whole(row.guest_used_high, row.guest_used_low)


def _by_owner(pools: Sequence[PoolView]) -> dict[str, list[str]]:
    owned: dict[str, list[str]] = defaultdict(list)
    for pool in pools:
        owned[pool.tenant_id].append(pool.id)
    return owned


async def guest_totals(executor: Executor, pools: Sequence[PoolView]) -> GuestTotals:
    """Per pool and resource, the sums of the guests' quota maxima and use."""
    totals: GuestTotals = {p.id: {} for p in pools}
    for owner, ids in _by_owner(pools).items():
        for r in await executor.execute(_TOTALS, {"owner": owner, "pool_ids": ids}):
            totals[r.pool_id][r.resource] = _sums(r)
    return totals


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
    totals = await guest_totals(executor, [p for p in pools if sees_offers(principal, p)])
    return {
        pool_id: with_lending(rows[pool_id], totals[pool_id])
        if pool_id in totals
        else rows[pool_id]
        for pool_id in ids
    }


async def lending(
    executor: Executor, principal: Principal, inp: LendingInput
) -> list[LendingRowView]:
    """The capacity rows of the tenant's live pools the caller may share, with what is
    lent, the most overcommitted first (read_rules.lending_order): the first `first` of
    the owner's whole fleet, in one request."""
    actor: Actor = await resolve_actor(executor, principal, inp.tenant_id, LENDING)
    pools = [p for p in await visible_pools(executor, actor) if p.owned and not p.archived]
    ids = [p.id for p in pools if sees_offers(principal, p)]
    if not ids:
        return []
    params = {"owner": actor.tenant_id, "pool_ids": ids, "first": inp.first}
    ranked = await executor.execute(_RANKED, params)
    return [
        LendingRowView(
            r.pool_id, CapacityView(r.resource, r.total, r.allocatable, r.booked, *_sums(r))
        )
        for r in ranked
    ]
