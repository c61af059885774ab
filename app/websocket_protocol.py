"""uvicorn's websocket protocol (websockets-sansio) with less state per idle connection.

A server holds thousands of event subscribers, each on its own websocket, and most of
them wait for hours between messages. Per connection, uvicorn keeps the parsed upgrade
request and the handshake response (their header maps, ~4 KB) after the handshake has
used them, and an `asyncio.Queue` of incoming messages (four deques, ~3 KB) for a single
reader. This protocol lets the two go once the handshake is done and queues incoming
messages in a list made on demand. Everything else is uvicorn's.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol


class Inbox:
    """What uvicorn uses of `asyncio.Queue` (put_nowait, get, empty) for its one reader
    (the app's `receive`): no buffer while empty, one future while waiting."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: list[Any] | None = None
        self._waiter: asyncio.Future[None] | None = None

    def empty(self) -> bool:
        return not self._items

    def put_nowait(self, item: Any) -> None:
        if self._items is None:
            self._items = [item]
        else:
            self._items.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def get(self) -> Any:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._items.pop(0)  # a handful at most: reading pauses at the first one
        if not self._items:
            self._items = None
        return item


class LeanWebSocketProtocol(WebSocketsSansIOProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue = Inbox()  # type: ignore[assignment]

    async def send(self, message: Any) -> None:
        await super().send(message)
        if self.handshake_complete and getattr(self, "response", None) is not None:
            # Only the handshake reads these; a connection lives for hours after it. The
            # request's headers are emptied in place: the websockets parser's suspended
            # frame still holds the request itself.
            self.request.headers.clear()
            self.request = None  # type: ignore[assignment]
            self.response = None  # type: ignore[assignment]
