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
from app.db.lease import Lease
from app.db.session_rows import SessionRows
from app.db.session_statements import SessionStatements
from app.events.cursor import Position
from app.events.outbox import PendingEvent, append_events, lock_pool_for_events

log = logging.getLogger(__name__)

Notify = Callable[[Position], Awaitable[None]]  # the newest position committed
# The caller-check parameters of a unit of work with no remembered caller (always live).
NO_CALLER: dict[str, str | None] = {"token": None, "role": None}


class CallerChanged(Exception):
    """The remembered caller's token is no longer live or its binding changed: the write
    wrote nothing (it rolled back); the transport looks the caller up and runs it again."""


class UnitOfWork:
    def __init__(self, db: Database, notify: Notify | None = None) -> None:
        self._db = db
        self._notify = notify
        self._events: list[PendingEvent] = []
        # The connection leased without a session (app/db/lease.py), where the fence
        # allows; else None, and the session holds the connection.
        self._lease: Lease | None = None
        # Core statements in the transaction (app/db/session_statements.py)
        self.statements: SessionStatements
        self._rows: SessionRows | None = None
        # A remembered caller's token and role (Capacity.token_checked), checked in this
        # transaction before it commits: by a statement of the write that carries the
        # check (`caller_params`, then `caller_seen`), else by one of its own.
        self.caller: dict[str, str] | None = None
        self.caller_checked = False
        self.committing = False  # COMMIT sent: a dead connection is no longer run again

    @property
    def dialect(self) -> str:
        return self._db.dialect

    @property
    def leased(self) -> bool:
        """Whether this unit of work leased its connection (app/db/lease.py)."""
        return self._lease is not None

    @property
    def session(self) -> AsyncSession:
        """The ORM session in this transaction (on a lease, made on first use)."""
        return self.statements.session

    @property
    def rows(self) -> SessionRows:
        """The inventory rows (app/db/inventory_rows.py) in `session`."""
        if self._rows is None:
            self._rows = SessionRows(self.session)
        return self._rows

    def emit(self, event: PendingEvent) -> None:
        """Queue an event, written at commit. Its pool must have been locked by this
        transaction (app/capacity/access.lock_owned_pool) or created by it: see
        app/events/outbox.py."""
        self._events.append(event)

    async def lock_pool(self, pool_id: str) -> bool:
        """Lock a pool's row for its events, when nothing else locks it (tools, tests)."""
        return await lock_pool_for_events(self.session, pool_id)

    def caller_params(self) -> dict[str, str | None]:
        """The bound parameters of read_rules.caller_live for this unit of work."""
        return NO_CALLER if self.caller is None else {**self.caller}

    def caller_seen(self, live: bool) -> None:
        """What a statement carrying the caller check found: CallerChanged if not live."""
        if self.caller is None:
            return
        if not live:
            raise CallerChanged
        self.caller_checked = True

    def met_a_dead_connection(self, exc: BaseException) -> bool:
        """Whether `exc` is a connection found dead before this unit of work sent its
        COMMIT: the server ends a transaction whose connection is gone without keeping
        any of it, so the work may run again on a new connection (app/db/engine.py: no
        ping on checkout). Never after COMMIT was sent: the server may have committed
        it, and running it again could write it twice."""
        return isinstance(exc, DBAPIError) and exc.connection_invalidated and not self.committing

    async def __aenter__(self) -> UnitOfWork:
        driver = self._db.driver
        if driver is not None and driver.leases:
            self._lease = await Lease.checkout(self._db.writer)
            self.statements = SessionStatements(self._lease, driver)
        else:
            session = AsyncSession(self._db.writer, expire_on_commit=False)
            self.statements = SessionStatements(session, driver)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        newest: Position | None = None
        lease = self._lease
        try:
            if exc_type is None:
                newest = await append_events(self.statements, self._events)
                await self.statements.send_later()  # what no event carried
                self.committing = True
                await (lease.commit() if lease is not None else self.session.commit())
            else:
                await (lease.rollback() if lease is not None else self.session.rollback())
        finally:
            await (lease.close() if lease is not None else self.session.close())
        if newest is not None and self._notify is not None:
            try:
                await self._notify(newest)
            except Exception:
                # The outbox is the source of truth; the relay's poll covers a lost wake-up.
                log.warning("event wake-up not published", exc_info=True)
