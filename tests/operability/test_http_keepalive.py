"""`bettercompute serve` keeps idle HTTP/1.1 connections open longer than clients do
(BETTERCOMPUTE_HTTP_KEEPALIVE_SECONDS, default 75). uvicorn's own default, 5 s, is httpx's
keep-alive expiry too: a client reusing a connection idle for about 5 s could send its
request as the server closed it, and get no answer, with nothing in the server's log
(issue 19, item 17; the quota race of tests/rest/test_quota_race_processes.py).
"""

from __future__ import annotations

import asyncio
import time

from tests.events.processes import bettercompute_serve

REQUEST = b"GET /livez HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
# Past httpx's 5 s expiry (and uvicorn's old default), with a margin for a busy machine.
IDLE_S = 7.0


async def _answer(reader: asyncio.StreamReader) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    await asyncio.wait_for(reader.readexactly(length), 60)
    return head.split(b"\r\n", 1)[0]


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Whether the server closes the idle connection within `seconds` (end of stream)."""
    try:
        return await asyncio.wait_for(reader.read(1), seconds) == b""
    except TimeoutError:
        return False


async def test_an_idle_connection_outlives_a_clients_keepalive_expiry() -> None:
    async with bettercompute_serve() as served:
        host, port = served.address.split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(REQUEST)
            assert await _answer(reader) == b"HTTP/1.1 200 OK"
            assert not await _closed_within(reader, IDLE_S)
            writer.write(REQUEST)  # the same connection, idle for IDLE_S
            assert await _answer(reader) == b"HTTP/1.1 200 OK"
        finally:
            writer.close()


async def test_the_keepalive_setting_reaches_uvicorn() -> None:
    async with bettercompute_serve(BETTERCOMPUTE_HTTP_KEEPALIVE_SECONDS="1") as served:
        host, port = served.address.split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(REQUEST)
            assert await _answer(reader) == b"HTTP/1.1 200 OK"
            started = time.monotonic()
            assert await _closed_within(reader, 30)
            assert time.monotonic() - started < 4  # not uvicorn's 5 s default

        finally:
            writer.close()
