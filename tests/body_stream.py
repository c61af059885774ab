"""A request body sent in chunks, counting how many of them the server pulled."""

from __future__ import annotations

from collections.abc import AsyncIterator

CHUNK = 64 * 1024


class ChunkedBody:
    def __init__(self, total: int, prefix: bytes = b"") -> None:
        self.total = total
        self.prefix = prefix
        self.pulled = 0  # bytes handed to the server

    async def __aiter__(self) -> AsyncIterator[bytes]:
        sent = 0
        while sent < self.total:
            chunk = (self.prefix if sent == 0 else b"") + b" " * CHUNK
            chunk = chunk[: self.total - sent]
            sent += len(chunk)
            self.pulled = sent
            yield chunk
