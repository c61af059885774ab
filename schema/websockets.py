"""The two websocket protocols, as strawberry runs them, with our answers at the edges
(docs/events.md):

- graphql-transport-ws: a bad token closes with 4403 (strawberry's Forbidden); one
  subscription over the connection's limit, or over its caller's or tenant's
  (schema/subscription_bounds.py), gets an `error` with RESOURCE_EXHAUSTED (the
  protocol's answer to refusing one operation), the connection stays up (legacy too).
- graphql-ws (legacy): a bad token gets `connection_error` with the error, then the
  socket closes with 4403 as on the newer protocol (strawberry would use 1011); no
  connection_init in time closes with 4408 and a second one with 4429, as there.

On both, every operation goes through admission again (app/http/admission.py): a token
revoked since connection_init gets UNAUTHENTICATED for the operation and the socket closes
with 4403; a caller whose request budget is spent (over any transport) gets an `error`
with RESOURCE_EXHAUSTED for the operation, and the socket stays open; sockets that only
stream are closed (4403) by the process's revocation watcher (app/iam/revocations.py).
A message of a shape its protocol does not define closes graphql-transport-ws with 4400
(as the protocol says); legacy graphql-ws answers it with an `error` message, as its
reference server did, and carries on.

The handlers subclass strawberry's and call its methods (no copy of them): app/compat.py
checks those methods at start-up, and strawberry's own handlers serve if they changed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from contextvars import Token
from typing import Any, Final, cast

from graphql import GraphQLFormattedError
from starlette.websockets import WebSocketDisconnect, WebSocketState
from strawberry.asgi import ASGIWebSocketAdapter
from strawberry.http.exceptions import WebSocketDisconnected
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL, GRAPHQL_WS_PROTOCOL
from strawberry.subscriptions.protocols.graphql_transport_ws import types as transport_ws
from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import (
    BaseGraphQLTransportWSHandler,
)
from strawberry.subscriptions.protocols.graphql_ws import types as legacy_ws
from strawberry.subscriptions.protocols.graphql_ws.handlers import BaseGraphQLWSHandler

from app.db.errors import to_domain_error
from app.errors import DomainError, Unauthenticated
from app.http.admission import Admission
from app.iam.callers import bearer_token_hash
from app.iam.revocations import FORBIDDEN, RevocationWatcher
from schema.context import Context
from schema.operations import sent_operation_name
from schema.persisted import PersistedQueries, PersistedQueryError
from schema.shared_frames import FrameWriter, current_writer
from schema.subscription_bounds import take_slot

# RFC 6455 "Try Again Later": the connection could not be authenticated because the
# database is out of reach, which is no reason for a client to give up (4403 would be).
TRY_AGAIN_LATER: Final = 1013


class BackendUnavailable(Exception):
    """on_ws_connect could not authenticate: the database or broker is out of reach."""


_LEGACY_TYPES: Final = frozenset({"connection_init", "connection_terminate", "start", "stop"})


class TextFrames(ASGIWebSocketAdapter):
    """Both protocols speak JSON in text frames; the view's encoder gives bytes (orjson),
    which strawberry would send as binary frames that clients reject."""

    async def send_json(self, message: Mapping[str, object]) -> None:
        await self.send_text_frame(self.encode_payload(message))

    def encode_payload(self, payload: Mapping[str, object]) -> str:
        encoded = self.view.encode_json(payload)
        return encoded.decode() if isinstance(encoded, bytes) else encoded

    async def send_text_frame(self, text: str) -> None:
        """One text frame (a message built here or by schema/shared_frames.py)."""
        if self.ws.application_state == WebSocketState.DISCONNECTED:
            raise WebSocketDisconnected  # we closed it (4403, 4413...): nothing more goes out
        try:
            await self.ws.send_text(text)
        except WebSocketDisconnect as exc:
            raise WebSocketDisconnected from exc

    async def close(self, code: int, reason: str) -> None:
        """Once: the revocation watcher may close a socket its handler is closing. A
        refused connection_init closes with the reason `on_ws_connect` left in the
        connection's state (strawberry says only "Forbidden")."""
        if code == FORBIDDEN:
            reason = getattr(self.ws.state, REFUSAL, None) or reason
        if self.ws.application_state != WebSocketState.DISCONNECTED:
            await self.ws.close(code=code, reason=reason)


