"""The unit of work: one transaction, committed once at the end, with its events.

Application code never commits. Events are written to the outbox in the same
transaction, and the wake-up is published only after the commit succeeded.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from types import TracebackType

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.engine import Database
from app.db.session_rows import SessionRows
from app.db.session_statements import SessionStatements
from app.events.cursor import Position
from app.events.outbox import PendingEvent, append_events, lock_pool_for_events

log = logging.getLogger(__name__)

Notify = Callable[[Position], Awaitable[None]]  # the newest position committed


class UnitOfWork:
    def __init__(self, db: Database, notify: Notify | None = None) -> None:
        self._db = db
        self._notify = notify
        self._events: list[PendingEvent] = []
        self.session: AsyncSession
        self.rows: SessionRows  # the inventory rows (app/db/inventory_rows.py) in `session`
        # Core statements in `session`'s transaction (app/db/session_statements.py)
        self.statements: SessionStatements

    @property
    def dialect(self) -> str:
        return self._db.dialect

    def emit(self, event: PendingEvent) -> None:
        """Queue an event, written at commit. Its pool must have been locked by this
        transaction (app/capacity/access.lock_owned_pool) or created by it: see
        app/events/outbox.py."""
        self._events.append(event)

    async def lock_pool(self, pool_id: str) -> bool:
        """Lock a pool's row for its events, when nothing else locks it (tools, tests)."""
        return await lock_pool_for_events(self.session, pool_id)

    def met_a_dead_connection(self, exc: BaseException) -> bool:
        """Whether `exc` is a connection found dead on this unit of work's first statement:
        nothing was sent that the server kept, so the work may run again on a new
        connection (app/db/engine.py: no ping on checkout)."""
        return (
            isinstance(exc, DBAPIError)
            and exc.connection_invalidated
            and not self.statements.answered
        )

    async def __aenter__(self) -> UnitOfWork:
        self.session = AsyncSession(self._db.writer, expire_on_commit=False)
        self.rows = SessionRows(self.session)
        self.statements = SessionStatements(self.session, self._db.driver)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        newest: Position | None = None
        try:
            if exc_type is None:
                newest = await append_events(self.statements, self._events)
                await self.session.commit()
            else:
                await self.session.rollback()
        finally:
            await self.session.close()
        if newest is not None and self._notify is not None:
            try:
                await self._notify(newest)
            except Exception:
                # The outbox is the source of truth; the relay's poll covers a lost wake-up.
                log.warning("event wake-up not published", exc_info=True)
