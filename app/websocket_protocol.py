"""uvicorn's websocket protocol (websockets-sansio) with less state per idle connection.

A server holds thousands of event subscribers, each on its own websocket, and most of
them wait for hours between messages. Per connection, uvicorn keeps the parsed upgrade
request and the handshake response (their header maps, ~4 KB) after the handshake has
used them, and an `asyncio.Queue` of incoming messages (four deques, ~3 KB) for a single
reader. This protocol lets the two go once the handshake is done and queues incoming
messages in a list made on demand. Everything else is uvicorn's.

It also writes the frames one connection sends in one turn of the event loop with one
`transport.write`: a subscriber with a backlog of events sends them all in one turn,
and each write is a system call that costs more than building the frame (on loopback
it also runs the receiver's TCP stack). A frame is never held past the end of the turn,
and a backlog over `FLUSH_BYTES` is written at once, so the transport's flow control
(pause_writing, and through it the relay's stall detection) sees it as before.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidState
from websockets.protocol import State

# Written at once past this many bytes waiting (asyncio's default high-water mark).
FLUSH_BYTES = 64 * 1024


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
    _unwritten: list[bytes] | None = None  # frames waiting for the end of this turn
    _unwritten_bytes = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue = Inbox()  # type: ignore[assignment]

    async def send(self, message: Any) -> None:
        if (
            message["type"] == "websocket.send"
            and self.handshake_complete
            and self.initial_response is None
            and not self.close_sent
        ):
            await self.writable.wait()
            if self.disconnected:
                raise ClientDisconnected()
            text = message.get("text")
            try:
                if text is not None:
                    self.conn.send_text(text.encode())
                else:
                    self.conn.send_binary(message["bytes"])
            except InvalidState:
                raise ClientDisconnected() from None
            self._write_soon(self.conn.data_to_send())
            return
        self._write_now()  # anything else (a close above all) goes after the frames
        await super().send(message)
        if self.handshake_complete and getattr(self, "response", None) is not None:
            # Only the handshake reads these; a connection lives for hours after it. The
            # request's headers are emptied in place: the websockets parser's suspended
            # frame still holds the request itself.
            self.request.headers.clear()
            self.request = None  # type: ignore[assignment]
            self.response = None  # type: ignore[assignment]

    def _write_soon(self, output: list[bytes]) -> None:
        if self._unwritten is None:
            self._unwritten = output
            self._unwritten_bytes = 0
            self.loop.call_soon(self._write_now)
        else:
            self._unwritten += output
        self._unwritten_bytes += sum(len(chunk) for chunk in output)
        if self._unwritten_bytes >= FLUSH_BYTES:
            self._write_now()

    def _write_now(self) -> None:
        output, self._unwritten = self._unwritten, None
        # Frames are dropped only when the connection is closing: uvicorn answered the
        # client's close frame (or sent its own) already, and nothing may follow it.
        if output and not self.transport.is_closing() and self.conn.state is State.OPEN:
            self.transport.write(b"".join(output))
