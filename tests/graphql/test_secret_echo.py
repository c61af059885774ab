"""GraphQL's validation and coercion errors never echo a join token back (issue 19,
item 9): graphql-core prints the value it refused (a literal input object in full), so
where that value holds a secret field the message names the type and the field only.
Over HTTP and both websocket protocols, for create and update, literals and variables."""

from __future__ import annotations

import json
from typing import Any

import httpx
import websockets

from app.config import Settings
from tests.events.conftest import served
from tests.support import Fleet

SECRET = "bootstrap-0123456789abcdef-JOIN-TOKEN"
CA_HASH = "sha256:" + "0" * 64
POLICY_LITERAL = (
    '{kubernetes: {apiServer: "https://k8s.example:6443", token: "' + SECRET + '",'
    ' caCertHash: "' + CA_HASH + '"}}'
)
POLICY = {
    "kubernetes": {
        "apiServer": "https://k8s.example:6443",
        "token": SECRET,
        "caCertHash": CA_HASH,
    }
}
CREATE = "mutation($i: CreatePoolInput!) { createPool(input: $i) { __typename } }"
UPDATE = "mutation($i: UpdatePoolInput!) { updatePool(input: $i) { __typename } }"
POOL = {"tenantId": "acme", "siteId": "site_x", "class": "METAL_HOST"}
# (case, query, variables, a word the message must still hold)
REFUSED: tuple[tuple[str, str, dict[str, Any] | None, str], ...] = (
    (
        "create literal, unknown field",
        'mutation { createPool(input: {tenantId: "acme", siteId: "site_x", class: METAL_HOST,'
        f" colour: 1, policy: {POLICY_LITERAL}}}) {{ __typename }} }}",
        None,
        "colour",
    ),
    (
        "create literal, missing field",
        'mutation { createPool(input: {tenantId: "acme", class: METAL_HOST,'
        f" policy: {POLICY_LITERAL}}}) {{ __typename }} }}",
        None,
        "siteId",
    ),
    (
        "update literal, unknown field",
        'mutation { updatePool(input: {tenantId: "acme", poolId: "pool_x", dryrun: true,'
        f" policy: {POLICY_LITERAL}}}) {{ __typename }} }}",
        None,
        "dryrun",
    ),
    (
        "update literal, policy as a string field",
        'mutation { updatePool(input: {tenantId: "acme", poolId: "pool_x",'
        f" gpuModel: {POLICY_LITERAL}}}) {{ __typename }} }}",
        None,
        "String",
    ),
    ("update variable, the policy as the input", UPDATE, {"i": POLICY}, "tenantId"),
    (
        "update variable, policy as a string field",
        UPDATE,
        {"i": {"tenantId": "acme", "poolId": "pool_x", "gpuModel": POLICY}},
        "gpuModel",
    ),
    ("create variable, the policy as the input", CREATE, {"i": POLICY["kubernetes"]}, "siteId"),
    (
        "create variable, unknown field",
        CREATE,
        {"i": {**POOL, "colour": 1, "policy": POLICY}},
        "colour",
    ),
)


async def _websocket_answer(
    address: str, token: str, protocol: str, query: str, variables: dict[str, Any] | None
) -> str:
    """Everything the server sends for one operation, as text."""
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
            text = str(await ws.recv())
            message = json.loads(text)
            if message["type"] in ("next", "data", "error"):
                return text


async def test_refused_input_never_echoes_a_join_token(database_url: str, fleet: Fleet) -> None:
    await fleet.tenant("acme")
    token = await fleet.caller("acme", "admin")
    async with (
        served(Settings(database_url=database_url)) as (_, address),
        httpx.AsyncClient(base_url=f"http://{address}") as c,
    ):
        for case, query, variables, named in REFUSED:
            answer = await c.post(
                "/graphql",
                json={"query": query, "variables": variables},
                headers={"authorization": f"Bearer {token}"},
            )
            texts = {"http": answer.text}
            for protocol in ("graphql-transport-ws", "graphql-ws"):
                texts[protocol] = await _websocket_answer(
                    address, token, protocol, query, variables
                )
            for where, text in texts.items():
                assert SECRET not in text, (case, where, text)
                assert SECRET[:12] not in text, (case, where, text)
                body = json.loads(text)
                payload = body.get("payload", body)
                if isinstance(payload, dict) and "message" in payload:  # graphql-ws's error
                    payload = [payload]
                errors = payload if isinstance(payload, list) else payload.get("errors")
                assert errors, (case, where, text)
                assert {e["extensions"]["code"] for e in errors} == {"INVALID_INPUT"}, text
                # The error still says what was wrong: the field or the type it names.
                assert any(named in e["message"] for e in errors), (case, where, text)
