"""The capacity rollup: one row per resource, following the pool's nodes and policy.

`gpu` counts whole GPUs; mig pools add `gpu.mig` (GPUs x instances in migLayout);
timeslice and mps pools add `gpu.slot` (GPUs x sharing.replicas). A change never
takes back what is booked: `allocatable` stays at least `booked` until bookings end.
"""

from __future__ import annotations

from sqlalchemy import Table, bindparam, func, insert, select, update

from app.capacity.access import LockedPool
from app.capacity.policy import mig_instances_per_gpu, replicas
from app.capacity.pool_rows import sync_loaded
from app.db.models import CapacityRow, Node, Pool
from app.db.session_statements import SessionStatements


def resources_for(sharing: str, policy: dict[str, object], gpus: int) -> dict[str, int]:
    units = {"gpu": gpus}
    if sharing == "mig":
        units["gpu.mig"] = gpus * mig_instances_per_gpu(policy)
    elif sharing in ("timeslice", "mps"):
        units["gpu.slot"] = gpus * replicas(policy)
    return units


_ROWS: Table = CapacityRow.__table__  # type: ignore[assignment]
# The pool's nodes' GPUs, and its rollup rows locked with those GPUs beside each (one
# statement; a release committing meanwhile must not leave us a stale `booked`). Core
# statements on the table, built once (the unit of work's statements run them).
_GPUS = (
    select(func.coalesce(func.sum(Node.gpus), 0))
    .where(Node.pool_id == bindparam("pool_id"))
    .scalar_subquery()
)
_LOCKED_ROWS = (
    select(
        _ROWS.c.resource, _ROWS.c.total, _ROWS.c.allocatable, _ROWS.c.booked, _GPUS.label("gpus")
    )
    .where(_ROWS.c.pool_id == bindparam("pool_id"))
    .order_by(_ROWS.c.resource)
    .with_for_update(of=_ROWS)
)
_GPUS_ALONE = select(_GPUS)
_ADD = insert(_ROWS)
# Each changed row in one statement (executemany), however many.
_SET = (
    update(_ROWS)
    .where(_ROWS.c.pool_id == bindparam("pool_key"), _ROWS.c.resource == bindparam("key"))
    .values(total=bindparam("set_total"), allocatable=bindparam("set_allocatable"))
)


async def refresh_rollup(statements: SessionStatements, pool: Pool | LockedPool) -> None:
    """Recompute totals from the nodes; callers hold the pool row lock."""
    params = {"pool_id": pool.id}
    found = (await statements.execute(_LOCKED_ROWS, params)).all()
    # A pool with no rows yet (no node ever joined) reads its GPUs alone.
    gpus = found[0].gpus if found else (await statements.execute(_GPUS_ALONE, params)).scalar_one()
    units = resources_for(pool.sharing, pool.policy, int(gpus))
    rows = {r.resource: r for r in found}
    added = [
        {
            "pool_id": pool.id,
            "resource": resource,
            "total": total,
            "allocatable": total,
            "booked": 0,
        }
        for resource, total in units.items()
        if resource not in rows
    ]
    changed: dict[str, tuple[int, int]] = {}
    for resource, row in rows.items():
        total = units.get(resource, 0)
        # A change never takes back what is booked.
        after = (total, max(total, row.booked))
        if after != (row.total, row.allocatable):
            changed[resource] = after
    if added:
        await statements.execute_many(_ADD, added)
    if changed:
        await statements.execute_many(
            _SET,
            [
                {"pool_key": pool.id, "key": r, "set_total": t, "set_allocatable": a}
                for r, (t, a) in sorted(changed.items())
            ],
        )
        sync_loaded(
            statements,
            CapacityRow,
            lambda row: row.pool_id == pool.id,
            lambda row: _written(changed.get(row.resource)),
        )


def _written(after: tuple[int, int] | None) -> dict[str, int] | None:
    return None if after is None else {"total": after[0], "allocatable": after[1]}
