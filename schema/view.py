"""The `/graphql` endpoint: strawberry's ASGI view with our context, orjson, and JSON
errors (with `extensions.code`) for requests it refuses before any GraphQL runs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import orjson
from cross_web import AsyncHTTPRequestAdapter, HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket
from strawberry.asgi import GraphQL
from strawberry.exceptions import ConnectionRejectionError
from strawberry.http import GraphQLHTTPResponse, GraphQLRequestData
from strawberry.schema import BaseSchema
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL, GRAPHQL_WS_PROTOCOL
from strawberry.types import ExecutionResult
from strawberry.types.unset import UnsetType

from app.capacity.errors import DomainError
from app.capacity.service import Capacity
from app.config import Settings
from app.db.errors import RETRY_AFTER_S, to_domain_error
from app.observe import record_code, request_info
from app.rate_limit import RateLimiter
from app.rest.responses import JSONResponse
from schema.context import Context
from schema.errors import INVALID_INPUT, coded
from schema.websockets import LegacyWSHandler, TextFrames, TransportWSHandler


class GraphQLView(GraphQL[Context, None]):
    def __init__(self, schema: BaseSchema, settings: Settings) -> None:
        super().__init__(
            schema,
            graphql_ide="graphiql" if settings.graphiql else None,
            subscription_protocols=(GRAPHQL_TRANSPORT_WS_PROTOCOL, GRAPHQL_WS_PROTOCOL),
            keep_alive=True,
            keep_alive_interval=settings.keepalive_interval_s,
            connection_init_wait_timeout=timedelta(seconds=settings.connection_init_timeout_s),
            max_subscriptions_per_connection=settings.max_subscriptions_per_connection,
            allowed_origins=settings.allowed_origins,
        )
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        request = Request(scope=scope, receive=receive)
        context = self._context(request, None)
        if _needs_token(request):
            # Before the body is read or parsed (docs/decisions/0001); the context keeps
            # the principal for the resolvers.
            try:
                principal = await context.principal()
                # The caller's request budget, right after authentication (app/rate_limit.py).
                info = request_info()
                if info is not None:
                    info.caller_id, info.tenant_id = principal.caller_id, principal.tenant_id
                limiter: RateLimiter = request.app.state.rate_limiter
                await limiter.charge_request(principal.caller_id, info)
            except Exception as exc:  # UNAUTHENTICATED, or UNAVAILABLE (the database)
                # The answer a resolver gave before: 200, data null, the code in errors;
                # a database out of reach is 503 with Retry-After, as every other failure.
                error = to_domain_error(exc)
                status = error.http_status if error.code in _HTTP_STATUS_CODES else 200
                await refused_with(error, status_code=status)(scope, receive, send)
                return
        try:
            response = await self.run(request, context=context)
        except HTTPException as exc:
            response = refused(exc.status_code, exc.reason)
        except Exception as exc:  # the body limit (413), or a failure outside GraphQL
            error = to_domain_error(exc)  # logs what it masks
            response = refused_with(error, status_code=error.http_status)
        await response(scope, receive, send)

    async def get_context(
        self, request: Request | WebSocket, response: Response | WebSocket
    ) -> Context:
        return self._context(request, response)

    def _context(
        self, request: Request | WebSocket, response: Response | WebSocket | None
    ) -> Context:
        capacity: Capacity = request.app.state.capacity
        return Context(
            request=request, response=response, capacity=capacity, settings=self.settings
        )

    async def parse_http_body(
        self, request: AsyncHTTPRequestAdapter
    ) -> GraphQLRequestData | list[GraphQLRequestData]:
        """strawberry reads fields of whatever JSON the body holds: `null`, `"x"` or `1`
        failed with an AttributeError (500). Only an object (or a batch, refused later)
        is a GraphQL request."""
        content_type = request.content_type or ""
        if request.method == "POST" and "application/json" in content_type:
            body = self.decode_json(await request.get_body())  # bad JSON: 400 in run()
            if not isinstance(body, dict | list):
                raise HTTPException(400, "the request body must be a JSON object")
        return await super().parse_http_body(request)

    def encode_json(self, data: object) -> bytes:
        return orjson.dumps(data)

    def decode_json(self, data: str | bytes) -> object:
        return orjson.loads(data)

    async def process_result(
        self, request: Request, result: ExecutionResult
    ) -> GraphQLHTTPResponse:
        # ErrorCodes has coded every error of an operation; this also covers a failure
        # strawberry reports outside the operation's hooks.
        if result.errors:
            result.errors = [coded(e) for e in result.errors]
        data = await super().process_result(request, result)
        info = request_info()
        if info is not None:
            for error in data.get("errors") or ():
                extensions = error.get("extensions") if isinstance(error, dict) else None
                code = extensions.get("code") if isinstance(extensions, dict) else None
                info.codes.append(code if isinstance(code, str) else "INTERNAL")
            if info.cost is not None:
                data["extensions"] = {**(data.get("extensions") or {}), "cost": info.cost}
        return data

    def create_response(
        self,
        response_data: GraphQLHTTPResponse | list[GraphQLHTTPResponse],
        sub_response: Response,
    ) -> Response:
        response = super().create_response(response_data, sub_response)
        if isinstance(response_data, dict) and _unavailable(response_data):
            # The body keeps GraphQL's shape; the status and Retry-After tell HTTP clients
            # and proxies, as on REST, that the operation failed for now and may be retried.
            response.headers["retry-after"] = str(RETRY_AFTER_S)
            if not any((response_data.get("data") or {}).values()):
                response.status_code = 503
        elif isinstance(response_data, dict) and _rate_limited(response_data):
            response.status_code = 429  # Retry-After and X-RateLimit-*: app/observe.py
        return response

    # --- websocket hooks (graphql-transport-ws and graphql-ws) -------------------------
    graphql_transport_ws_handler_class = TransportWSHandler
    graphql_ws_handler_class = LegacyWSHandler
    websocket_adapter_class = TextFrames

    async def on_ws_connect(self, context: Context) -> UnsetType | dict[str, object] | None:
        """Authenticate the connection before anything streams: the bearer token in the
        connection_init payload ({"authorization": "Bearer ..."}) or the upgrade's header.
        A bad one closes the socket with 4403 (docs/events.md)."""
        context.forget_principal()
        try:
            await context.principal()
        except DomainError as exc:
            error = to_domain_error(exc)
            raise ConnectionRejectionError(
                {"message": error.message, "extensions": {"code": error.code}}
            ) from None
        return await super().on_ws_connect(context)


def _unavailable(response_data: GraphQLHTTPResponse) -> bool:
    """An error of the operation is UNAVAILABLE (the database or broker is out of reach)."""
    for error in response_data.get("errors") or ():
        extensions = error.get("extensions") if isinstance(error, dict) else None
        if isinstance(extensions, dict) and extensions.get("code") == "UNAVAILABLE":
            return True
    return False


def _rate_limited(response_data: GraphQLHTTPResponse) -> bool:
    """The operation was refused by the caller's cost budget (schema/cost_budget.py)."""
    for error in response_data.get("errors") or ():
        extensions = error.get("extensions") if isinstance(error, dict) else None
        if isinstance(extensions, dict) and extensions.get("limit") == "rate":
            return True
    return False


