"""The HTTP status of each error code (CONTRACT section 3), for REST and GraphQL alike."""

from __future__ import annotations

from app.errors import DomainError
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
