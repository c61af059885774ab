"""Infrastructure failures as domain errors: the database or broker being down is
UNAVAILABLE (safe to retry); anything else unexpected is INTERNAL, revealing nothing."""

from __future__ import annotations

import logging

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from app.capacity.errors import DomainError, Internal, Unavailable

log = logging.getLogger("app.errors")

_UNAVAILABLE = (OperationalError, InterfaceError, PoolTimeout, ConnectionError, OSError)
# SQLite reports its own bugs (no such table, syntax) as OperationalError too; only these
# mean the file is out of reach for now.
_SQLITE_UNAVAILABLE = ("locked", "busy", "unable to open", "disk i/o", "readonly")


def _unavailable(exc: BaseException) -> bool:
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if not isinstance(exc, _UNAVAILABLE):
        return False
    if isinstance(exc, OperationalError) and type(exc.orig).__module__.startswith("sqlite3"):
        message = str(exc.orig).lower()
        return any(sign in message for sign in _SQLITE_UNAVAILABLE)
    return True


def to_domain_error(exc: BaseException) -> DomainError:
    if isinstance(exc, DomainError):
        return exc
    if _unavailable(exc):
        log.warning("backing service unavailable: %s", type(exc).__name__)
        return Unavailable("the service is temporarily unavailable; retry")
    log.error("unhandled error", exc_info=exc)
    return Internal("internal error")
