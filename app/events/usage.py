"""Usage stamps: which pools' usage moved between two horizons (`pool.usage`, CONTRACT
section 10; docs/decisions/0012-commit-ordered-positions.md, section "`pool.usage`").

A booking or a release writes no outbox row. The guarded UPDATE it already makes of each
quota and capacity row also sets the row's `usage_tx` to `UsageStamp()`:

- PostgreSQL: the writing transaction's id, as the outbox's `tx` (outbox.CurrentTx);
- SQLite: one more than the largest stamp of either table. SQLite has one writer at a
  time, and a write transaction always sees every commit before it, so a stamp is larger
  than every committed one (rows are never deleted, so the largest never goes back).

`usage_changes` reads, in one statement (one snapshot), a horizon h and the rows stamped
in [since, h):

- PostgreSQL: h = `pg_snapshot_xmin(pg_current_snapshot())`, as reader.Horizon: every
  transaction with a smaller id has ended, so every row it stamped is visible now, and a
  transaction still running (or one that starts later) stamps `>= h`;
- SQLite: h = one more than the largest committed stamp; a writer in progress stamps
  `>= h`.

Either way a row stamped below h is in the snapshot and a row that is not yet visible is
stamped at or above h, so reading [since, h) and then [h, h') misses no change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import BigInteger, func, literal, null, select, true, union_all
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import FunctionElement

from app.db.engine import Executor
from app.db.models import CapacityRow, QuotaRow

USAGE_EVENT: Final = "pool.usage"

_SQLITE_NEWEST = (
    "(SELECT max(m) FROM (SELECT coalesce(max(usage_tx), 0) AS m FROM quota_rows"
    " UNION ALL SELECT coalesce(max(usage_tx), 0) FROM capacity_rows)) + 1"
)


class UsageStamp(FunctionElement[int]):
    """The value a booking or release writes into `usage_tx` (module docstring)."""

    type = BigInteger()
    name = "usage_stamp"
    inherit_cache = True


@compiles(UsageStamp)
def _stamp(element: UsageStamp, compiler: SQLCompiler, **kw: Any) -> str:
    return f"({_SQLITE_NEWEST})"


@compiles(UsageStamp, "postgresql")
def _stamp_pg(element: UsageStamp, compiler: SQLCompiler, **kw: Any) -> str:
    return "pg_current_xact_id()::text::bigint"


class UsageHorizon(FunctionElement[int]):
    """Every stamp below it is visible to the statement's snapshot (module docstring)."""

    type = BigInteger()
    name = "usage_horizon"
    inherit_cache = True


@compiles(UsageHorizon)
def _horizon(element: UsageHorizon, compiler: SQLCompiler, **kw: Any) -> str:
    return f"({_SQLITE_NEWEST})"


@compiles(UsageHorizon, "postgresql")
def _horizon_pg(element: UsageHorizon, compiler: SQLCompiler, **kw: Any) -> str:
    return "pg_snapshot_xmin(pg_current_snapshot())::text::bigint"


@dataclass(frozen=True, slots=True)
class UsageChange:
    """A row set whose usage moved: the pool, the quota rows' tenant (None for the pool's
    capacity rows) and the newest stamp among them."""

    pool_id: str
    tenant_id: str | None
    stamp: int


@dataclass(frozen=True, slots=True)
class UsageChanges:
    horizon: int
    changes: tuple[UsageChange, ...]


def _changed(since: Any, horizon: Any) -> Any:
    quota = (
        select(
            QuotaRow.pool_id.label("pool_id"),
            QuotaRow.tenant_id.label("tenant_id"),
            func.max(QuotaRow.usage_tx).label("stamp"),
        )
        .where(QuotaRow.usage_tx >= since, QuotaRow.usage_tx < horizon)
        .group_by(QuotaRow.pool_id, QuotaRow.tenant_id)
    )
    capacity = (
        select(
            CapacityRow.pool_id.label("pool_id"),
            null().label("tenant_id"),
            func.max(CapacityRow.usage_tx).label("stamp"),
        )
        .where(CapacityRow.usage_tx >= since, CapacityRow.usage_tx < horizon)
        .group_by(CapacityRow.pool_id)
    )
    return union_all(quota, capacity).subquery("changed")


async def usage_changes(executor: Executor, since: int | None) -> UsageChanges:
    """The horizon now and, with `since`, every row set stamped in [since, horizon), read in
    one statement. Without `since`, the horizon alone (a starting point)."""
    h = select(UsageHorizon().label("h")).cte("h")
    if since is None:
        return UsageChanges(int((await executor.execute(select(h.c.h))).scalar_one()), ())
    changed = _changed(literal(since, BigInteger()), select(h.c.h).scalar_subquery())
    rows = (
        await executor.execute(
            select(h.c.h, changed.c.pool_id, changed.c.tenant_id, changed.c.stamp)
            .select_from(h)
            .outerjoin(changed, true())
            .order_by(changed.c.pool_id, changed.c.tenant_id)
        )
    ).all()
    horizon = int(rows[0].h)
    return UsageChanges(
        horizon,
        tuple(
            UsageChange(r.pool_id, r.tenant_id, int(r.stamp)) for r in rows if r.pool_id is not None
        ),
    )
