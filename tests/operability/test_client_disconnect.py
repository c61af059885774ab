"""A client that leaves before its body has arrived (a load generator stopping, a browser
tab closed) is its own doing: answered INVALID_INPUT, which nobody reads, never counted
or logged as an INTERNAL error with a traceback."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from starlette.applications import Starlette

from tests.support import Fleet


async def _leave_midway(app: Starlette, path: str, token: str) -> list[dict[str, Any]]:
    """Send half a body, then disconnect; what the app sent back."""
    incoming = [
        {"type": "http.request", "body": b'{"query": "{ catal', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"authorization", f"Bearer {token}".encode()),
            (b"content-type", b"application/json"),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
        "app": app,
    }
    await app(scope, receive, send)
    return sent


@pytest.mark.parametrize("path", ["/graphql", "/api/compute/pools/get", "/api/compute/pools/list"])
async def test_a_client_gone_before_its_body_is_no_internal_error(
    app: Starlette, fleet: Fleet, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    await fleet.tenant("acme")
    token = await fleet.caller("acme", "viewer")
    with caplog.at_level(logging.INFO):
        for _ in range(2):  # the second with the caller remembered (compiled reads)
            sent = await _leave_midway(app, path, token)
            start = next(m for m in sent if m["type"] == "http.response.start")
            assert start["status"] == 400, sent
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert b"INTERNAL" not in b"".join(m.get("body", b"") for m in sent)
