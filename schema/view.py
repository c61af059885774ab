"""The `/graphql` endpoint: strawberry's ASGI view with our context, orjson, and JSON
errors (with `extensions.code`) for requests it refuses before any GraphQL runs."""

from __future__ import annotations

import logging
from contextvars import ContextVar
from datetime import timedelta
from functools import partial
from typing import Any

import orjson
from cross_web import AsyncHTTPRequestAdapter, HTTPException
from graphql import GraphQLError
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket
from strawberry.asgi import GraphQL
from strawberry.exceptions import ConnectionRejectionError
from strawberry.http import GraphQLHTTPResponse, GraphQLRequestData
from strawberry.schema import BaseSchema
from strawberry.schema.exceptions import InvalidOperationTypeError
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL, GRAPHQL_WS_PROTOCOL
from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import (
    BaseGraphQLTransportWSHandler,
)
from strawberry.subscriptions.protocols.graphql_ws.handlers import BaseGraphQLWSHandler
from strawberry.types import ExecutionResult
from strawberry.types.graphql import OperationType
from strawberry.types.unset import UnsetType

from app import tracing as tracing_module
from app.capacity.service import Capacity
from app.compat import graphql_core_schema
from app.config import Settings
from app.db.errors import RETRY_AFTER_S, to_domain_error
from app.errors import DomainError, Unavailable
from app.http.admission import Admission, Admitted
from app.http.responses import JSONResponse
from app.http.status import http_status, request_failure
from app.metrics import COMPILED_READS
from app.observe import record_code, request_info
from schema.compiled_reads import CompiledReads, Plan
from schema.compiled_writes import CompiledWrites
from schema.context import Context
from schema.errors import INVALID_INPUT, coded
from schema.graphiql import graphiql_page
from schema.http_media import (
    GRAPHQL_RESPONSE_JSON,
    is_request_error,
    negotiate,
    request_error_status,
    response_media,
)
from schema.limits import MAX_REPORTED_COST, operation_cost
from schema.operations import sent_operation_name
from schema.persisted import PersistedQueries, PersistedQueryError, load_manifest
from schema.spliced import SPLICES
from schema.websockets import (
    REFUSAL,
    BackendUnavailable,
    LegacyWSHandler,
    TextFrames,
    TransportWSHandler,
    refusal_reason,
)

logger = logging.getLogger(__name__)
# Whether the plain path's operation ran without errors: its query text may then be
# planned for the compiled path.
_clean_run: ContextVar[bool] = ContextVar("clean_run", default=False)
# The request's context, for parse_http_body (strawberry does not pass it there).
_http_context: ContextVar[Context | None] = ContextVar("http_context", default=None)
_ANSWERED, _DECLINED = COMPILED_READS.labels("answered"), COMPILED_READS.labels("declined")


