"""The raw header helpers the middleware use (app/asgi_headers.py) give what starlette's
Headers and MutableHeaders give, which they replace on every request's path."""

from __future__ import annotations

from typing import Any

from starlette.datastructures import Headers, MutableHeaders

from app.asgi_headers import add_missing, encoded, header, replace

SENT = [(b"host", b"x"), (b"x-request-id", b"caf\xe9"), (b"x-request-id", b"second")]
ANSWERED = [
    (b"content-type", b"application/json"),
    (b"x-ratelimit-limit", b"10"),
    (b"x-frame-options", b"SAMEORIGIN"),
    (b"x-ratelimit-limit", b"11"),
]


def test_header_is_the_first_value_sent() -> None:
    scope: dict[str, Any] = {"headers": SENT}
    for name in ("x-request-id", "host", "content-length"):
        assert header(scope, name.encode()) == Headers(scope=scope).get(name)


def test_add_missing_is_setdefault_for_each() -> None:
    defaults = [("x-frame-options", "DENY"), ("Referrer-Policy", "no-referrer")]
    ours: dict[str, Any] = {"type": "http.response.start", "headers": list(ANSWERED)}
    theirs: dict[str, Any] = {"type": "http.response.start", "headers": list(ANSWERED)}
    add_missing(ours, encoded(defaults))
    kept = MutableHeaders(scope=theirs)
    for name, value in defaults:
        kept.setdefault(name, value)
    assert ours["headers"] == theirs["headers"]


def test_replace_is_setitem_for_each() -> None:
    added = [("x-ratelimit-limit", "12"), ("X-Request-Id", "abc"), ("x-frame-options", "DENY")]
    ours: dict[str, Any] = {"type": "http.response.start", "headers": list(ANSWERED)}
    theirs: dict[str, Any] = {"type": "http.response.start", "headers": list(ANSWERED)}
    replace(ours, encoded(added))
    kept = MutableHeaders(scope=theirs)
    for name, value in added:
        kept[name] = value
    assert ours["headers"] == theirs["headers"]


def test_the_response_keeps_its_own_list() -> None:
    own = list(ANSWERED)
    message: dict[str, Any] = {"type": "http.response.start", "headers": own}
    add_missing(message, encoded([("x-content-type-options", "nosniff")]))
    replace(message, encoded([("x-request-id", "abc")]))
    assert own == ANSWERED and message["headers"] is not own