# Refusals before any GraphQL ran that keep their HTTP status (others answer 200).
_HTTP_STATUS_CODES = frozenset({"UNAVAILABLE", "RESOURCE_EXHAUSTED"})


def _needs_token(request: Request) -> bool:
    """Every GraphQL request carries a token (CONTRACT section 2), except a GET without
    a query: GraphiQL's page, or strawberry's own refusal of an empty request."""
    return request.method != "GET" or "query" in request.query_params


def refused_with(error: DomainError, status_code: int) -> Response:
    """A domain error raised before any GraphQL ran, in GraphQL's error shape."""
    record_code(error.code)
    body: dict[str, Any] = {
        "data": None,
        "errors": [{"message": error.message, "extensions": {"code": error.code, **error.details}}],
    }
    headers = {"retry-after": str(RETRY_AFTER_S)} if error.code == "UNAVAILABLE" else None
    return JSONResponse(body, status_code=status_code, headers=headers)


def refused(status_code: int, reason: str) -> Response:
    """A request refused before parsing GraphQL (bad JSON, no query, batching, GET for a
    mutation...): GraphQL's error shape with a code."""
    code = "NOT_FOUND" if status_code == 404 else INVALID_INPUT
    record_code(code)
    body: dict[str, Any] = {
        "data": None,
        "errors": [{"message": reason, "extensions": {"code": code}}],
    }
    return JSONResponse(body, status_code=status_code)
