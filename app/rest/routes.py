"""REST shims: `POST /api/compute/<group>/<method>`, one route per catalog row."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from app.capacity.inputs import parse_input
from app.capacity.service import Capacity
from app.capacity.views import ImpactView
from app.catalog import METHODS, POOL_METHODS, Method
from app.errors import InvalidInput
from app.http.responses import JSONResponse
from app.iam.callers import authenticate
from app.observe import request_info
from app.rest.errors import error_response
from app.rest.openapi import openapi_document
from app.rest.render import render


def _endpoint(method: Method) -> Any:
    async def endpoint(request: Request) -> Response:
        capacity: Capacity = request.app.state.capacity
        try:
            principal = await authenticate(capacity.db, request.headers.get("authorization"))
            info = request_info()
            if info is not None:
                info.caller_id, info.tenant_id = principal.caller_id, principal.tenant_id
            await request.app.state.rate_limiter.charge_request(principal.caller_id, info)
            try:
                body = orjson.loads(await request.body())
            except orjson.JSONDecodeError:
                raise InvalidInput("the request body must be a JSON object") from None
            inp = parse_input(method.input, body)
            result = await method.call(capacity, principal, inp)
            # A dry run (unoffer, archive) answers its impact in place of the result.
            key = "impact" if isinstance(result, ImpactView) else method.result_key
            return JSONResponse({key: render(result)})
        except Exception as exc:
            return error_response(exc)

    endpoint.__name__ = f"{method.group}_{method.name}"
    return endpoint


async def catalog(_: Request) -> Response:
    return JSONResponse({"methods": [m.describe() for m in POOL_METHODS]})


async def openapi(_: Request) -> Response:
    return JSONResponse(openapi_document())


def routes() -> list[BaseRoute]:
    return [
        *(Route(m.path, _endpoint(m), methods=["POST"]) for m in METHODS),
        Route("/api/compute/catalog", catalog, methods=["GET"]),
        Route("/api/openapi.json", openapi, methods=["GET"]),
    ]
