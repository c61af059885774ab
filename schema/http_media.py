"""GraphQL over HTTP: which media type a response takes, and what a request error
(one before execution) looks like under each (docs/decisions/0001)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from typing import Any

from graphql import GraphQLError

GRAPHQL_RESPONSE_JSON = "application/graphql-response+json"
JSON = "application/json"

# The media type negotiated for the request being served (one ASGI task per request).
response_media: ContextVar[str] = ContextVar("response_media", default=JSON)


def negotiate(accept: str | None) -> str | None:
    """The response media type for `Accept`, or None when neither JSON type is acceptable
    (406). No `Accept` (or an empty one) is application/json, as the spec's legacy clients
    expect; `*/*` and `application/*` are application/json too."""
    if accept is None or not accept.strip():
        return JSON
    ranges: list[tuple[float, int, str]] = []
    for index, part in enumerate(accept.split(",")):
        media, *params = (p.strip() for p in part.split(";"))
        quality = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if quality > 0:
            ranges.append((-quality, index, media.lower()))
    for _, _, media in sorted(ranges):
        if media == GRAPHQL_RESPONSE_JSON:
            return GRAPHQL_RESPONSE_JSON
        if media in (JSON, "application/*", "*/*"):
            return JSON
    return None


def is_request_error(data: object, errors: Iterable[GraphQLError] | None) -> bool:
    """An error before execution began (parse, validation, variable coercion, a refused
    operation): no data, and no error on a field path."""
    error_list = list(errors or ())
    return data is None and bool(error_list) and all(not e.path for e in error_list)


def request_error_status(errors: Iterable[Mapping[str, Any]]) -> int:
    """4xx for a request error under application/graphql-response+json: 401 for a missing
    or bad token, 503 when the database is out of reach, otherwise 400 (a document or
    its variables are wrong; no retry will help, so not 429 even for a query limit)."""
    for error in errors:
        code = (error.get("extensions") or {}).get("code")
        if code == "UNAUTHENTICATED":
            return 401
        if code == "UNAVAILABLE":
            return 503
    return 400
