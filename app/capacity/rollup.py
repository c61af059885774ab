"""The capacity rollup: one row per resource, following the pool's nodes and policy.

`gpu` counts whole GPUs; mig pools add `gpu.mig` (GPUs x instances in migLayout);
timeslice and mps pools add `gpu.slot` (GPUs x sharing.replicas). A change never
takes back what is booked: `allocatable` stays at least `booked` until bookings end.
"""

from __future__ import annotations

from sqlalchemy import bindparam, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.capacity.policy import mig_instances_per_gpu, replicas
from app.db.models import CapacityRow, Node, Pool


def resources_for(sharing: str, policy: dict[str, object], gpus: int) -> dict[str, int]:
    units = {"gpu": gpus}
    if sharing == "mig":
        units["gpu.mig"] = gpus * mig_instances_per_gpu(policy)
    elif sharing in ("timeslice", "mps"):
        units["gpu.slot"] = gpus * replicas(policy)
    return units


# The pool's nodes' GPUs, and its rollup rows locked with those GPUs beside each (one
# statement; a release committing meanwhile must not leave us a stale `booked`). Built once.
_GPUS = (
    select(func.coalesce(func.sum(Node.gpus), 0))
    .where(Node.pool_id == bindparam("pool_id"))
    .scalar_subquery()
)
_LOCKED_ROWS = (
    select(CapacityRow, _GPUS.label("gpus"))
    .where(CapacityRow.pool_id == bindparam("pool_id"))
    .order_by(CapacityRow.resource)
    .with_for_update(of=CapacityRow)
)
_GPUS_ALONE = select(_GPUS)


async def refresh_rollup(session: AsyncSession, pool: Pool) -> None:
    """Recompute totals from the nodes; callers hold the pool row lock."""
    params = {"pool_id": pool.id}
    found = (await session.execute(_LOCKED_ROWS, params)).all()
    rows = {r.CapacityRow.resource: r.CapacityRow for r in found}
    # A pool with no rows yet (no node ever joined) reads its GPUs alone.
    gpus = found[0].gpus if found else (await session.execute(_GPUS_ALONE, params)).scalar_one()
    units = resources_for(pool.sharing, pool.policy, int(gpus))
    for resource, total in units.items():
        row = rows.get(resource)
        if row is None:
            session.add(
                CapacityRow(
                    pool_id=pool.id, resource=resource, total=total, allocatable=total, booked=0
                )
            )
        else:
            row.total = total
            row.allocatable = max(total, row.booked)
    for resource, row in rows.items():
        if resource not in units:
            row.total = 0
            row.allocatable = row.booked
