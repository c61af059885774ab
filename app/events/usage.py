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

- PostgreSQL: h = reader.PG_HORIZON, as the outbox's: every transaction of this database
  with a smaller id has ended, so every row it stamped is visible now, and a
  transaction still running (or one that starts later) stamps `>= h`;
- SQLite: h = one more than the largest committed stamp; a writer in progress stamps
  `>= h`.

Either way a row stamped below h is in the snapshot and a row that is not yet visible is
stamped at or above h, so reading [since, h) and then [h, h') misses no change.

One read is bounded: it takes at most `limit` rows (`usage_round_rows`, default
`USAGE_ROUND_ROWS`), in (stamp, key) order, key = (pool, quota tenant or "" for a capacity
row, resource), unique per row. Where it stops is a `UsageMark` (the last row read; the
horizon itself when fewer rows were left), and the next read starts past that mark, so a
backlog (a resume after an outbox cursor reads from stamp 1) is read over several reads,
oldest first, and one stamp shared by more rows than the limit (one transaction on
PostgreSQL, one statement on SQLite) is read across several too: every read past a mark
that is below h returns at least one row, so each moves on. A mark below h stays valid: a
row written after the read is stamped at or above h, so never at a mark's stamp, and a
row stamped again moves up (its newer stamp is read later). Each table's part stops after
`limit` rows of its `usage_tx` index order (plus, on PostgreSQL, the rest of the last
stamp's rows for the sort), so the database does bounded work too. Keys are compared
byte by byte (`COLLATE "C"` on PostgreSQL, SQLite's BINARY), as Python compares the
marks.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    Integer,
    String,
    and_,
    bindparam,
    literal,
    or_,
    select,
    true,
    union_all,
)
from sqlalchemy.sql.expression import FunctionElement

from app.db.collation import CodePoint
from app.db.dialect_sql import per_dialect
from app.db.engine import Executor
from app.db.models import CapacityRow, QuotaRow
from app.events.reader import PG_HORIZON

USAGE_EVENT: Final = "pool.usage"
# Rows one read takes at most (the default of `usage_round_rows`, app/config.py).
USAGE_ROUND_ROWS: Final = 1000

_SQLITE_NEWEST = (
    "(SELECT max(m) FROM (SELECT coalesce(max(usage_tx), 0) AS m FROM quota_rows"
    " UNION ALL SELECT coalesce(max(usage_tx), 0) FROM capacity_rows)) + 1"
)


class UsageStamp(FunctionElement[int]):
    """The value a booking or release writes into `usage_tx` (module docstring)."""

    type = BigInteger()
    name = "usage_stamp"
    inherit_cache = True


per_dialect(
    UsageStamp, default=f"({_SQLITE_NEWEST})", postgresql="pg_current_xact_id()::text::bigint"
)


class UsageHorizon(FunctionElement[int]):
    """Every stamp below it is visible to the statement's snapshot (module docstring)."""

    type = BigInteger()
    name = "usage_horizon"
    inherit_cache = True


# On PostgreSQL the outbox's horizon: this database's transactions only.
per_dialect(UsageHorizon, default=f"({_SQLITE_NEWEST})", postgresql=PG_HORIZON)


@dataclass(frozen=True, slots=True, order=True)
class UsageMark:
    """How far the stamps are read: every row stamped below `stamp`, and of those stamped
    `stamp` every row whose key (pool, quota tenant or "" for capacity, resource) is at
    most `key` (none when `key` is empty). Ordered as the rows are read."""

    stamp: int
    key: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class UsageChange:
    """A row set whose usage moved: the pool, the quota rows' tenant (None for the pool's
    capacity rows) and the mark of the last of its rows read."""

    pool_id: str
    tenant_id: str | None
    mark: UsageMark


@dataclass(frozen=True, slots=True)
class UsageChanges:
    """The horizon, how far this read reaches (`reach`: the horizon itself, or the last row
    read when the read stopped at its limit), the row sets read and how many rows."""

    horizon: int
    reach: UsageMark
    changes: tuple[UsageChange, ...]
    rows: int = 0

    @property
    def complete(self) -> bool:
        """Whether the read reached the horizon (it stopped short of the limit)."""
        return self.reach == UsageMark(self.horizon)


def _after(keyed: bool, stamp: Any, key: tuple[Any, ...]) -> Any:
    """Rows past the mark (binds `since`, and `k0`..`k2` when `keyed`), below it on the
    stamp (the read's range starts at the mark's stamp)."""
    if not keyed:
        return true()
    marks = [bindparam(f"k{n}", type_=String()) for n in range(len(key))]
    past: Any = CodePoint(key[-1]) > marks[-1]
    for column, value in zip(reversed(key[:-1]), reversed(marks[:-1]), strict=True):
        past = or_(CodePoint(column) > value, and_(column == value, past))
    return or_(stamp > bindparam("since", type_=BigInteger()), past)


def _stamped(keyed: bool, horizon: Any) -> Any:
    """The first `limit` rows past the mark stamped below `horizon`, in (stamp, key)
    order, of either table: each table's read stops after `limit` rows of its index
    order. Binds `since`, `limit` and, when `keyed`, the mark's key."""
    reads = []
    for stamp, key in (
        (QuotaRow.usage_tx, (QuotaRow.pool_id, QuotaRow.tenant_id, QuotaRow.resource)),
        (CapacityRow.usage_tx, (CapacityRow.pool_id, literal(""), CapacityRow.resource)),
    ):
        read = (
            select(
                key[0].label("pool_id"),
                key[1].label("tenant_key"),
                key[2].label("resource"),
                stamp.label("stamp"),
            )
            .where(
                stamp >= bindparam("since", type_=BigInteger()),
                stamp < horizon,
                _after(keyed, stamp, key),
            )
            .order_by(stamp, *(CodePoint(c) for c in key))
            .limit(bindparam("limit", type_=Integer()))
            .subquery()
        )
        reads.append(select(*read.c))
    return union_all(*reads).subquery("stamped")


def _horizon_cte() -> Any:
    return select(UsageHorizon().label("h")).cte("h")


@cache
def _changes_statement(keyed: bool) -> Any:
    """The read of usage_changes, built once per shape (a mark with or without a key):
    built every round (ten a second) it cost more CPU than the relay's fan-out."""
    h = _horizon_cte()
    stamped = _stamped(keyed, select(h.c.h).scalar_subquery())
    key = (stamped.c.pool_id, stamped.c.tenant_key, stamped.c.resource)
    return (
        select(h.c.h, stamped.c.stamp, *key)
        .select_from(h)
        .outerjoin(stamped, true())
        .order_by(stamped.c.stamp, *(CodePoint(c) for c in key))
        .limit(bindparam("limit", type_=Integer()))
    )


async def usage_changes(
    executor: Executor, since: UsageMark | None, *, limit: int = USAGE_ROUND_ROWS
) -> UsageChanges:
    """The horizon now and, with `since`, the first `limit` rows past it stamped below the
    horizon (stamp, then key order), read in one statement and grouped into row sets.
    Without `since`, the horizon alone (a starting point)."""
    if since is None:
        h = _horizon_cte()
        horizon = int((await executor.execute(select(h.c.h))).scalar_one())
        return UsageChanges(horizon, UsageMark(horizon), ())
    if limit < 1:
        raise ValueError("a usage read takes at least one row")
    bound: dict[str, int | str] = {"since": since.stamp, "limit": limit}
    bound.update({f"k{n}": value for n, value in enumerate(since.key)})
    rows = (await executor.execute(_changes_statement(bool(since.key)), bound)).all()
    horizon = int(rows[0].h)
    marks = [
        UsageMark(int(r.stamp), (r.pool_id, r.tenant_key, r.resource))
        for r in rows
        if r.pool_id is not None
    ]
    marks.sort()  # as the statement ordered them
    reach = marks[-1] if len(marks) == limit else UsageMark(horizon)
    last: dict[tuple[str, str], UsageMark] = {}
    for mark in marks:
        last[mark.key[0], mark.key[1]] = mark  # ascending: the last one is the largest
    return UsageChanges(
        horizon,
        reach,
        tuple(
            UsageChange(pool_id, tenant or None, mark)
            for (pool_id, tenant), mark in sorted(last.items())
        ),
        len(marks),
    )
