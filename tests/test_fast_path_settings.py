"""One setting per fast mechanism: BETTERCOMPUTE_COMPILED_READS, _FAST_EXECUTOR,
_LEAN_WEBSOCKET and _ONE_WRITE_RESPONSES each switch only their own, seen through a real
served process (a read answered by its compiled statement or not, the executor a query
runs on, the protocol classes holding a websocket and an HTTP connection);
BETTERCOMPUTE_FAST_PATH, the old name, sets all four, and one of them given beside it
wins."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import websockets
from prometheus_client import REGISTRY

from app.config import FAST_PATH_PIECES, Settings
from app.http_protocol import OneWriteHttpToolsProtocol
from app.websocket_protocol import LeanWebSocketProtocol
from schema.executor import FastFieldsExecutor
from tests.events.conftest import served_by
from tests.support import Fleet

LIST_POOLS = 'query { pools(tenantId: "acme", first: 10) { nodes { id } } }'


def test_the_old_name_sets_all_four(monkeypatch: pytest.MonkeyPatch) -> None:
    for value in (True, False):
        given = Settings(fast_path=value)
        assert [getattr(given, name) for name in FAST_PATH_PIECES] == [value] * 4
    assert [getattr(Settings(), name) for name in FAST_PATH_PIECES] == [True] * 4 or (
        Settings().fast_path is False  # a plain-path run (tests/conftest.py)
    )
    monkeypatch.setenv("BETTERCOMPUTE_FAST_PATH", "false")
    plain = Settings.from_env()
    assert [getattr(plain, name) for name in FAST_PATH_PIECES] == [False] * 4


@pytest.mark.parametrize("piece", FAST_PATH_PIECES)
def test_a_specific_setting_beside_the_old_name_wins(
    piece: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BETTERCOMPUTE_FAST_PATH", "false")
    monkeypatch.setenv(Settings.env_name(piece), "true")
    from_env = Settings.from_env()
    assert {name: getattr(from_env, name) for name in FAST_PATH_PIECES} == {
        name: name == piece for name in FAST_PATH_PIECES
    }
    given = Settings(fast_path=True, **{piece: False})
    assert {name: getattr(given, name) for name in FAST_PATH_PIECES} == {
        name: name != piece for name in FAST_PATH_PIECES
    }


def _answered() -> float:
    found = REGISTRY.get_sample_value("bettercompute_compiled_reads_total", {"outcome": "answered"})
    return found or 0.0


@pytest.mark.parametrize(
    "on",
    [(), *((piece,) for piece in FAST_PATH_PIECES), FAST_PATH_PIECES],
    ids=["none", *FAST_PATH_PIECES, "fast_path"],
)
async def test_each_setting_switches_only_its_mechanism(
    on: tuple[str, ...],
    database_url: str,
    dialect: str,
    fleet: Fleet,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    given: dict[str, Any] = (
        {"fast_path": True}
        if on == FAST_PATH_PIECES
        else {"fast_path": False, **dict.fromkeys(on, True)}
    )
    settings = Settings(database_url=database_url, **given)
    await fleet.tenant("acme")
    token = await fleet.caller("acme", "viewer")
    operations = 0
    stock = FastFieldsExecutor.execute_operation

    def counted(self: FastFieldsExecutor, *args: Any, **kwargs: Any) -> Any:
        nonlocal operations
        operations += 1
        return stock(self, *args, **kwargs)

    monkeypatch.setattr(FastFieldsExecutor, "execute_operation", counted)
    headers = {"authorization": f"Bearer {token}"}
    async with (
        served_by(settings) as (_, server, address),
        httpx.AsyncClient(base_url=f"http://{address}", timeout=30) as client,
    ):
        before = _answered()
        for _ in range(3):  # the first teaches the compiled path the query text
            answer = await client.post("/graphql", json={"query": LIST_POOLS}, headers=headers)
            assert answer.status_code == 200 and "errors" not in answer.json(), answer.text
        compiled = _answered() - before
        async with websockets.connect(
            f"ws://{address}/graphql",
            subprotocols=["graphql-transport-ws"],  # type: ignore[list-item]
        ) as ws:
            init = {"type": "connection_init", "payload": {"authorization": f"Bearer {token}"}}
            await ws.send(json.dumps(init))
            assert json.loads(await ws.recv())["type"] == "connection_ack"
            protocols = {type(c) for c in server.server_state.connections}

    # The compiled reads run on both dialects.
    assert (compiled == 2) is ("compiled_reads" in on), (dialect, compiled)
    assert (compiled == 0) is not ("compiled_reads" in on), (dialect, compiled)
    # The executor ran each query the compiled path did not answer, or none.
    assert (operations == 3 - compiled) is ("fast_executor" in on), operations
    assert (operations == 0) is ("fast_executor" not in on), operations
    assert (LeanWebSocketProtocol in protocols) is ("lean_websocket" in on), protocols
    # The HTTP client's connection, still open: each response in one write (on
    # PostgreSQL: app/compat.py), or uvicorn's.
    one_write = "one_write_responses" in on and dialect == "postgresql"
    assert (OneWriteHttpToolsProtocol in protocols) is one_write, protocols
