"""Infrastructure failures as domain errors: the database or broker being down is
UNAVAILABLE (safe to retry); anything else unexpected is INTERNAL, revealing nothing."""

from __future__ import annotations

import logging

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from app.capacity.errors import DomainError, Internal, Unavailable

log = logging.getLogger("app.errors")

_UNAVAILABLE = (OperationalError, InterfaceError, PoolTimeout, ConnectionError, OSError)


def to_domain_error(exc: BaseException) -> DomainError:
    if isinstance(exc, DomainError):
        return exc
    if isinstance(exc, _UNAVAILABLE) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    ):
        log.warning("backing service unavailable: %s", type(exc).__name__)
        return Unavailable("the service is temporarily unavailable; retry")
    log.error("unhandled error", exc_info=exc)
    return Internal("internal error")
