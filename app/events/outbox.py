"""The outbox: pool events written in the same transaction as the change they describe.

Cursors must follow commit order, so a reader resuming after N never skips an event
that commits later with a smaller number. A sequence alone does not give that (numbers
are taken before commit). On PostgreSQL every writer takes one transaction-scoped
advisory lock as the last step before inserting its events; the lock is held until
commit, so numbers are drawn and become visible in the same order. SQLite serialises
all writers already. See docs/decisions/0002-commit-ordered-outbox.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from sqlalchemy import insert, text
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Event, EventAudience, utcnow

EVENT_TYPES: Final = (
    "pool.created",
    "pool.offered",
    "pool.unoffered",
    "pool.updated",
    "pool.archived",
)
# Any constant works; it only has to be the same for every writer.
OUTBOX_LOCK_KEY: Final = 0x62635F6F7574  # "bc_out"


@dataclass(frozen=True, slots=True)
class PendingEvent:
    type: str
    pool_id: str
    tenant_id: str  # the actor's tenant
    data: dict[str, Any]
    audience: frozenset[str] = field(default_factory=frozenset)


async def append_events(session: AsyncSession, events: Iterable[PendingEvent]) -> int | None:
    """Insert the events; returns the newest seq. Call last, right before commit."""
    pending = list(events)
    if not pending:
        return None
    if session.get_bind().dialect.name == "postgresql":
        # Held until commit: the next writer draws its numbers only after ours are visible.
        await session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": OUTBOX_LOCK_KEY})
    now = utcnow()
    # One statement however many events; seqs come back in the order of `pending`.
    seqs = (
        (
            await session.execute(
                insert(Event).returning(Event.seq, sort_by_parameter_order=True),
                [
                    {
                        "type": item.type,
                        "pool_id": item.pool_id,
                        "tenant_id": item.tenant_id,
                        "occurred_at": now,
                        "data": item.data,
                    }
                    for item in pending
                ],
            )
        )
        .scalars()
        .all()
    )
    audience = [
        {"seq": seq, "tenant_id": tenant}
        for seq, item in zip(seqs, pending, strict=True)
        for tenant in sorted(item.audience)
    ]
    if audience:
        await session.execute(insert(EventAudience), audience)
    return max(seqs)