class GraphQLView(GraphQL[Context, None]):
    def __init__(
        self,
        schema: BaseSchema,
        settings: Settings,
        *,
        our_websocket_handlers: bool = True,
        tracing: bool = False,
        shared_frames: bool = False,
    ) -> None:
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
        # A compiled read's GraphQL span, where the plain path's extension records one
        # (app/tracing.py: not when its redaction could not be shown to hold).
        self._traced = tracing and tracing_module.graphql_extension() is not None
        manifest = (
            load_manifest(settings.persisted_queries_manifest)
            if settings.persisted_queries_manifest
            else None
        )
        self.persisted = PersistedQueries(settings.persisted_queries, manifest)
        self._graphiql = graphiql_page(settings.web_assets_dir) if settings.graphiql else None
        if not our_websocket_handlers:  # strawberry changed what they override (app/compat.py)
            self.graphql_transport_ws_handler_class = BaseGraphQLTransportWSHandler
            self.graphql_ws_handler_class = BaseGraphQLWSHandler
        # An event rendered for an identical request goes to the socket as one frame
        # (schema/shared_frames.py); not traced, where each result is the tracer's.
        self.shared_frames = shared_frames and our_websocket_handlers and not self._traced
        self.compiled = (
            CompiledReads(
                graphql_core_schema(schema),
                settings.max_query_cost,
                settings.compiled_plan_cache_bytes,
            )
            if settings.compiled_reads
            else None
        )
        # Bookings answered by the domain's one statement, on the reads' plans.
        self.writes = CompiledWrites(schema, self.compiled) if self.compiled is not None else None
        # A subscription event's `pool` answered by Query.pool's statement, where the
        # executor splices its JSON into the event's rendering (schema/spliced.py).
        splices = getattr(schema, "execution_context_class", None)
        self.event_compiled = self.compiled if getattr(splices, SPLICES, False) else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        request = Request(scope=scope, receive=receive)
        media = negotiate(request.headers.get("accept"))
        response_media.set(media or "application/json")
        if media is None and _needs_token(request):
            # A GraphQL request (not GraphiQL's page) for which neither
            # application/graphql-response+json nor application/json is acceptable.
            await refused(
                406, "Accept must allow application/graphql-response+json or application/json"
            )(scope, receive, send)
            return
        context = self._context(request, None)
        _http_context.set(context)
        key: tuple[str, str | None] | None = None
        try:
            if _needs_token(request):
                # Authenticated here, before the body is read or parsed (docs/decisions/0001);
                # a caller this process has seen may be answered by a compiled read, whose
                # one statement checks the token again (schema/compiled_reads.py).
                admitted = await self._admit(request, context)
                if isinstance(admitted, Response):
                    await admitted(scope, receive, send)
                    return
                if admitted.token_hash is not None:
                    key, response = await self._compiled(request, context, admitted)
                    if response is not None:
                        await response(scope, receive, send)
                        return
            response = await self.run(request, context=context)
            if key is not None and _clean_run.get() and self.compiled is not None:
                self.compiled.learn(*key)
        except HTTPException as exc:
            response = refused(exc.status_code, exc.reason)
        except PersistedQueryError as exc:
            response = refused(400, exc.message, code=exc.code)
        except Exception as exc:  # the body limit (413), or a failure outside GraphQL
            error = request_failure(exc)  # logs what it masks
            response = refused_with(error, status_code=http_status(error))
        await response(scope, receive, send)

    async def _admit(self, request: Request, context: Context) -> Admitted | Response:
        """Admission (app/http/admission.py: the token, the caller's request budget), or
        the refusal to send."""
        admission: Admission = request.app.state.admission
        try:
            return await admission.admit(
                request,
                context.authorization(),
                context.principal,  # kept by the context for the resolvers
                compiled=self._may_compile(request),
            )
        except Exception as exc:
            return _admission_refusal(exc)

    async def _compiled(
        self, request: Request, context: Context, admitted: Admitted
    ) -> tuple[tuple[str, str | None] | None, Response | None]:
        """The request's (query, operationName) and, when no GraphQL need run, its
        response: the compiled read's answer, or the refusal of a remembered caller
        whose token is no longer good. The body's fault is raised after the token is
        checked."""
        admission: Admission = request.app.state.admission
        key: tuple[str, str | None] | None = None
        try:
            await admission.read_body(request, admitted)
        except Exception as exc:
            return key, _admission_refusal(exc)
        if admitted.body is not None:
            key, response = await self._compiled_answer(request, context, admitted, admitted.body)
            if response is not None:
                return key, response
        try:
            await admitted.confirm()  # not answered: authenticate now, as usual
        except Exception as exc:
            return key, _admission_refusal(exc)
        if admitted.body_error is not None:
            raise admitted.body_error
        return key, None

    def _may_compile(self, request: Request) -> bool:
        """Whether this request may take the compiled read path: a POST of JSON, no cost
        budget to charge per operation, a store that compiles reads (both dialects)."""
        return (
            self.compiled is not None
            and request.method == "POST"
            and "application/json" in request.headers.get("content-type", "")
            and request.app.state.rate_limiter.cost is None
            and request.app.state.capacity.compiles_reads
        )

    async def _compiled_answer(
        self, request: Request, context: Context, admitted: Admitted, raw: bytes
    ) -> tuple[tuple[str, str | None] | None, Response | None]:
        """The request's (query, operationName), and the compiled read's response when
        the plan and the domain give one. None for anything else, refusals included: the
        plain path answers those, after the token is checked."""
        assert self.compiled is not None
        try:
            body = self.decode_json(raw)
        except ValueError:
            return None, None
        if not isinstance(body, dict) or not isinstance(body.get("query"), str):
            return None, None
        name, variables = body.get("operationName"), body.get("variables")
        extensions = body.get("extensions")
        if not (
            isinstance(name, str | None)
            and isinstance(variables, dict | None)
            and isinstance(extensions, dict | None)
        ):
            return None, None  # the plain path refuses it (400)
        try:
            query = self.persisted.resolve(body["query"], extensions, admitted.principal.tenant_id)
        except PersistedQueryError:
            return None, None
        if query is None:
            return None, None
        key = (query, name)
        plan = self.compiled.plan(query, name)
        if plan is not None and self.writes is not None and self.writes.covers(plan):
            if not context.capacity.compiles_writes:  # SQLite: the plain path books
                return key, None
            assert admitted.token_hash is not None
            written = await self.writes.answer(
                plan, variables, context.capacity, admitted.principal, admitted.token_hash
            )
            if written is None:  # the plain path answers, after the token is looked up
                request.app.state.admission.forget(admitted)
                return key, None
            return key, self._answered(context, plan, written.data, written.cost)
        try:
            prepared = self.compiled.prepare(plan, variables, context.capacity) if plan else None
        except GraphQLError:  # an argument that does not coerce: the plain path says so
            prepared = None
        if prepared is None:
            return key, None
        try:
            assert admitted.token_hash is not None
            read = partial(
                context.capacity.read_json,
                admitted.principal,
                admitted.token_hash,
                prepared.read,
                prepared.args,
            )
            if self._traced and plan is not None:  # HTTP, then GraphQL, then SQL
                data = await tracing_module.compiled_operation(
                    _operation_name(plan), plan.document, read
                )
            else:
                data = await read()
        except Unavailable as unavailable:
            # The database is out of reach: the plain path would only wait for it again.
            return key, refused_with(unavailable, status_code=http_status(unavailable))
        except Exception:  # the plain path meets the same fault and reports it
            logger.debug("compiled read failed; answering on the plain path", exc_info=True)
            _DECLINED.inc()
            return key, None
        if data is None:
            # Not answered (maybe a revoked token): the plain path authenticates anew.
            request.app.state.admission.forget(admitted)
            _DECLINED.inc()
            return key, None
        _ANSWERED.inc()
        assert plan is not None  # prepared from it
        return key, self._answered(context, plan, data, prepared.cost)

    def _answered(self, context: Context, plan: Plan, data: dict[str, Any], cost: int) -> Response:
        """What process_result and create_response make of an answer without errors. The
        operation is named as the plain path names it (schema/limits.py): by the request's
        operationName, else by the document's operation (`query Page { ... }` sent
        without operationName is `Page` in the access log and the metrics, not
        `anonymous`)."""
        info = request_info()
        if info is not None:
            info.graphql_operation(_operation_name(plan))
        cost = min(cost, MAX_REPORTED_COST)
        operation_cost(context, cost)
        answer: dict[str, Any] = {"data": data}
        if info is not None:
            answer["extensions"] = {"cost": cost}
        media = response_media.get()
        media_type = f"{media}; charset=utf-8" if media == GRAPHQL_RESPONSE_JSON else media
        return Response(self.encode_json(answer), media_type=media_type)

    async def get_context(
        self, request: Request | WebSocket, response: Response | WebSocket
    ) -> Context:
        return self._context(request, response)

    def _context(
        self, request: Request | WebSocket, response: Response | WebSocket | None
    ) -> Context:
        capacity: Capacity = request.app.state.capacity
        return Context(
            request=request,
            response=response,
            capacity=capacity,
            settings=self.settings,
            compiled=self.event_compiled,
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
        data = await super().parse_http_body(request)
        if isinstance(data, GraphQLRequestData):
            # Registrations are per tenant; a request with one is authenticated already.
            context = _http_context.get()
            by_hash = context is not None and "persistedQuery" in (data.extensions or {})
            tenant = (await context.principal()).tenant_id if context and by_hash else None
            data.query = self.persisted.resolve(data.query, data.extensions, tenant)
            sent_operation_name.set(data.operation_name)  # for OperationChecks
        return data

    def should_render_graphql_ide(self, request: Any) -> bool:
        # A GET with only a persisted query's hash is an operation, not the IDE.
        return "extensions" not in request.query_params and super().should_render_graphql_ide(
            request
        )

    async def render_graphql_ide(self, request: Request) -> Response:
        # GraphiQL with its assets served by this service (schema/graphiql.py): the
        # page works with no internet access.
        assert self._graphiql is not None  # rendered only when GraphiQL is on
        return HTMLResponse(self._graphiql.html, headers=self._graphiql.headers)

    async def execute_single(self, *args: Any, **kwargs: Any) -> ExecutionResult:
        try:
            return await super().execute_single(*args, **kwargs)
        except HTTPException as exc:
            cause = exc.__cause__
            if (
                isinstance(cause, InvalidOperationTypeError)
                and cause.operation_type == OperationType.MUTATION
            ):
                # GraphQL over HTTP: a mutation by GET is 405 (Allow: POST).
                raise HTTPException(405, exc.reason) from exc
            raise

    def encode_json(self, data: object) -> bytes:
        return orjson.dumps(data)

    def decode_json(self, data: str | bytes) -> object:
        return orjson.loads(data)

    async def process_result(
        self, request: Request, result: ExecutionResult
    ) -> GraphQLHTTPResponse:
        # ErrorCodes has coded every error of an operation; this also covers a failure
        # strawberry reports outside the operation's hooks.
        _clean_run.set(not result.errors)
        if result.errors:
            result.errors = [coded(e) for e in result.errors]
        processed = await super().process_result(request, result)
        info = request_info()
        if info is not None:
            for error in processed.get("errors") or ():
                extensions = error.get("extensions") if isinstance(error, dict) else None
                code = extensions.get("code") if isinstance(extensions, dict) else None
                info.codes.append(code if isinstance(code, str) else "INTERNAL")
            if info.cost is not None:
                processed["extensions"] = {**(processed.get("extensions") or {}), "cost": info.cost}
        if response_media.get() == GRAPHQL_RESPONSE_JSON and is_request_error(
            result.data, result.errors
        ):
            # An error before execution: no `data` entry (GraphQL over HTTP).
            processed.pop("data", None)
        return processed

    def create_response(
        self,
        response_data: GraphQLHTTPResponse | list[GraphQLHTTPResponse],
        sub_response: Response,
    ) -> Response:
        response = super().create_response(response_data, sub_response)
        if response_media.get() == GRAPHQL_RESPONSE_JSON:
            response.headers["content-type"] = f"{GRAPHQL_RESPONSE_JSON}; charset=utf-8"
            if isinstance(response_data, dict) and "data" not in response_data:
                response.status_code = request_error_status(response_data.get("errors") or [])  # type: ignore[arg-type]
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
    graphql_transport_ws_handler_class: type[BaseGraphQLTransportWSHandler[Context, None]] = (
        TransportWSHandler
    )
    graphql_ws_handler_class: type[BaseGraphQLWSHandler[Context, None]] = LegacyWSHandler
    websocket_adapter_class = TextFrames

    async def on_ws_connect(self, context: Context) -> UnsetType | dict[str, object] | None:
        """Authenticate the connection before anything streams: the bearer token in the
        connection_init payload ({"authorization": "Bearer ..."}) or the upgrade's header.
        A bad one closes the socket with 4403 (docs/events.md); a database out of reach
        with 1013, try again later."""
        context.forget_principal()
        admission: Admission = context.request.app.state.admission
        try:
            # No operation yet: the caller's request budget is charged by each one.
            await admission.admit(
                context.request, context.authorization(), context.principal, charge=False
            )
        except Exception as exc:
            error = to_domain_error(exc)  # logs what it masks
            if error.code == "UNAVAILABLE":
                raise BackendUnavailable(error.message) from None
            setattr(context.request.state, REFUSAL, refusal_reason(error))  # the close's reason
            raise ConnectionRejectionError(
                {"message": error.message, "extensions": {"code": error.code}}
            ) from None
        return await super().on_ws_connect(context)


def _operation_name(plan: Plan) -> str | None:
    """The operation's name as strawberry's tracing names its span: the document's."""
    name = plan.operation.name
    return name.value if name is not None else None


def _unavailable(response_data: GraphQLHTTPResponse) -> bool:
    """An error of the operation is UNAVAILABLE (the database or broker is out of reach)."""
    for error in response_data.get("errors") or ():
        extensions = error.get("extensions") if isinstance(error, dict) else None
        if isinstance(extensions, dict) and extensions.get("code") == "UNAVAILABLE":
            return True
    return False


def _has_operation(request: Request) -> bool:
    return "query" in request.query_params or "extensions" in request.query_params


def _rate_limited(response_data: GraphQLHTTPResponse) -> bool:
    """The operation was refused by the caller's cost budget (schema/cost_budget.py)."""
    for error in response_data.get("errors") or ():
        extensions = error.get("extensions") if isinstance(error, dict) else None
        if isinstance(extensions, dict) and extensions.get("limit") == "rate":
            return True
    return False


# Refusals before any GraphQL ran that keep their HTTP status (others answer 200).
_HTTP_STATUS_CODES = frozenset({"UNAVAILABLE", "RESOURCE_EXHAUSTED"})


def _admission_refusal(exc: Exception) -> Response:
    """UNAUTHENTICATED, RESOURCE_EXHAUSTED (a budget) or UNAVAILABLE (the database).
    UNAUTHENTICATED is the answer a resolver gave before: 200, data null, the code in
    errors (401 without data under application/graphql-response+json); a database out
    of reach is 503 with Retry-After, as every other failure."""
    error = to_domain_error(exc)
    status = http_status(error) if error.code in _HTTP_STATUS_CODES else 200
    return refused_with(error, status_code=status)


def _needs_token(request: Request) -> bool:
    """Every GraphQL request carries a token (CONTRACT section 2), except a GET without
    a query (or a persisted query's hash): GraphiQL's page, or strawberry's own refusal
    of an empty request."""
    return request.method != "GET" or _has_operation(request)


def refused_with(error: DomainError, status_code: int) -> Response:
    """A domain error raised before any GraphQL ran, in GraphQL's error shape."""
    record_code(error.code)
    headers = {"retry-after": str(RETRY_AFTER_S)} if error.code == "UNAVAILABLE" else {}
    if error.code == "UNAUTHENTICATED" and response_media.get() == GRAPHQL_RESPONSE_JSON:
        # application/json keeps the 200 clients had; the newer media type says 401.
        status_code = 401
        headers["www-authenticate"] = "Bearer"
    return _request_error(
        {"message": error.message, "extensions": {"code": error.code, **error.details}},
        status_code,
        headers,
    )


def refused(status_code: int, reason: str, code: str | None = None) -> Response:
    """A request refused before parsing GraphQL (bad JSON, no query, batching, GET for a
    mutation...): GraphQL's error shape with a code."""
    if code is None:
        code = "NOT_FOUND" if status_code == 404 else INVALID_INPUT
    elif code.startswith("PERSISTED_QUERY") and response_media.get() != GRAPHQL_RESPONSE_JSON:
        status_code = 200  # a persisted query's answer, as Apollo's clients expect it
    record_code(code)
    headers = {"allow": "POST"} if status_code == 405 else {}
    return _request_error({"message": reason, "extensions": {"code": code}}, status_code, headers)


def _request_error(error: dict[str, Any], status_code: int, headers: dict[str, str]) -> Response:
    """No `data` entry under application/graphql-response+json (an error before
    execution); `data: null` under application/json, as before."""
    if response_media.get() == GRAPHQL_RESPONSE_JSON:
        return JSONResponse(
            {"errors": [error]},
            status_code=status_code,
            headers=headers,
            media_type=f"{GRAPHQL_RESPONSE_JSON}; charset=utf-8",
        )
    return JSONResponse({"data": None, "errors": [error]}, status_code=status_code, headers=headers)
