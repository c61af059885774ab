"""`bettercompute serve` bounds each websocket message (BETTERCOMPUTE_WS_MAX_MESSAGE_BYTES,
1 MiB by default, where uvicorn's own default is 16 MiB): a larger frame closes that
socket with 1009 (message too big) and no other socket notices."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from app.config import Settings
from app.db.engine import Database
from tests.events.processes import bettercompute_serve
from tests.support import Fleet

TRANSPORT_WS = "graphql-transport-ws"
LIMIT = Settings().websocket_max_message_bytes


async def ping(ws: ClientConnection, padding: int = 0) -> dict[str, Any]:
    """A graphql-transport-ws ping (its payload padded to `padding` bytes); the pong."""
    message = {"type": "ping", "payload": {"padding": "x" * padding}}
    await ws.send(orjson.dumps(message).decode())
    answer: dict[str, Any] = orjson.loads(await asyncio.wait_for(ws.recv(), 10))
    return answer


@pytest.mark.parametrize("dialect", ["sqlite"])  # the bound is the transport's, not the store's
async def test_an_oversized_message_closes_its_socket_1009_and_spares_the_others(
    database_url: str, db: Database
) -> None:
    assert LIMIT == 1_048_576
    await Fleet(db).tenant("acme")
    token = await Fleet(db).caller("acme", "viewer")
    init = {"type": "connection_init", "payload": {"authorization": f"Bearer {token}"}}
    async with bettercompute_serve(BETTERCOMPUTE_DATABASE_URL=database_url) as served:
        url = f"ws://{served.address}/graphql"
        async with (
            connect(url, subprotocols=[TRANSPORT_WS], max_size=None) as bystander,
            connect(url, subprotocols=[TRANSPORT_WS], max_size=None) as sender,
        ):
            for ws in (bystander, sender):
                await ws.send(orjson.dumps(init).decode())
                assert orjson.loads(await ws.recv())["type"] == "connection_ack"
            # Under the bound: served as usual.
            assert (await ping(sender, padding=LIMIT // 2))["type"] == "pong"

            with pytest.raises(ConnectionClosed) as closed:
                await ping(sender, padding=LIMIT + 1)
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 1009

            assert (await ping(bystander))["type"] == "pong"