# Every bad token closes with the same reason, unknown, expired or revoked (at connect or
# while open) alike, so that the reason tells nothing about the token (docs/events.md).
BAD_TOKEN = "Unauthenticated: the token is not valid"
REFUSAL = "bettercompute_refusal"  # where on_ws_connect leaves a refusal's close reason


def refusal_reason(error: DomainError) -> str:
    """The close reason (4403) of a connection_init that `error` refused."""
    if isinstance(error, Unauthenticated):
        return BAD_TOKEN
    if error.code == "RESOURCE_EXHAUSTED":  # the per-address allowance (app/http/admission.py)
        return "Too many attempts without a valid token from this address; retry later"
    return "Forbidden"


def _coded(message: str, code: str) -> GraphQLFormattedError:
    return {"message": message, "extensions": {"code": code}}


def _refusal(error: DomainError) -> GraphQLFormattedError:
    """An operation's refusal, with its details (a budget's `limit`, `retryAfterSeconds`)."""
    return {"message": error.message, "extensions": {"code": error.code, **error.details}}


def _operation_problem(payload: object) -> str | None:
    """What is wrong with a subscribe/start payload's shape, if anything (both protocols:
    `{query: string, variables?: object, operationName?: string, extensions?: object}`)."""
    if not isinstance(payload, dict):
        return "payload must be an object"
    if not isinstance(payload.get("query"), str):
        return "payload.query must be a string"
    for key in ("variables", "extensions"):
        if not isinstance(payload.get(key), dict | None):
            return f"payload.{key} must be an object"
    if not isinstance(payload.get("operationName"), str | None):
        return "payload.operationName must be a string"
    return None


def _message_problem(message: object, operations: tuple[str, ...]) -> str | None:
    """What is wrong with a protocol message's shape, if anything. `operations`: the
    types that carry an id; the first of them carries an operation payload."""
    if not isinstance(message, dict):
        return "a message must be a JSON object"
    kind = message.get("type")
    if not isinstance(kind, str):
        return "type must be a string"
    if kind in operations and not isinstance(message.get("id"), str):
        return "id must be a string"
    if kind == operations[0]:
        return _operation_problem(message.get("payload"))
    if kind in ("ping", "pong") and not isinstance(message.get("payload"), dict | None):
        return "payload must be an object"
    return None


def _watcher(context: Context) -> RevocationWatcher:
    watcher: RevocationWatcher = context.request.app.state.revocations
    return watcher


class RevocableConnection:
    """What both handlers add: the socket is known to the process's revocation watcher
    from its connection_ack to its end, and each operation checks the token again."""

    context: Context
    websocket: TextFrames
    _token_hash: str | None = None

    def _watch_token(self) -> None:
        self._token_hash = bearer_token_hash(self.context.authorization())
        _watcher(self.context).register(self._token_hash, self)

    def _unwatch_token(self) -> None:
        if self._token_hash is not None:
            _watcher(self.context).unregister(self._token_hash, self)
            self._token_hash = None

    def _frame_writer(self, protocol: str, operation_id: str) -> Token[FrameWriter | None]:
        """The operation's writer of shared frames (schema/shared_frames.py), when the
        view sends them."""
        shares = getattr(self.websocket.view, "shared_frames", False)
        writer = FrameWriter(self.websocket, protocol, operation_id) if shares else None
        return current_writer.set(writer)

    async def close_revoked(self) -> None:
        await self.websocket.close(code=FORBIDDEN, reason=BAD_TOKEN)

    async def _recheck_token(self) -> DomainError | None:
        """Before each operation, its admission (app/http/admission.py): the token checked
        again and the caller's request budget charged, as over HTTP. None when admitted,
        else why not (UNAUTHENTICATED; RESOURCE_EXHAUSTED, the budget; UNAVAILABLE when
        the database cannot say)."""
        context = self.context
        admission: Admission = context.request.app.state.admission
        try:
            await admission.admit(context.request, context.authorization(), context.reauthenticate)
        except Exception as exc:
            return to_domain_error(exc)
        return None


def _too_many(limit: int) -> GraphQLFormattedError:
    return {
        "message": f"at most {limit} subscriptions per connection",
        "extensions": {"code": "RESOURCE_EXHAUSTED", "limit": "subscriptionsPerConnection"},
    }


