"""What this service relies on in graphql-core, strawberry and uvicorn beyond their public
API, checked when the app is assembled (and by `serve` for its websocket and HTTP protocols).

The fast path (on by default) has pieces built on library internals, each of which
answers exactly as the stock library would, only sooner, each switched by its own setting
(`BETTERCOMPUTE_FAST_PATH` sets all of them, and the compiled reads, at once):

- `executor` (`BETTERCOMPUTE_FAST_EXECUTOR`, schema/executor.py): graphql-core's
  `execute_fields`, `execute_operation`, `build_per_event_executor` and `complete_value`
  overridden, its `_relevant_sub_fields` memo, strawberry's execution context class, its
  fields' back-references and its `Info._raw_info` (PoolEvent.pool's field nodes);
- `websocket protocol` (`BETTERCOMPUTE_LEAN_WEBSOCKET`, app/websocket_protocol.py): a
  subclass of uvicorn's websockets-sansio protocol that rewrites its `send` and drops its
  handshake state;
- `one-write responses` (`BETTERCOMPUTE_ONE_WRITE_RESPONSES`, app/http_protocol.py): a
  subclass of uvicorn's httptools protocol that hands each request's cycle a transport
  sending what one loop turn writes as one write, on PostgreSQL (checked: the
  constructor, that `connection_made` and the websocket upgrade take what they took,
  that each cycle is given the transport, the attributes the subclass reads);
- `shared event frames` (with the executor and our websocket handlers, untraced;
  schema/shared_frames.py): a subscription event already rendered for an identical
  request is written as the frame strawberry would send; the server checks that with
  `usable` and shared_frames.strawberry_frame_problem (strawberry's two send paths run
  on a recorder), since this module may not import the schema.

Each is checked for the shape the fast code uses (a method's parameters, an attribute its
instances get). A piece that fails is left out with one warning naming it and why, and
that part runs the plain path: stock execution, uvicorn's own `websockets-sansio` and
HTTP protocol.
A piece's setting false (or `fast_path = false`) leaves it out.

Both paths also rely on three things no public API offers, checked here as well:

- strawberry's websocket handlers, subclassed by schema/websockets.py (the view's
  `*_handler_class` attributes are how strawberry lets them be replaced): if a method we
  override changed, strawberry's own handlers serve instead, with a warning (a bad token
  on graphql-ws then closes 1011, not 4403; no revocation or per-operation checks);
- graphql-core's messages for a variable that does not coerce and for a document over
  the token limit, the only place it says which input field failed or that the limit was
  hit: `input_field` and `token_limit` read them; if graphql-core words them
  otherwise, a warning says so and those errors lose `field` (or RESOURCE_EXHAUSTED);
- the graphql-core schema inside strawberry's (`_schema`, which strawberry's own
  validation and its ValidationCache read): cost and validation need it, so without it
  the app does not start.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from graphql import GraphQLError, GraphQLSchema, build_schema, execute_sync, parse

from app.config import Settings
from app.db.embedded import is_embedded

log = logging.getLogger(__name__)

# uvicorn's own websocket protocol, by the name `uvicorn.run(ws=...)` takes.
STOCK_WEBSOCKET_PROTOCOL = "websockets-sansio"
# uvicorn's own HTTP protocol (httptools when installed, else h11), and ours.
STOCK_HTTP_PROTOCOL = "auto"
ONE_WRITE_HTTP_PROTOCOL = "app.http_protocol:OneWriteHttpToolsProtocol"


@dataclass(frozen=True)
class Compatibility:
    """What the app is assembled with."""

    executor: bool  # the fast executor (schema/executor.py), else strawberry's
    websocket_handlers: bool  # ours (schema/websockets.py), else strawberry's


def check(settings: Settings) -> Compatibility:
    """Once per app: a warning for each piece that cannot run, and what can."""
    usable("graphql-core error messages", _messages_problem, "input errors go without `field`")
    return Compatibility(
        executor=settings.fast_executor and usable("executor", _executor_problem),
        websocket_handlers=usable(
            "websocket handlers", _websocket_handlers_problem, "strawberry's own handlers serve"
        ),
    )


def websocket_protocol(settings: Settings) -> type[Any] | str:
    """The protocol class for `uvicorn.run(ws=...)`: the lean one when it can run."""
    if settings.lean_websocket and usable("websocket protocol", _websocket_protocol_problem):
        from app.websocket_protocol import LeanWebSocketProtocol

        return LeanWebSocketProtocol
    return STOCK_WEBSOCKET_PROTOCOL


def http_protocol(settings: Settings) -> str:
    """The protocol for `uvicorn.run(http=...)` (or `uvicorn --http`), as an import string:
    on PostgreSQL the one-write protocol when it can run, else uvicorn's own choice (on
    the embedded SQLite default it measured no faster: app/http_protocol.py)."""
    if (
        settings.one_write_responses
        and not is_embedded(settings.database_url)
        and usable("one-write responses", _http_protocol_problem)
    ):
        return ONE_WRITE_HTTP_PROTOCOL
    return STOCK_HTTP_PROTOCOL


def usable(piece: str, problem: Callable[[], str | None], instead: str = "") -> bool:
    try:
        found = problem()
    except Exception as exc:  # the check itself broke: the library moved under it
        found = f"{type(exc).__name__}: {exc}"
    if found is None:
        return True
    fallback = instead or "the plain path serves instead"
    log.warning("%s cannot run (%s); %s", piece, found, fallback)
    return False


def _parameters(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


def _signature_problem(owner: type, name: str, expected: list[str]) -> str | None:
    method = getattr(owner, name, None)
    if method is None:
        return f"{owner.__name__}.{name} is gone"
    found = _parameters(method)
    if found != expected:
        return f"{owner.__name__}.{name} takes ({', '.join(found)}), not ({', '.join(expected)})"
    return None


def _first(*problems: str | None) -> str | None:
    return next((p for p in problems if p is not None), None)


def _attributes_problem(instance: object, names: tuple[str, ...]) -> str | None:
    missing = [name for name in names if not hasattr(instance, name)]
    if missing:
        return f"{type(instance).__name__} instances have no {', '.join(missing)}"
    return None


@cache  # read only by the probes; built once a process, not once an app (a test makes many)
def _probe_schema() -> GraphQLSchema:
    return build_schema(
        "input Quota { resource: String! max: Int! }"
        " input Probe { siteId: String! quota: [Quota!] }"
        " type Query { probe(input: Probe!): Int }"
    )


# --- the fast executor (schema/executor.py) -----------------------------------------


def _executor_problem() -> str | None:
    from graphql.execution.collect_fields import FieldDetails
    from strawberry.resolvers import is_default_resolver  # noqa: F401 - schema/executor.py's
    from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext as base
    from strawberry.schema.schema_converter import GraphQLCoreConverter
    from strawberry.types.field import StrawberryField

    fields = ["self", "parent_type", "source_value", "path", "grouped_field_set"]
    problem = _first(
        _signature_problem(base, "execute_fields", [*fields, "position_context"]),
        _signature_problem(base, "execute_operation", ["self", "serially"]),
        _signature_problem(base, "build_per_event_executor", ["self", "payload"]),
        _signature_problem(
            base,
            "complete_value",
            [
                "self",
                "return_type",
                "field_details_list",
                "info",
                "path",
                "result",
                "position_context",
            ],
        ),
    )
    if problem is not None:
        return problem
    from strawberry.types.info import Info

    # PoolEvent.pool's compiled read takes its field nodes from the resolver's raw info.
    if "_raw_info" not in getattr(Info, "__annotations__", {}):
        return "strawberry's Info has no _raw_info"
    if not isinstance(getattr(GraphQLCoreConverter, "DEFINITION_BACKREF", None), str):
        return "strawberry's GraphQLCoreConverter.DEFINITION_BACKREF is gone"
    if not isinstance(getattr(StrawberryField, "is_basic_field", None), property):
        return "StrawberryField.is_basic_field is gone"
    if "node" not in getattr(FieldDetails, "_fields", ()):
        return "graphql-core's FieldDetails has no `node`"
    executor = base.build(_probe_schema(), parse("{ __typename }"))
    if isinstance(executor, list):
        return f"an execution context could not be built: {executor}"
    problem = _attributes_problem(executor, ("middleware_manager", "is_awaitable"))
    if problem is not None:
        return problem
    if not isinstance(getattr(executor, "_relevant_sub_fields", None), dict):
        return "graphql-core's executor has no `_relevant_sub_fields` memo"
    return None


# --- the lean websocket protocol (app/websocket_protocol.py) -------------------------


def _websocket_protocol_problem() -> str | None:
    from uvicorn.config import Config
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
    from uvicorn.server import ServerState

    problem = _first(
        _signature_problem(
            WebSocketsSansIOProtocol,
            "__init__",
            ["self", "config", "server_state", "app_state", "_loop"],
        ),
        _signature_problem(WebSocketsSansIOProtocol, "send", ["self", "message"]),
    )
    if problem is not None:
        return problem

    async def no_app(scope: object, receive: object, send: object) -> None:
        raise AssertionError("never called")

    config = Config(no_app, log_config=None, lifespan="off", ws_per_message_deflate=False)
    loop = asyncio.new_event_loop()  # stored by the constructor, never run
    try:
        protocol = WebSocketsSansIOProtocol(config, ServerState(), {}, _loop=loop)
    finally:
        loop.close()
    state = (
        "queue", "conn", "transport", "loop", "writable", "disconnected",
        "handshake_complete", "initial_response", "close_sent",
    )  # fmt: skip
    return _attributes_problem(protocol, state)


# --- one write per HTTP response (app/http_protocol.py) ------------------------------


def _http_protocol_problem() -> str | None:
    from uvicorn.config import Config
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
    from uvicorn.server import ServerState

    problem = _first(
        _signature_problem(
            HttpToolsProtocol, "__init__", ["self", "config", "server_state", "app_state", "_loop"]
        ),
        _signature_problem(HttpToolsProtocol, "connection_made", ["self", "transport"]),
        _signature_problem(HttpToolsProtocol, "handle_websocket_upgrade", ["self"]),
        # Each request's cycle writes to the transport the protocol hands it.
        None
        if "transport" in _parameters(RequestResponseCycle.__init__)
        else "RequestResponseCycle is no longer given the transport",
    )
    if problem is not None:
        return problem

    async def no_app(scope: object, receive: object, send: object) -> None:
        raise AssertionError("never called")

    config = Config(no_app, log_config=None, lifespan="off")
    config.load()
    loop = asyncio.new_event_loop()  # stored by the constructor, never run
    try:
        protocol = HttpToolsProtocol(config, ServerState(), {}, _loop=loop)
    finally:
        loop.close()
    return _attributes_problem(protocol, ("transport", "loop"))


# --- strawberry's websocket handlers (schema/websockets.py) --------------------------


def _websocket_handlers_problem() -> str | None:
    from strawberry.asgi import ASGIWebSocketAdapter
    from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import (
        BaseGraphQLTransportWSHandler,
    )
    from strawberry.subscriptions.protocols.graphql_ws.handlers import BaseGraphQLWSHandler

    message = ["self", "message"]
    problem = _first(
        *(
            _signature_problem(handler, name, message)
            for handler in (BaseGraphQLTransportWSHandler, BaseGraphQLWSHandler)
            for name in ("handle_message", "handle_connection_init", "send_message")
        ),
        _signature_problem(BaseGraphQLTransportWSHandler, "handle_subscribe", message),
        _signature_problem(
            BaseGraphQLTransportWSHandler, "handle_invalid_message", ["self", "error_message"]
        ),
        _signature_problem(BaseGraphQLWSHandler, "handle_start", message),
        _signature_problem(ASGIWebSocketAdapter, "send_json", message),
        _signature_problem(ASGIWebSocketAdapter, "close", ["self", "code", "reason"]),
    )
    if problem is not None:
        return problem
    shared = (
        "view", "websocket", "context", "connection_acknowledged",
        "max_subscriptions_per_connection",
    )  # fmt: skip
    return _first(
        _attributes_problem(
            _built(BaseGraphQLTransportWSHandler),
            (*shared, "operations", "connection_init_timeout_task"),
        ),
        _attributes_problem(_built(BaseGraphQLWSHandler), (*shared, "tasks")),
    )


def _built(handler: type) -> object:
    """A handler made with None for every argument: what its constructor sets."""
    return handler(**dict.fromkeys(_parameters(handler)))


# --- graphql-core's messages (schema/errors.py) ---------------------------------------

# A document over the parser's `max_tokens`.
_TOO_MANY_TOKENS = re.compile(r"Document contains more than (\d+) tokens")
# Variable coercion names the offending input: `has invalid value at .quota[0].max:`,
# `to include required field 'siteId'`, `not to include unknown field 'priority'`.
_INPUT_FIELD = (
    re.compile(r"has invalid value at \.([^:]+):"),
    re.compile(r"include required field '(\w+)'"),
    re.compile(r"include unknown field '(\w+)'"),
)


def input_field(message: str) -> str | None:
    """The input field a variable-coercion error names (`quota[0].max`, `siteId`)."""
    for pattern in _INPUT_FIELD:
        match = pattern.search(message)
        if match:
            return match.group(1)
    return None


def token_limit(message: str) -> int | None:
    """The token limit the parser refused the document for, or None for any other error."""
    match = _TOO_MANY_TOKENS.search(message)
    return int(match.group(1)) if match else None


# Variables that do not coerce, and the field each error must name.
_MESSAGE_PROBES: tuple[tuple[dict[str, Any], str], ...] = (
    ({}, "siteId"),
    ({"siteId": "s", "priority": 1}, "priority"),
    ({"siteId": "s", "quota": [{"resource": "gpu", "max": "x"}]}, "quota[0].max"),
)


def _messages_problem() -> str | None:
    schema = _probe_schema()
    document = parse("query ($input: Probe!) { probe(input: $input) }")
    for value, expected in _MESSAGE_PROBES:
        result = execute_sync(schema, document, variable_values={"input": value})
        messages = [error.message for error in result.errors or ()]
        if [input_field(m) for m in messages] != [expected]:
            return f"a bad `{expected}` reads {messages!r}"
    try:
        parse("{ a b c }", max_tokens=2)
    except GraphQLError as refused:
        if token_limit(refused.message) != 2:
            return f"a document over the token limit reads {refused.message!r}"
        return None
    return "the parser ignored max_tokens"


# --- the graphql-core schema inside strawberry's (schema/limits.py) ------------------


def graphql_core_schema(schema: object) -> GraphQLSchema:
    """graphql-core's schema of a strawberry schema, for cost and validation."""
    core = getattr(schema, "_schema", None)
    if not isinstance(core, GraphQLSchema):
        raise RuntimeError(
            "strawberry's schema keeps no graphql-core schema in `_schema`: "
            "query cost and validation cannot run (app/compat.py)"
        )
    return core
