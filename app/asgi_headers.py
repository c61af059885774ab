"""Headers read from an ASGI scope and added to a response's start message as the raw
lists they are, for the middleware every request passes (app/observe.py,
app/security_headers.py, app/http/body_limit.py).

Starlette's `Headers`/`MutableHeaders` say the same but build an object, lower-case and
encode the name and decode the value per call; with three middleware layers doing so on
each request, that was a measurable share of a one-pool read's CPU. Names in ASGI
messages are lower-case bytes (the server's and starlette's), as `Headers` assumes too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

RawHeaders = list[tuple[bytes, bytes]]


def header(scope: Mapping[str, Any], name: bytes) -> str | None:
    """The first value of the header `name` (lower-case bytes) the request sent, or None:
    what `Headers(scope=scope).get(...)` gives."""
    for key, value in scope["headers"]:
        if key == name:
            decoded: str = value.decode("latin-1")
            return decoded
    return None


def encoded(pairs: Iterable[tuple[str, str]]) -> RawHeaders:
    """`pairs` as raw headers (names lower-cased, latin-1 as starlette encodes them)."""
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in pairs]


def add_missing(message: MutableMapping[str, Any], defaults: RawHeaders) -> None:
    """Each of `defaults` the response start `message` does not carry yet, appended:
    `MutableHeaders.setdefault` for each. The message gets a new list (a response may
    send the list it keeps)."""
    present = message.get("headers") or ()
    names = {key for key, _ in present}
    missing = [pair for pair in defaults if pair[0] not in names]
    if missing:
        message["headers"] = [*present, *missing]


def replace(message: MutableMapping[str, Any], headers: RawHeaders) -> None:
    """`headers` set on the response start `message`, each replacing any of its name as
    `MutableHeaders.__setitem__` does (the first kept in its place, the others dropped;
    appended when absent). The message gets a new list."""
    present: RawHeaders = list(message.get("headers") or ())
    names = {key for key, _ in present}
    for key, value in headers:
        if key not in names:
            present.append((key, value))
            names.add(key)
            continue
        at = [i for i, (k, _) in enumerate(present) if k == key]
        present[at[0]] = (key, value)
        for i in reversed(at[1:]):
            del present[i]
    message["headers"] = present
