"""The two websocket protocols, as strawberry runs them, with our answers at the edges
(docs/events.md):

- graphql-transport-ws: a bad token closes with 4403 (strawberry's Forbidden); one
  subscription over the connection's limit gets an `error` with RESOURCE_EXHAUSTED
  (the protocol's answer to refusing one operation), the connection stays up.
- graphql-ws (legacy): a bad token gets `connection_error` with the error, then the
  socket closes with 4403 as on the newer protocol (strawberry would use 1011); no
  connection_init in time closes with 4408 and a second one with 4429, as there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Final

from graphql import GraphQLFormattedError
from starlette.websockets import WebSocketDisconnect
from strawberry.asgi import ASGIWebSocketAdapter
from strawberry.exceptions import ConnectionRejectionError
from strawberry.http.exceptions import WebSocketDisconnected
from strawberry.subscriptions.protocols.graphql_transport_ws import types as transport_ws
from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import (
    BaseGraphQLTransportWSHandler,
)
from strawberry.subscriptions.protocols.graphql_ws import types as legacy_ws
from strawberry.subscriptions.protocols.graphql_ws.handlers import BaseGraphQLWSHandler
from strawberry.types.unset import UnsetType

from schema.context import Context
from schema.persisted import PersistedQueries, PersistedQueryError

FORBIDDEN: Final = 4403


class TextFrames(ASGIWebSocketAdapter):
    """Both protocols speak JSON in text frames; the view's encoder gives bytes (orjson),
    which strawberry would send as binary frames that clients reject."""

    async def send_json(self, message: Mapping[str, object]) -> None:
        encoded = self.view.encode_json(message)
        text = encoded.decode() if isinstance(encoded, bytes) else encoded
        try:
            await self.ws.send_text(text)
        except WebSocketDisconnect as exc:
            raise WebSocketDisconnected from exc


def _too_many(limit: int) -> GraphQLFormattedError:
    return {
        "message": f"at most {limit} subscriptions per connection",
        "extensions": {"code": "RESOURCE_EXHAUSTED", "limit": "subscriptionsPerConnection"},
    }


def _persisted_query(view: object, payload: Mapping[str, object]) -> str | GraphQLFormattedError:
    """The document a subscribe/start message runs under the view's persisted-query mode
    (an allow-list holds for websockets too), or the error that refuses it."""
    persisted: PersistedQueries = view.persisted  # type: ignore[attr-defined]
    query, extensions = payload.get("query"), payload.get("extensions")
    try:
        resolved = persisted.resolve(
            query if isinstance(query, str) and query else None,  # "" with a hash: by hash
            extensions if isinstance(extensions, dict) else None,
        )
    except PersistedQueryError as exc:
        return {"message": exc.message, "extensions": {"code": exc.code}}
    return resolved if resolved is not None else ""


class TransportWSHandler(BaseGraphQLTransportWSHandler[Context, None]):
    async def handle_connection_init(self, message: transport_ws.ConnectionInitMessage) -> None:
        await super().handle_connection_init(message)
        if self.connection_acknowledged:
            self.connection_init_timeout_task = None  # done; no need to keep it for hours

    async def handle_subscribe(self, message: transport_ws.SubscribeMessage) -> None:
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
            query = _persisted_query(self.view, message["payload"])
            if not isinstance(query, str):
                await self.send_message(
                    transport_ws.ErrorMessage(id=message["id"], type="error", payload=[query])
                )
                return
            message["payload"]["query"] = query
        await super().handle_subscribe(message)


class LegacyWSHandler(BaseGraphQLWSHandler[Context, None]):
    """Also given what the newer protocol has: a connection_init deadline (4408) and a
    single initialisation (a second one closes with 4429)."""

    async def handle(self) -> None:
        deadline = asyncio.create_task(self._close_unless_initialised())
        try:
            await super().handle()
        finally:
            deadline.cancel()
            await asyncio.gather(deadline, return_exceptions=True)

    async def _close_unless_initialised(self) -> None:
        await asyncio.sleep(self.view.connection_init_wait_timeout.total_seconds())
        if not self.connection_acknowledged:
            await self.websocket.close(code=4408, reason="Connection initialisation timeout")

    async def handle_connection_init(self, message: legacy_ws.ConnectionInitMessage) -> None:
        if self.connection_acknowledged:
            await self.websocket.close(code=4429, reason="Too many initialisation requests")
            return
        payload = message.get("payload")
        if payload is not None and not isinstance(payload, dict):
            await self.send_message({"type": "connection_error"})
            await self.websocket.close(code=1000, reason="")
            return
        self.context.connection_params = payload
        try:
            ack = await self.view.on_ws_connect(self.context)
        except ConnectionRejectionError as rejected:
            await self.send_message({"type": "connection_error", "payload": rejected.payload})
            await self.websocket.close(code=FORBIDDEN, reason="Forbidden")
            return
        if isinstance(ack, UnsetType) or ack is None:
            await self.send_message({"type": "connection_ack"})
        else:
            await self.send_message({"type": "connection_ack", "payload": ack})
        self.connection_acknowledged = True
        if self.keep_alive:
            self.keep_alive_task = asyncio.create_task(self.handle_keep_alive())

    async def handle_start(self, message: legacy_ws.StartMessage) -> None:
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
            query = _persisted_query(self.view, message["payload"])
            if not isinstance(query, str):
                await self.send_message(
                    legacy_ws.ErrorMessage(type="error", id=message["id"], payload=query)
                )
                return
            message["payload"]["query"] = query
        await super().handle_start(message)
