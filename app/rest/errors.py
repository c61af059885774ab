"""Every failure as `{"error": {code, message, details}}` with its HTTP status."""

from __future__ import annotations

from starlette.responses import Response

from app.db.errors import to_domain_error
from app.rest.responses import JSONResponse


def error_response(exc: BaseException) -> Response:
    error = to_domain_error(exc)
    return JSONResponse(
        {"error": {"code": error.code, "message": error.message, "details": error.details}},
        status_code=error.http_status,
    )
