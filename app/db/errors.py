"""Infrastructure failures as domain errors: the database or broker being down is
UNAVAILABLE (safe to retry); anything else unexpected is INTERNAL, revealing nothing."""

from __future__ import annotations

import logging
import sqlite3
from typing import Final

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from app.errors import DomainError, Internal, Unavailable

log = logging.getLogger("app.errors")

# Seconds a client is asked to wait before retrying an UNAVAILABLE answer (Retry-After).
RETRY_AFTER_S: Final = 2

# OSError covers refused and reset connections, and TimeoutError: a connect or statement
# bound (asyncpg's `timeout`, `command_timeout`) that ran out.
_UNAVAILABLE = (OperationalError, InterfaceError, PoolTimeout, ConnectionError, OSError)
# SQLite reports its own bugs (no such table, syntax) as OperationalError too; only these
# mean the file is out of reach for now. "locking protocol" (SQLITE_PROTOCOL): a WAL read
# lock that another process held through SQLite's own retries (about 10 s).
_SQLITE_UNAVAILABLE = (
    "locked",
    "busy",
    "unable to open",
    "disk i/o",
    "readonly",
    "locking protocol",
)

# PostgreSQL refusing or dropping connections, by SQLSTATE: asyncpg raises these as
# plain PostgresError subclasses, which SQLAlchemy wraps in a bare DBAPIError.
# 08 connection exception; 53 insufficient resources (53300 too many connections);
# 57P operator intervention (57P01 admin shutdown, 57P03 starting up or shutting down);
# 57014 a statement cancelled by statement_timeout; 55000 "database is not currently
# accepting connections" (ALLOW_CONNECTIONS false).
_UNAVAILABLE_SQLSTATE_CLASSES = ("08", "53", "57P")
_UNAVAILABLE_SQLSTATES = frozenset({"55000", "57014"})


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a PostgreSQL error, wherever in the chain it is: SQLAlchemy's
    `.orig` (asyncpg's adapted error, which copies it) or the asyncpg error as `__cause__`."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        code = getattr(current, "sqlstate", None)
        if isinstance(code, str) and code:
            return code
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else current.__cause__
    return None


def _connection_sqlstate(code: str | None) -> bool:
    return code is not None and (
        code in _UNAVAILABLE_SQLSTATES or code.startswith(_UNAVAILABLE_SQLSTATE_CLASSES)
    )


def _sqlite_out_of_reach(error: BaseException | None) -> bool:
    message = str(error).lower()
    return any(sign in message for sign in _SQLITE_UNAVAILABLE)


def _unavailable(exc: BaseException) -> bool:
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if _connection_sqlstate(sqlstate(exc)):
        return True
    if isinstance(exc, sqlite3.OperationalError):  # app/db/embedded_rows.py, unwrapped
        return _sqlite_out_of_reach(exc)
    if not isinstance(exc, _UNAVAILABLE):
        return False
    if isinstance(exc, OperationalError) and type(exc.orig).__module__.startswith("sqlite3"):
        return _sqlite_out_of_reach(exc.orig)
    return True


def connection_fault(exc: BaseException) -> bool:
    """The database is out of reach (a wait that ran out, a connection refused or reset, a
    server refusing sessions): any other path to it would meet the same, so a compiled
    read answers UNAVAILABLE at once rather than wait again on the plain path."""
    return not isinstance(exc, DomainError) and _unavailable(exc)


def to_domain_error(exc: BaseException) -> DomainError:
    if isinstance(exc, DomainError):
        return exc
    if _unavailable(exc):
        if isinstance(exc, PoolTimeout):
            from app.metrics import DB_POOL_WAITS  # not at import: the CLI needs no metrics

            DB_POOL_WAITS.inc()
        log.warning(
            "backing service unavailable: %s (sqlstate %s)", type(exc).__name__, sqlstate(exc)
        )
        return Unavailable("the service is temporarily unavailable; retry")
    log.error("unhandled error", exc_info=exc)
    return Internal("internal error")