def _persisted_query(
    view: object, payload: Mapping[str, object], tenant: str
) -> str | GraphQLFormattedError:
    """The document a subscribe/start message of a `tenant`'s caller runs under the view's
    persisted-query mode (an allow-list holds for websockets too; registrations are the
    tenant's own), or the error that refuses it."""
    persisted: PersistedQueries = view.persisted  # type: ignore[attr-defined]
    query, extensions = payload.get("query"), payload.get("extensions")
    try:
        resolved = persisted.resolve(
            query if isinstance(query, str) and query else None,  # "" with a hash: by hash
            extensions if isinstance(extensions, dict) else None,
            tenant,
        )
    except PersistedQueryError as exc:
        return {"message": exc.message, "extensions": {"code": exc.code}}
    return resolved if resolved is not None else ""


class TransportWSHandler(RevocableConnection, BaseGraphQLTransportWSHandler[Context, None]):
    websocket: TextFrames

    async def handle(self) -> None:
        try:
            await super().handle()
        finally:
            self._unwatch_token()

    async def handle_message(self, message: transport_ws.Message) -> None:
        problem = _message_problem(message, ("subscribe", "complete"))
        if problem is not None:
            await self.handle_invalid_message(f"Invalid message: {problem}")
            return
        await super().handle_message(message)

    async def handle_connection_init(self, message: transport_ws.ConnectionInitMessage) -> None:
        try:
            await super().handle_connection_init(message)
        except BackendUnavailable:
            await self.websocket.close(code=TRY_AGAIN_LATER, reason="Try again later")
            return
        if self.connection_acknowledged:
            self.connection_init_timeout_task = None  # done; no need to keep it for hours
            self._watch_token()

    async def handle_subscribe(self, message: transport_ws.SubscribeMessage) -> None:
        if self.connection_acknowledged:
            refused = await self._recheck_token()
            if refused is not None:
                error = _refusal(refused)
                await self.send_message(
                    transport_ws.ErrorMessage(id=message["id"], type="error", payload=[error])
                )
                if isinstance(refused, Unauthenticated):
                    await self.close_revoked()
                return
        limit = self.max_subscriptions_per_connection
        if (
            self.connection_acknowledged
            and limit is not None
            and message["id"] not in self.operations
            and len(self.operations) >= limit
        ):
            await self.send_message(
                transport_ws.ErrorMessage(
                    id=message["id"], type="error", payload=[_too_many(limit)]
                )
            )
            return
        if self.connection_acknowledged:
            tenant = (await self.context.principal()).tenant_id  # checked just above
            query = _persisted_query(self.view, message["payload"], tenant)
            if not isinstance(query, str):
                await self.send_message(
                    transport_ws.ErrorMessage(id=message["id"], type="error", payload=[query])
                )
                return
            message["payload"]["query"] = query
            slot = await take_slot(self.context, message["payload"])  # bounds per caller/tenant
            if isinstance(slot, dict):
                await self.send_message(
                    transport_ws.ErrorMessage(id=message["id"], type="error", payload=[slot])
                )
                return
        else:
            slot = None
        # The operation's task, made by strawberry below, starts with these values.
        sent_operation_name.set(message["payload"].get("operationName"))
        writer = self._frame_writer(GRAPHQL_TRANSPORT_WS_PROTOCOL, message["id"])
        try:
            await super().handle_subscribe(message)
        finally:
            current_writer.reset(writer)
            if slot is not None:
                operation = self.operations.get(message["id"])
                slot.hold_until_done(operation.task if operation is not None else None)


class _AnyOperation:
    """A schema whose `subscribe` runs any operation (`stream`, strawberry's public API):
    strawberry's legacy handler asks `subscribe`, which refuses queries and mutations, so a
    query over graphql-ws answered INTERNAL where graphql-transport-ws answers it."""

    def __init__(self, schema: Any) -> None:
        self._schema = schema

    def __getattr__(self, name: str) -> Any:
        return getattr(self._schema, name)

    async def subscribe(self, **kwargs: Any) -> Any:
        return await self._schema.stream(**kwargs)


