"""Every failure as `{"error": {code, message, details}}` with its HTTP status."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from app.db.errors import RETRY_AFTER_S
from app.errors import DomainError, InvalidInput, NotFound
from app.http.responses import JSONResponse
from app.http.status import http_status, request_failure
from app.observe import record_code


def error_body(error: DomainError) -> dict[str, object]:
    return {"error": {"code": error.code, "message": error.message, "details": error.details}}


def error_response(exc: BaseException) -> Response:
    error = request_failure(exc)
    record_code(error.code)
    headers: dict[str, str] | None = None
    if error.code == "UNAUTHENTICATED":
        headers = {"www-authenticate": "Bearer"}
    elif error.code == "UNAVAILABLE":
        headers = {"retry-after": str(RETRY_AFTER_S)}
    return JSONResponse(error_body(error), status_code=http_status(error), headers=headers)


async def http_error(_: Request, exc: Exception) -> Response:
    """Starlette's own refusals (unknown path, wrong HTTP method) in the same shape."""
    assert isinstance(exc, HTTPException)
    error: DomainError = (
        NotFound("no such route") if exc.status_code == 404 else InvalidInput(exc.detail)
    )
    return JSONResponse(error_body(error), status_code=exc.status_code, headers=exc.headers)
