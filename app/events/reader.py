"""Reading the outbox in commit order.

Because seqs become visible in seq order (see outbox.py), "every event with seq > N"
read now is complete up to the newest seq seen: nothing with a smaller seq can still
appear later. Every reader (the relay, a resuming subscriber) relies on that.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import delete, exists, func, select

from app.db.engine import Executor
from app.db.models import Event, EventAudience
from app.events.cursor import encode_cursor


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    """One committed event, shared read-only by every subscriber it is delivered to."""

    seq: int
    type: str
    pool_id: str
    tenant_id: str  # the actor's tenant
    occurred_at: datetime
    data: dict[str, Any]
    audience: frozenset[str]  # the tenants it is for (only those asked about, when filtered)
    # What is read for this event once and shared by every subscriber it is shown to
    # (app/capacity/event_reads.py): an init field, so a reduced view made with
    # `dataclasses.replace` shares the same dict.
    reads: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)
    # A transport's renderings of this event object, made once and shared by every
    # subscriber shown this same object with the same request (schema/executor.py).
    # Not an init field: `dataclasses.replace` (a reduced view) starts with none.
    renderings: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def cursor(self) -> str:
        return encode_cursor(self.seq)


@dataclass(frozen=True, slots=True)
class Bounds:
    oldest: int | None  # None when the outbox is empty
    newest: int  # 0 when the outbox is empty


async def outbox_bounds(executor: Executor) -> Bounds:
    row = (await executor.execute(select(func.min(Event.seq), func.max(Event.seq)))).one()
    return Bounds(oldest=row[0], newest=row[1] or 0)


async def read_events(
    executor: Executor,
    after: int,
    *,
    limit: int,
    upto: int | None = None,
    tenants: Collection[str] | None = None,
    pool_id: str | None = None,
    types: Collection[str] | None = None,
) -> list[OutboxEvent]:
    """Events with `after < seq <= upto`, oldest first, at most `limit`.

    With `tenants`, only events whose audience holds one of them, and `audience` holds
    only those tenants; `pool_id` and `types` narrow further.
    """
    query = select(Event.__table__).where(Event.seq > after).order_by(Event.seq).limit(limit)
    if upto is not None:
        query = query.where(Event.seq <= upto)
    if pool_id is not None:
        query = query.where(Event.pool_id == pool_id)
    if types is not None:
        query = query.where(Event.type.in_(list(types)))
    if tenants is not None:
        query = query.where(
            exists().where(EventAudience.seq == Event.seq, EventAudience.tenant_id.in_(tenants))
        )
    rows = (await executor.execute(query)).all()
    if not rows:
        return []
    audiences = await _audiences(executor, rows[0].seq, rows[-1].seq, tenants)
    return [
        OutboxEvent(
            seq=r.seq,
            type=r.type,
            pool_id=r.pool_id,
            tenant_id=r.tenant_id,
            occurred_at=r.occurred_at,
            data=dict(r.data),
            audience=frozenset(audiences.get(r.seq, ())),
        )
        for r in rows
    ]


async def _audiences(
    executor: Executor, first: int, last: int, tenants: Collection[str] | None
) -> dict[int, list[str]]:
    query = select(EventAudience.seq, EventAudience.tenant_id).where(
        EventAudience.seq >= first, EventAudience.seq <= last
    )
    if tenants is not None:
        query = query.where(EventAudience.tenant_id.in_(tenants))
    found: dict[int, list[str]] = defaultdict(list)
    for seq, tenant_id in (await executor.execute(query)).all():
        found[seq].append(tenant_id)
    return found


async def prune_events(executor: Executor, older_than: datetime, limit: int | None = None) -> int:
    """Delete events that occurred before `older_than`, as a prefix of the seq order, and
    never the newest one: SQLite numbers a new row max(seq) + 1, so keeping the newest
    keeps seqs from ever going back. At most `limit` events go per call, so one call is
    one short transaction however far behind pruning is. Returns how many were deleted."""
    newest_old = (
        await executor.execute(select(func.max(Event.seq)).where(Event.occurred_at < older_than))
    ).scalar_one()
    newest = (await executor.execute(select(func.max(Event.seq)))).scalar_one()
    if newest_old is None or newest is None:
        return 0
    upto = min(newest_old, newest - 1)
    if limit is not None:
        oldest = (await executor.execute(select(func.min(Event.seq)))).scalar_one()
        upto = min(upto, oldest + limit - 1)
    await executor.execute(delete(EventAudience).where(EventAudience.seq <= upto))
    result = await executor.execute(delete(Event).where(Event.seq <= upto))
    return int(getattr(result, "rowcount", 0) or 0)
