"""Typed errors, a leaf every layer may import. Each transport maps `code` to its own form
(CONTRACT section 3): REST and GraphQL to an HTTP status in app/http/status.py."""

from __future__ import annotations

from typing import Any, ClassVar


class DomainError(Exception):
    code: ClassVar[str] = "INTERNAL"

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


class Unauthenticated(DomainError):
    code = "UNAUTHENTICATED"


class PermissionDenied(DomainError):
    code = "PERMISSION_DENIED"


class NotFound(DomainError):
    code = "NOT_FOUND"


class Conflict(DomainError):
    code = "CONFLICT"


class InvalidState(DomainError):
    code = "INVALID_STATE"


class ResourceExhausted(DomainError):
    code = "RESOURCE_EXHAUSTED"


class Unavailable(DomainError):
    code = "UNAVAILABLE"


class Internal(DomainError):
    code = "INTERNAL"


# CONTRACT section 3's codes, in its order: every `code` a DomainError may carry.
CODES: tuple[str, ...] = tuple(
    error.code
    for error in (
        InvalidInput,
        Unauthenticated,
        PermissionDenied,
        NotFound,
        Conflict,
        InvalidState,
        ResourceExhausted,
        Unavailable,
        Internal,
    )
)
