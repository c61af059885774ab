"""With introspection off, no error names what the schema holds (issue 19, item 10):
graphql-core's "Did you mean ...?" for fields, arguments, types and enum values (in
literals, and in variables as they are coerced) is left out, over HTTP and over both
websocket protocols; with introspection on, the suggestions help as before."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import websockets

from app.config import Settings
from tests.events.conftest import served
from tests.support import Fleet

CREATE = "mutation($i: CreatePoolInput!) { createPool(input: $i) { __typename } }"
# (what is misspelt, query, variables): each answered with a suggestion when introspection is on.
MISSPELT: tuple[tuple[str, str, dict[str, Any] | None], ...] = (
    ("field", "{ catalogg { name } }", None),
    ("sub-field", "{ catalog { nam } }", None),
    ("argument", '{ pools(tenantI: "acme") { nodes { id } } }', None),
    ("type", "query($x: CreatePoolInputt) { catalog(x: $x) { name } }", None),
    (
        "enum literal",
        'mutation { createPool(input: {tenantId: "acme", siteId: "s", class: METAL_HOS})'
        " { __typename } }",
        None,
    ),
    ("enum variable", CREATE, {"i": {"tenantId": "acme", "siteId": "s", "class": "METAL_HOS"}}),
    (
        "input field variable",
        CREATE,
        {"i": {"tenantId": "acme", "siteId": "s", "class": "METAL_HOST", "gpuModell": "H100"}},
    ),
    (
        "input field literal",
        'mutation { createPool(input: {tenantId: "acme", siteId: "s", class: METAL_HOST,'
        ' gpuModell: "H100"}) { __typename } }',
        None,
    ),
)


async def _over_websocket(
    address: str, token: str, protocol: str, query: str, variables: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """The errors a websocket operation answers, from an `error` or a `next` message."""
    async with websockets.connect(
        f"ws://{address}/graphql",
        subprotocols=[protocol],  # type: ignore[list-item]
    ) as ws:
        init = {"type": "connection_init", "payload": {"authorization": f"Bearer {token}"}}
        await ws.send(json.dumps(init))
        assert json.loads(await ws.recv())["type"] == "connection_ack"
        kind = "subscribe" if protocol == "graphql-transport-ws" else "start"
        payload = {"query": query, "variables": variables}
        await ws.send(json.dumps({"id": "1", "type": kind, "payload": payload}))
        while True:
            message = json.loads(await ws.recv())
            if message["type"] == "ka":
                continue
            assert message["id"] == "1", message
            body = message["payload"]
            if message["type"] == "error":
                return list(body) if isinstance(body, list) else [body]
            assert message["type"] in ("next", "data"), message
            return list(body.get("errors") or [])


@pytest.mark.parametrize("introspection", [False, True], ids=["introspection-off", "on"])
async def test_suggestions_follow_introspection(
    database_url: str, fleet: Fleet, introspection: bool
) -> None:
    await fleet.tenant("acme")
    token = await fleet.caller("acme", "admin")
    settings = Settings(database_url=database_url, introspection=introspection)
    async with (
        served(settings) as (_, address),
        httpx.AsyncClient(base_url=f"http://{address}") as c,
    ):
        for what, query, variables in MISSPELT:
            answer = await c.post(
                "/graphql",
                json={"query": query, "variables": variables},
                headers={"authorization": f"Bearer {token}"},
            )
            answers = {"http": answer.json().get("errors") or []}
            for protocol in ("graphql-transport-ws", "graphql-ws"):
                answers[protocol] = await _over_websocket(
                    address, token, protocol, query, variables
                )
            for where, errors in answers.items():
                assert errors, (what, where)
                assert all(e["extensions"]["code"] == "INVALID_INPUT" for e in errors), errors
                messages = " ".join(e["message"] for e in errors)
                assert ("Did you mean" in messages) == introspection, (what, where, messages)
