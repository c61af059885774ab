"""app/http_protocol.py: each HTTP response leaves in one write, through a real uvicorn
server and the real app, where uvicorn's own protocol writes two; pipelined requests,
`connection: close`, HEAD, 100 Continue, bodies past the holding bound, streamed bodies
and the websocket upgrade still go out whole, in order and at once; and `serve` runs
uvicorn's own protocol on SQLite, or when uvicorn's internals change.

The writes are counted by a layer under the protocol's transport that passes each one
on to the socket (the socket's transport, uvloop's, cannot be wrapped in place)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app import compat
from app.config import Settings
from app.http_protocol import OneWriteHttpToolsProtocol, OneWriteTransport
from app.websocket_protocol import LeanWebSocketProtocol
from tests.events.brokers import free_port
from tests.events.conftest import served, uvicorn_running
from tests.events.test_websocket import a_created_event_streams
from tests.support import Fleet

LIST_POOLS = 'query { pools(tenantId: "acme", first: 10) { nodes { id class } } }'


class CountedWrites:
    """The socket's transport, each write recorded on its way to the socket."""

    def __init__(self, transport: asyncio.Transport, writes: list[bytes]) -> None:
        self._transport = transport
        self.writes = writes

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


WRITES: list[bytes] = []  # every write of the counted protocols below, in order


class CountedOneWrite(OneWriteHttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CountedWrites(transport, WRITES))  # type: ignore[arg-type]


class CountedStock(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CountedWrites(transport, WRITES))  # type: ignore[arg-type]


async def _writes_per_answer(
    protocol: type[asyncio.Protocol], database_url: str, token: str
) -> tuple[list[int], list[bytes]]:
    """Writes per answer for a REST read, a GraphQL read and a 404, over one connection."""
    headers = {"authorization": f"Bearer {token}"}
    counts: list[int] = []
    answers: list[bytes] = []
    async with (
        served(Settings(database_url=database_url), http=protocol) as (_, address),
        httpx.AsyncClient(base_url=f"http://{address}", timeout=30) as client,
    ):
        asks = [
            ("/api/compute/pools/list", {"tenantId": "acme"}),
            ("/graphql", {"query": LIST_POOLS}),
            ("/api/compute/pools/nonesuch", {}),
        ]
        for path, body in asks:
            WRITES.clear()
            answer = await client.post(path, json=body, headers=headers)
            assert answer.status_code in (200, 404), answer.text
            counts.append(len(WRITES))
            answers.append(b"".join(WRITES))
            assert answers[-1].endswith(answer.content)
    return counts, answers


async def test_each_answer_is_one_write_where_uvicorn_writes_two(
    database_url: str, fleet: Fleet
) -> None:
    await fleet.tenant("acme")
    token = await fleet.caller("acme", "admin")
    one_write, one_write_bytes = await _writes_per_answer(CountedOneWrite, database_url, token)
    stock, stock_bytes = await _writes_per_answer(CountedStock, database_url, token)
    assert one_write == [1, 1, 1]
    assert stock == [2, 2, 2]  # head, then body: what the one-write protocol saves
    # The same responses, byte for byte, but for the ids and dates that differ per request.
    for ours, theirs in zip(one_write_bytes, stock_bytes, strict=True):
        assert ours.split(b"\r\n")[0] == theirs.split(b"\r\n")[0]  # status line
        assert len(ours) == len(theirs)


async def _exchange(address: str, raw: bytes) -> bytes:
    host, port = address.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(raw)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 30)  # until the server closes
    finally:
        writer.close()


async def test_pipelined_requests_and_close_answer_whole_and_in_order(database_url: str) -> None:
    """Two requests in one packet, the second asking to close: both answers, in order,
    then the connection closes (what was held is written before the close)."""
    async with served(Settings(database_url=database_url), http=CountedOneWrite) as (_, address):
        raw = await _exchange(
            address,
            b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n"
            b"GET /nonesuch HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
        )
    first, _, rest = raw.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200 "), raw
    assert rest.count(b"HTTP/1.1 ") == 1 and b"HTTP/1.1 404 " in rest, raw


LARGE = bytes(range(256)) * 1024  # 256 KiB: more than one send of the socket's
CHUNKS = [bytes([n]) * 10_000 for n in range(20)]


async def _large_and_streamed(request: Request) -> Response:
    if request.url.path == "/large":
        return Response(LARGE, media_type="application/octet-stream")
    if request.url.path == "/echo":
        return Response(await request.body(), media_type="application/octet-stream")

    async def chunks() -> AsyncIterator[bytes]:
        for chunk in CHUNKS:
            yield chunk
            await asyncio.sleep(0)  # a turn of the loop between chunks

    return StreamingResponse(chunks(), media_type="application/octet-stream")


