"""Keyset paging for lists (CONTRACT section 9): opaque cursors over ids, `first` bounded.

A cursor names the last item a client has seen, so a page never skips or repeats rows
when items are added before it. Cursors are opaque to clients; only ids are encoded.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Generic, TypeVar

from app.capacity.inputs import POOL_ID_PATTERN, RESERVATION_ID_PATTERN
from app.errors import InvalidInput

MAX_PAGE_SIZE = 100
DEFAULT_PAGE_SIZE = 50
_CURSOR_PREFIX = "v1:"

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PageRequest:
    first: int
    after: str | None  # the decoded id of the last item seen


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: list[T]
    has_next: bool
    has_previous: bool


def encode_cursor(item_id: str) -> str:
    return base64.urlsafe_b64encode(f"{_CURSOR_PREFIX}{item_id}".encode()).decode()


def decode_cursor(cursor: str, id_pattern: str, *, field: str = "after") -> str:
    try:
        text = base64.urlsafe_b64decode(cursor.encode("ascii")).decode()
    except (binascii.Error, UnicodeError, ValueError):
        raise InvalidInput("not a cursor this API returned", field=field) from None
    item_id = text.removeprefix(_CURSOR_PREFIX)
    if not text.startswith(_CURSOR_PREFIX) or not re.fullmatch(id_pattern, item_id):
        raise InvalidInput("not a cursor this API returned", field=field)
    return item_id


def page_request(first: int | None, after: str | None, id_pattern: str) -> PageRequest:
    """Validate `first` (1..100, default 50) and decode `after`; both are INVALID_INPUT."""
    size = DEFAULT_PAGE_SIZE if first is None else first
    if not 0 <= size <= MAX_PAGE_SIZE:
        raise InvalidInput(f"first must be 0 to {MAX_PAGE_SIZE}", field="first")
    return PageRequest(size, None if after is None else decode_cursor(after, id_pattern))


def pools_page_request(first: int | None, after: str | None) -> PageRequest:
    return page_request(first, after, POOL_ID_PATTERN)


def reservations_page_request(first: int | None, after: str | None) -> PageRequest:
    return page_request(first, after, RESERVATION_ID_PATTERN)
