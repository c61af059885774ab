"""One pure ASGI middleware for what every HTTP request reports: its request id (taken
from `X-Request-Id` or made, and sent back), its metrics, and one access log line.

The endpoints fill in the request's `RequestInfo` (a context variable) as they learn
things: the transport and method or GraphQL operation name, the caller and tenant once
authenticated, the error codes answered, the GraphQL cost, the rate-limit headers.
Every log record of the request carries its id (app/logs.py reads the variable).

What a request sends never becomes a metric label as it is (app/metrics.py): a REST path
is its catalog method or `unknown`, a GraphQL operation name one of a bounded set.
"""

from __future__ import annotations

import logging
import os
import re
import time
from contextvars import ContextVar
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import metrics
from app.asgi_headers import encoded, header, replace
from app.catalog import METHODS

log = logging.getLogger("app.access")

# A request id from the client is kept when it is short and plain (it goes into logs).
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class RequestIds:
    """Request ids as `secrets.token_hex(16)` makes them (16 bytes of os.urandom, in hex),
    the random bytes read 256 ids at a time: os.urandom lets go of the GIL for its
    system call, and under load taking it back per request costs more than the request's
    compiled read (profiled on SQLite, where the reads' threads hold it meanwhile)."""

    BATCH = 256

    def __init__(self) -> None:
        self._bytes = b""
        self._at = 0
        # A forked worker reads bytes of its own, never its parent's rest.
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._bytes, self._at = b"", 0

    def __call__(self) -> str:
        if self._at >= len(self._bytes):
            self._bytes, self._at = os.urandom(16 * self.BATCH), 0
        at = self._at
        self._at = at + 16
        return self._bytes[at : at + 16].hex()


new_request_id = RequestIds()
# A GraphQL operation name is a metric label: any other value counts as one label.
_OPERATION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


@dataclass
class RequestInfo:
    request_id: str
    transport: str = "http"
    operation: str = ""
    caller_id: str | None = None
    tenant_id: str | None = None
    codes: list[str] = field(default_factory=list)
    cost: int | None = None
    headers: dict[str, str] = field(default_factory=dict)  # added to the response

    def graphql_operation(self, name: object) -> None:
        self.transport = "graphql"
        if isinstance(name, str) and _OPERATION_NAME.fullmatch(name):
            self.operation = name
        else:
            self.operation = "anonymous" if name is None else "other"


current: ContextVar[RequestInfo | None] = ContextVar("request_info", default=None)


def request_info() -> RequestInfo | None:
    return current.get()


def record_code(code: str) -> None:
    """An error code the request answered (counted by code in the metrics)."""
    info = current.get()
    if info is not None:
        info.codes.append(code)


# REST operations by path: the catalog's methods (`pools/list`), the catalog itself.
_REST_PREFIX = "/api/compute/"
_REST_OPERATIONS = {m.path: m.path.removeprefix(_REST_PREFIX) for m in METHODS} | {
    "/api/compute/catalog": "catalog"
}
UNKNOWN = "unknown"  # any other path under /api/compute/ (a 404)
# GraphQL's operations that are not a name the request sent.
_GRAPHQL_FIXED = ("anonymous", metrics.OTHER)
# A path is logged whole up to this length (a request line may be far longer).
_MAX_LOGGED_PATH = 2048


def _route(path: str) -> tuple[str, str]:
    if path.startswith(_REST_PREFIX):
        return "rest", _REST_OPERATIONS.get(path, UNKNOWN)
    if path == "/graphql":
        return "graphql", "anonymous"
    return "http", _logged_path(path)  # logged, not a label: probes are not counted


def _logged_path(path: str) -> str:
    if len(path) <= _MAX_LOGGED_PATH:
        return path
    return f"{path[:_MAX_LOGGED_PATH]}...({len(path) - _MAX_LOGGED_PATH} more)"


class Observe:
    def __init__(self, app: ASGIApp, max_operations: int = 200) -> None:
        self.app = app
        self.operations = metrics.OperationNames(max_operations, _GRAPHQL_FIXED)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            metrics.WEBSOCKETS.inc()
            try:
                await self.app(scope, receive, send)
            finally:
                metrics.WEBSOCKETS.dec()
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = header(scope, b"x-request-id") or ""
        info = RequestInfo(sent if _CLIENT_ID.fullmatch(sent) else new_request_id())
        info.transport, info.operation = _route(scope["path"])
        token = current.set(info)
        transport = metrics.request_transport.set(info.transport)
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                added = [(b"x-request-id", info.request_id.encode("latin-1"))]
                replace(message, added + encoded(info.headers.items()))
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            duration = time.perf_counter() - started
            if info.transport != "http":  # probes and /metrics are not counted as requests
                operation = (
                    self.operations(info.operation)
                    if info.transport == "graphql"
                    else info.operation
                )
                metrics.observe_request(info.transport, operation, duration, info.codes)
            # Its values as the request sent them, escaped by the formatter (app/logs.py).
            # Built only when the line is written (plain uvicorn configures no logging).
            if log.isEnabledFor(logging.INFO):
                log.info(
                    "%s %s %s",
                    scope["method"],
                    _logged_path(scope["path"]),
                    status,
                    extra={
                        "transport": info.transport,
                        "operation": info.operation,
                        "caller_id": info.caller_id,
                        "tenant_id": info.tenant_id,
                        "status": status,
                        "duration_ms": round(duration * 1000, 3),
                        "cost": info.cost,
                        "codes": info.codes or None,
                    },
                )
            current.reset(token)
            metrics.request_transport.reset(transport)
