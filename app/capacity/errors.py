"""Typed domain errors. Each surface maps `code` to its own form (CONTRACT section 3)."""

from __future__ import annotations

from typing import Any, ClassVar


class DomainError(Exception):
    code: ClassVar[str] = "INTERNAL"
    http_status: ClassVar[int] = 500

    def __init__(self, message: str, *, field: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = dict(details)
        if field is not None:
            self.details["field"] = field

    @property
    def field(self) -> str | None:
        value = self.details.get("field")
        return value if isinstance(value, str) else None


class InvalidInput(DomainError):
    code = "INVALID_INPUT"
    http_status = 400


class Unauthenticated(DomainError):
    code = "UNAUTHENTICATED"
    http_status = 401


class PermissionDenied(DomainError):
    code = "PERMISSION_DENIED"
    http_status = 403


class NotFound(DomainError):
    code = "NOT_FOUND"
    http_status = 404


class Conflict(DomainError):
    code = "CONFLICT"
    http_status = 409


class InvalidState(DomainError):
    code = "INVALID_STATE"
    http_status = 409


class ResourceExhausted(DomainError):
    code = "RESOURCE_EXHAUSTED"
    http_status = 429


class Unavailable(DomainError):
    code = "UNAVAILABLE"
    http_status = 503


class Internal(DomainError):
    code = "INTERNAL"
    http_status = 500


def pool_not_found(pool_id: str) -> NotFound:
    """The one answer for a pool that is missing or hidden, so neither can be told apart."""
    return NotFound(f"pool {pool_id} not found", field="poolId")