@asynccontextmanager
async def _uvicorn(app: Any, protocol: type[asyncio.Protocol]) -> AsyncIterator[str]:
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=free_port(),
        http=protocol,
        lifespan="off",
        log_level="warning",
        timeout_keep_alive=60,  # an idle connection's close would send what is held
    )
    async with uvicorn_running(config):
        yield f"127.0.0.1:{config.port}"


_ROUTES = [
    Route("/large", _large_and_streamed),
    Route("/s", _large_and_streamed),
    Route("/echo", _large_and_streamed, methods=["POST"]),
]


async def test_large_and_streamed_bodies_leave_whole() -> None:
    """A large body leaves with its head in one write; a streamed body arrives whole and
    in order, its head with the first chunk and each later chunk as it is written."""
    async with (
        _uvicorn(Starlette(routes=_ROUTES), CountedOneWrite) as address,
        httpx.AsyncClient(base_url=f"http://{address}", timeout=30) as client,
    ):
        WRITES.clear()
        large = await client.get("/large")
        large_writes = len(WRITES)
        WRITES.clear()
        streamed = await client.get("/s")
        streamed_writes = len(WRITES)
    assert large.content == LARGE and large_writes == 1
    assert streamed.content == b"".join(CHUNKS)
    # The head joins the first chunk; the chunked encoding's end, sent by Starlette a
    # turn after the last chunk, is one write more.
    assert streamed_writes == len(CHUNKS) + 1


async def test_a_head_with_no_body_leaves_when_its_response_ends() -> None:
    """HEAD (uvicorn writes no body): the head goes out as the response completes, on a
    connection kept open with nothing written after it."""
    async with _uvicorn(Starlette(routes=_ROUTES), CountedOneWrite) as address:
        host, port = address.split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(b"HEAD /large HTTP/1.1\r\nhost: t\r\n\r\n")
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        finally:
            writer.close()
    assert head.startswith(b"HTTP/1.1 200 ") and b"content-length: 262144" in head, head


async def test_100_continue_is_not_held() -> None:
    """A client that waits for 100 Continue before its body gets it at once (an interim
    head is never held: held, both sides would wait on each other)."""
    body = b"x" * 1000
    async with _uvicorn(Starlette(routes=_ROUTES), CountedOneWrite) as address:
        host, port = address.split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(
                b"POST /echo HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\n"
                b"content-length: 1000\r\nconnection: close\r\n\r\n"
            )
            await writer.drain()
            interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(body)
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 30)
        finally:
            writer.close()
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(body), answer[:200]


UPGRADED: list[asyncio.BaseProtocol] = []


class RecordsUpgrades(OneWriteHttpToolsProtocol):
    def handle_websocket_upgrade(self) -> None:
        super().handle_websocket_upgrade()
        UPGRADED.append(self.transport.get_protocol())


async def test_a_websocket_upgrade_hands_over_the_sockets_transport(
    database_url: str, fleet: Fleet
) -> None:
    """After the upgrade the websocket protocol writes to the socket's transport (it joins
    its frames per turn itself), and an event streams to it."""
    settings = Settings(database_url=database_url, fast_path=True)
    UPGRADED.clear()
    async with served(settings, http=RecordsUpgrades) as (app, address):
        await a_created_event_streams(app, address, fleet, "graphql-transport-ws")
    (websocket,) = UPGRADED
    assert isinstance(websocket, LeanWebSocketProtocol)
    assert not isinstance(websocket.transport, OneWriteTransport)


def test_a_changed_uvicorn_http_protocol_serves_uvicorns_own(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def renamed(self: Any, the_transport: Any) -> None:
        raise AssertionError("never called")

    on_postgresql = Settings(fast_path=True, database_url="postgresql+asyncpg://h/db")
    assert compat.http_protocol(on_postgresql) == compat.ONE_WRITE_HTTP_PROTOCOL
    off = on_postgresql.model_copy(update={"one_write_responses": False})
    assert compat.http_protocol(off) == "auto"
    # The embedded default serves with uvicorn's own (measured no faster there).
    assert compat.http_protocol(Settings(fast_path=True, database_url="sqlite:///x.db")) == "auto"
    monkeypatch.setattr(HttpToolsProtocol, "connection_made", renamed)
    with caplog.at_level(logging.WARNING):
        assert compat.http_protocol(on_postgresql) == "auto"
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "app.compat"]
    assert warning.startswith("one-write responses cannot run (HttpToolsProtocol.connection_made")