class LegacyWSHandler(RevocableConnection, BaseGraphQLWSHandler[Context, None]):
    """Also given what the newer protocol has: a connection_init deadline (4408), a
    single initialisation (a second one closes with 4429), and queries and mutations
    answered once, then `complete`."""

    websocket: TextFrames

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.schema = cast(Any, _AnyOperation(self.schema))

    async def handle(self) -> None:
        deadline = asyncio.create_task(self._close_unless_initialised())
        try:
            await super().handle()
        finally:
            self._unwatch_token()
            deadline.cancel()
            await asyncio.gather(deadline, return_exceptions=True)

    async def handle_message(self, message: legacy_ws.OperationMessage) -> None:
        problem = _message_problem(message, ("start", "stop"))
        kind = message.get("type") if problem is None else None
        if problem is None and kind not in _LEGACY_TYPES:
            problem = f"unknown message type {kind}"
        if problem is not None:
            operation_id = message.get("id") if isinstance(message, dict) else None
            # The reference server's answer; the protocol's ErrorMessage type wants an id.
            error = _coded(f"Invalid message: {problem}", "INVALID_INPUT")
            await self.websocket.send_json(
                {
                    "type": "error",
                    "id": operation_id if isinstance(operation_id, str) else None,
                    "payload": error,
                }
            )
            return
        await super().handle_message(message)

    async def _close_unless_initialised(self) -> None:
        await asyncio.sleep(self.view.connection_init_wait_timeout.total_seconds())
        if not self.connection_acknowledged:
            await self.websocket.close(code=4408, reason="Connection initialisation timeout")

    async def handle_connection_init(self, message: legacy_ws.ConnectionInitMessage) -> None:
        if self.connection_acknowledged:
            await self.websocket.close(code=4429, reason="Too many initialisation requests")
            return
        try:
            await super().handle_connection_init(message)
        except BackendUnavailable as unavailable:
            error = _coded(str(unavailable), "UNAVAILABLE")
            # Sent as is: send_message would read a connection_error as a rejection.
            await self.websocket.send_json({"type": "connection_error", "payload": error})
            await self.websocket.close(code=TRY_AGAIN_LATER, reason="Try again later")
            return
        if self.connection_acknowledged:
            self._watch_token()

    async def send_message(self, message: legacy_ws.OperationMessage) -> None:
        await super().send_message(message)
        if message["type"] == "connection_error" and message.get("payload") is not None:
            # strawberry's answer to a rejected connection_init (a bad token); it closes
            # with 1011 next, which TextFrames ignores once this has closed the socket.
            await self.websocket.close(code=FORBIDDEN, reason="Forbidden")  # or the refusal

    async def handle_start(self, message: legacy_ws.StartMessage) -> None:
        if self.connection_acknowledged:
            refused = await self._recheck_token()
            if refused is not None:
                error = _refusal(refused)
                await self.send_message(
                    legacy_ws.ErrorMessage(type="error", id=message["id"], payload=error)
                )
                if isinstance(refused, Unauthenticated):
                    await self.close_revoked()
                return
        limit = self.max_subscriptions_per_connection
        if (
            self.connection_acknowledged
            and limit is not None
            and message["id"] not in self.tasks
            and len(self.tasks) >= limit
        ):
            await self.send_message(
                legacy_ws.ErrorMessage(type="error", id=message["id"], payload=_too_many(limit))
            )
            return
        if self.connection_acknowledged:
            tenant = (await self.context.principal()).tenant_id  # checked just above
            query = _persisted_query(self.view, message["payload"], tenant)
            if not isinstance(query, str):
                await self.send_message(
                    legacy_ws.ErrorMessage(type="error", id=message["id"], payload=query)
                )
                return
            message["payload"]["query"] = query
            slot = await take_slot(self.context, message["payload"])  # bounds per caller/tenant
            if isinstance(slot, dict):
                await self.send_message(
                    legacy_ws.ErrorMessage(type="error", id=message["id"], payload=slot)
                )
                return
        else:
            slot = None
        # The operation's task, made by strawberry below, starts with these values.
        sent_operation_name.set(message["payload"].get("operationName"))
        writer = self._frame_writer(GRAPHQL_WS_PROTOCOL, message["id"])
        try:
            await super().handle_start(message)
        finally:
            current_writer.reset(writer)
            if slot is not None:
                slot.hold_until_done(self.tasks.get(message["id"]))
