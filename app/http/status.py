"""The HTTP status of each error code (CONTRACT section 3), for REST and GraphQL alike."""

from __future__ import annotations

from starlette.requests import ClientDisconnect

from app.db.errors import to_domain_error
from app.errors import DomainError, InvalidInput
from app.http.body_limit import BodyTooLarge

STATUS_OF_CODE: dict[str, int] = {
    "INVALID_INPUT": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "CONFLICT": 409,
    "INVALID_STATE": 409,
    "RESOURCE_EXHAUSTED": 429,
    "UNAVAILABLE": 503,
    "INTERNAL": 500,
}


def http_status(error: DomainError) -> int:
    # A body over the limit is RESOURCE_EXHAUSTED, answered 413 (docs/decisions/0001).
    if isinstance(error, BodyTooLarge):
        return 413
    return STATUS_OF_CODE.get(error.code, 500)


def request_failure(exc: BaseException) -> DomainError:
    """What a failure while serving a request answers. A client that left before its
    body arrived caused it (INVALID_INPUT, which nobody reads): no INTERNAL error, no
    traceback in the log; anything else as the domain maps it (app/db/errors.py)."""
    if isinstance(exc, ClientDisconnect):
        return InvalidInput("the client closed the request before its body arrived")
    return to_domain_error(exc)
