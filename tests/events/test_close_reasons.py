"""What a refused websocket says (issue 23): one close reason for every bad token, so the
reason is no oracle, and the token limit named as a limit, on both protocols."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from app.config import Settings
from app.iam.callers import revoke_token
from schema.websockets import BAD_TOKEN
from tests.databases import empty_tables
from tests.events.conftest import served
from tests.events.test_protocol_edges import BOTH, LEGACY_WS, init, receive, send
from tests.support import Fleet


@pytest_asyncio.fixture(loop_scope="session")
async def bad_tokens(
    database_url_for: Callable[[str], Awaitable[str]],
) -> AsyncIterator[tuple[str, str, dict[str, str | None]]]:
    """A server, a good token, and a bad token of every kind: (address, token, bad)."""
    url = await database_url_for("sqlite")
    await empty_tables(url)
    async with served(Settings(database_url=url, max_tokens=50)) as (app, address):
        fleet = Fleet(app.state.capacity.db)
        await fleet.tenant("acme")
        good = await fleet.caller("acme", "viewer")
        revoked = await fleet.caller("acme", "viewer")
        assert await revoke_token(app.state.capacity.db, revoked)
        bad = {
            "unknown": "bct_" + "x" * 43,
            "revoked": revoked,
            "malformed": "not a token",
            "missing": None,
        }
        yield address, good, bad


async def close_reason(ws: ClientConnection) -> tuple[int, str]:
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await ws.recv()
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code, closed.value.rcvd.reason


@pytest.mark.parametrize("protocol", BOTH)
async def test_every_bad_token_closes_with_one_reason(
    bad_tokens: tuple[str, str, dict[str, str | None]], protocol: str
) -> None:
    address, _, bad = bad_tokens
    reasons = {}
    for kind, token in bad.items():
        async with connect(f"ws://{address}/graphql", subprotocols=[protocol]) as ws:
            await send(ws, init(token))
            if protocol == LEGACY_WS:
                error = await receive(ws)
                assert error["payload"]["extensions"]["code"] == "UNAUTHENTICATED", kind
            reasons[kind] = await close_reason(ws)
    assert set(reasons.values()) == {(4403, BAD_TOKEN)}, reasons


@pytest.mark.parametrize("protocol", BOTH)
async def test_the_token_limit_is_named_as_a_limit(
    bad_tokens: tuple[str, str, dict[str, str | None]], protocol: str
) -> None:
    address, good, _ = bad_tokens
    long_query = "{ catalog { " + "name " * 60 + "} }"
    async with connect(f"ws://{address}/graphql", subprotocols=[protocol]) as ws:
        await send(ws, init(good))
        assert (await receive(ws))["type"] == "connection_ack"
        kind = "start" if protocol == LEGACY_WS else "subscribe"
        await send(ws, {"id": "1", "type": kind, "payload": {"query": long_query}})
        answer = await receive(ws)
    errors = answer["payload"] if isinstance(answer["payload"], list) else [answer["payload"]]
    if "errors" in errors[0]:
        errors = errors[0]["errors"]
    error = errors[0]
    assert "Syntax Error" not in error["message"] and "50 tokens" in error["message"]
    assert error["extensions"] == {"code": "RESOURCE_EXHAUSTED", "limit": "tokens", "max": 50}
