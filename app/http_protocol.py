"""uvicorn's HTTP protocol, each response written to the socket once, at the end of the
event loop's turn.

uvicorn writes a response's head when the app sends `http.response.start` and its body
when the app sends `http.response.body`: two `transport.write` calls, two sends on the
socket, two wake-ups of the client, for every small answer this service gives (on
loopback a send also runs the receiving side's TCP stack). Here the transport under the
protocol holds what is written within one turn of the event loop and sends it as one
write at the end of that turn: Starlette sends a response's head and body in one turn, so
they leave together; a streamed body still leaves chunk by chunk, as it is written.
Answers finished in the same turn (a batch of PostgreSQL results read in one poll) then
leave one after another, and their clients wake together.

Measured (bench/http_writes.py, docs/performance.md): on PostgreSQL compiled reads gain
up to about 15% and small answers about 20%; on the embedded SQLite default, whose reads
finish one per turn (each wakes the loop from aiosqlite's thread), the compiled reads ran
no faster or a little slower. Joining only a response's head to its body, in the same
call, saved nothing measurable: the gain is the turn's batch. So `serve` runs it on
PostgreSQL (app/compat.py, `http_protocol`).

The protocol is uvicorn's own (`HttpToolsProtocol`); only the transport it is given
differs. app/compat.py checks the shape this relies on (`connection_made` keeps the
transport it is given and hands it to each request's cycle) and serves with uvicorn's
stock protocol when it cannot.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# Past this many bytes held, write at once: a body streamed without a pause still meets
# the socket's flow control (the transport pauses the protocol when its buffer fills).
HOLD_AT_MOST = 64 * 1024


class OneWriteTransport:
    """A transport that sends what is written within one loop turn as one write."""

    __slots__ = ("_held", "_held_bytes", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._held_bytes = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(bytes(data))
        self._held_bytes += len(data)
        if self._held_bytes > HOLD_AT_MOST:
            self.flush()

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    @property
    def socket_transport(self) -> asyncio.Transport:
        return self._transport

    def flush(self) -> None:
        """Send what is held (called at the end of the loop turn it was written in)."""
        held = self._held
        if not held:
            return
        self._held = []
        self._held_bytes = 0
        if not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._held_bytes

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()  # what was written before close still goes out, as it would have
        self._transport.close()

    def abort(self) -> None:
        self._held = []
        self._held_bytes = 0
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        # Everything else (is_closing, get_extra_info, set_protocol, pause_reading, ...)
        # is the socket transport's own.
        return getattr(self._transport, name)


class OneWriteHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over a `OneWriteTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(OneWriteTransport(transport, self.loop))  # type: ignore[arg-type]

    def handle_websocket_upgrade(self) -> None:
        # The websocket protocol (app/websocket_protocol.py) joins its own frames per turn:
        # it gets the socket's transport, once what this one held has gone.
        one_write = self.transport
        if isinstance(one_write, OneWriteTransport):
            one_write.flush()
            self.transport = one_write.socket_transport
        super().handle_websocket_upgrade()
