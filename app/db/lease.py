"""A unit of work's pooled connection, checked out without SQLAlchemy's `Connection`
(PostgreSQL on asyncpg, not behind PgBouncer): the second strategy of a unit of work.

A session costs a unit of work CPU beyond asyncpg's own BEGIN and COMMIT
(`python -m bench.unit_of_work` prints both strategies): the session, its transaction's
state machine, a `Connection` and its transaction. A write whose statements all take
the driver path (app/db/session_statements.py) needs none of it: the lease checks a
connection out of the same pool (its checkout events, its limits, its invalidation), the
driver sends BEGIN through SQLAlchemy's own adapter (`_start_transaction`, so the adapter
knows the transaction), and COMMIT or ROLLBACK go through the adapter's DB-API methods.
A statement that needs SQLAlchemy (the plain path, the ORM) gets a `Connection` made
around the same pooled connection on first need, and the session joins its transaction:
nothing about such a write changes but where its connection came from.

Fenced (`lease_problem`, checked once per process): the public constructors this relies
on (`Connection(engine, connection=...)`, `AsyncConnection(engine, sync_connection)`,
the session's `join_transaction_mode`). With a problem, units of work keep their session
(`UnitOfWork` takes the lease only where `DriverStatements.leases`); both are tested
(tests/db/test_leased_units_of_work.py, and every suite on SQLite and PgBouncer).
"""

from __future__ import annotations

import inspect
import logging
from functools import cache
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.util import greenlet_spawn

from app.metrics import transaction_ended

log = logging.getLogger(__name__)


class Lease:
    """One checked-out connection of `engine`'s pool for one unit of work."""

    def __init__(self, engine: AsyncEngine, pooled: PoolProxiedConnection) -> None:
        self.engine = engine
        self.pooled = pooled
        self.driver: Any = pooled.driver_connection  # asyncpg's Connection
        self.adapter: Any = pooled.dbapi_connection  # SQLAlchemy's DB-API adapter of it
        self._connection: AsyncConnection | None = None
        self._session: AsyncSession | None = None
        self.info: dict[Any, Any] = {}  # the transaction's notes, its session's once made

    @classmethod
    async def checkout(cls, engine: AsyncEngine) -> Lease:
        """A connection of `engine`'s pool; a driver's refusal raised as SQLAlchemy's
        `Connection` raises it (DBAPIError)."""
        dialect = engine.dialect
        try:
            return cls(engine, await engine.raw_connection())
        except dialect.loaded_dbapi.Error as exc:
            raise _wrapped(engine, None, exc, dialect.is_disconnect(exc, None, None)) from exc

    def connection(self) -> AsyncConnection:
        """SQLAlchemy's connection around the leased one, in its transaction (made on
        first need; no round trip: asyncpg's BEGIN is sent by the first statement)."""
        if self._connection is None:
            sync = Connection(self.engine.sync_engine, connection=self.pooled)
            sync.begin()  # SQLAlchemy's own bookkeeping: the dialect's begin sends nothing
            self._connection = AsyncConnection(self.engine, sync)
        return self._connection

    @property
    def session(self) -> AsyncSession | None:
        """The ORM session, if one was made (`session_for`)."""
        return self._session

    def session_for(self) -> AsyncSession:
        """The ORM session on the leased connection, made on first need. It joins the
        transaction and never ends it: the unit of work commits or rolls back (a failed
        flush rolls it back, as ever)."""
        if self._session is None:
            self._session = AsyncSession(
                bind=self.connection(),
                expire_on_commit=False,
                join_transaction_mode="rollback_only",
                info=self.info,
            )
            self.info = self._session.info  # a copy: from now on the one place
        return self._session

    async def commit(self) -> None:
        if self._session is not None:
            await self._session.flush()  # as the session's own commit would
        if self._connection is not None:
            await self._connection.commit()
            return
        if self.adapter._transaction is None:
            return  # nothing was sent: nothing to end
        try:
            await greenlet_spawn(self.adapter.commit)
        except Exception as exc:
            raise self._failed("COMMIT", exc) from exc
        transaction_ended("commit")

    async def rollback(self) -> None:
        if self._connection is not None:
            await self._connection.rollback()
            return
        if self.adapter._transaction is None:
            return
        try:
            await greenlet_spawn(self.adapter.rollback)
        except Exception as exc:
            # A connection that cannot roll back is not given to anyone else.
            self.pooled.invalidate(exc)
            log.debug("ROLLBACK failed; the connection is discarded", exc_info=True)
        transaction_ended("rollback")

    async def close(self) -> None:
        """Return the connection to the pool (after commit or rollback)."""
        try:
            if self._session is not None:
                await self._session.close()
        finally:
            if self._connection is not None:
                await self._connection.close()
            else:
                # A pool's check-in may roll back (an unfinished transaction): in a greenlet.
                await greenlet_spawn(self.pooled.close)

    def _failed(self, sql: str, exc: Exception) -> Exception:
        """The driver's error as the plain path raises it: SQLAlchemy's DBAPIError,
        invalidated (the connection discarded) when the dialect calls it a disconnect."""
        dialect = self.engine.dialect
        if not isinstance(exc, dialect.loaded_dbapi.Error):
            return exc
        gone = dialect.is_disconnect(exc, self.adapter, None)
        if gone:
            self.pooled.invalidate(exc)
        return _wrapped(self.engine, sql, exc, gone)


def _wrapped(engine: AsyncEngine, sql: str | None, exc: Exception, gone: bool) -> StatementError:
    """A driver's error (an instance of the dialect's DB-API Error): a DBAPIError."""
    dialect = engine.dialect
    return DBAPIError.instance(
        sql,
        None,
        exc,
        dialect.loaded_dbapi.Error,
        hide_parameters=engine.sync_engine.hide_parameters,
        connection_invalidated=gone,
        dialect=dialect,
    )


@cache
def lease_problem() -> str | None:
    """Why a unit of work cannot lease its connection, or None (module docstring); one
    warning when it cannot."""
    problem = _lease_problem()
    if problem is not None:
        log.warning("units of work keep their session (%s)", problem)
    return problem


def _lease_problem() -> str | None:
    connection = inspect.signature(Connection.__init__).parameters
    if "connection" not in connection:
        return "SQLAlchemy's Connection takes no pooled connection"
    if "sync_connection" not in inspect.signature(AsyncConnection.__init__).parameters:
        return "SQLAlchemy's AsyncConnection takes no sync connection"
    if "join_transaction_mode" not in inspect.signature(Session.__init__).parameters:
        return "SQLAlchemy's Session has no join_transaction_mode"
    from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection

    if "_transaction" not in getattr(AsyncAdapt_asyncpg_connection, "__slots__", ()):
        return "SQLAlchemy's asyncpg adapter keeps no _transaction"
    return None
