"""Idempotent creates: the id is derived from (tenant, caller, key), and a record of the
first call's parameters turns a retry into a read of what it made (or CONFLICT)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Table, bindparam, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import IdempotencyRecord, utcnow
from app.db.session_statements import SessionStatements
from app.errors import Conflict
from app.ids import derived_id, new_id


@dataclass
class IdempotentCreate:
    method: str
    prefix: str
    tenant_id: str
    caller_id: str
    key: str | None
    fingerprint: dict[str, Any]  # what a retry must repeat
    conflict: str  # says what differs when it does not
    resource_id: str = field(init=False)

    def __post_init__(self) -> None:
        self.resource_id = (
            new_id(self.prefix)
            if self.key is None
            else derived_id(self.prefix, self.tenant_id, self.caller_id, self.key)
        )

    async def is_retry(self, statements: SessionStatements | AsyncSession) -> bool:
        """True when the first call already made `resource_id`; CONFLICT if it differed."""
        if self.key is None:
            return False
        stored = (await _statements(statements).execute(_STORED, {"rid": self.resource_id})).first()
        return self.repeats(None if stored is None else stored.fingerprint)

    def repeats(self, stored: dict[str, Any] | None) -> bool:
        """`is_retry` over the fingerprint already read (`STORED_FINGERPRINT`, folded into a
        write's first read): None when no first call made `resource_id`."""
        if self.key is None or stored is None:
            return False
        if stored != self.fingerprint:
            raise Conflict(self.conflict, field="idempotencyKey")
        return True

    async def remember(self, statements: SessionStatements | AsyncSession) -> None:
        """Record the call first: a concurrent twin fails on this key (an IntegrityError)
        and retries as a read."""
        record = self.record()
        if record is not None:
            await _statements(statements).execute(_REMEMBER, record)

    def record(self) -> dict[str, Any] | None:
        """The row `remember` inserts (None without a key), for a write that inserts it
        beside its own rows in one statement."""
        if self.key is None:
            return None
        return {
            "resource_id": self.resource_id,
            "method": self.method,
            "tenant_id": self.tenant_id,
            "caller_id": self.caller_id,
            "key": self.key,
            "fingerprint": self.fingerprint,
            "created_at": utcnow(),
        }


_RECORDS: Table = IdempotencyRecord.__table__  # type: ignore[assignment]
# Built once (the unit of work's statements run them).
_STORED = select(_RECORDS.c.fingerprint).where(_RECORDS.c.resource_id == bindparam("rid"))
# The same, as a column of a write's first read (bound `rid`: the call's resource_id).
STORED_FINGERPRINT = _STORED.scalar_subquery()
_REMEMBER = insert(_RECORDS)
RECORDS = _RECORDS


def _statements(given: SessionStatements | AsyncSession) -> SessionStatements:
    return SessionStatements(given, None) if isinstance(given, AsyncSession) else given
