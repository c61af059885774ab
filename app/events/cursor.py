"""Event cursors: opaque strings that encode an outbox `seq`.

Clients must treat them as opaque; the encoding is versioned so it can change. A string
that does not decode to exactly what `encode_cursor` would produce is INVALID_INPUT.
"""

from __future__ import annotations

import base64
import binascii
from typing import Final

from app.errors import InvalidInput

_PREFIX: Final = "ev1:"
_MAX_LENGTH: Final = 64


def encode_cursor(seq: int) -> str:
    raw = f"{_PREFIX}{seq}".encode("ascii")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(cursor: str, *, field: str = "after") -> int:
    """The seq in `cursor`, or INVALID_INPUT naming `field`."""
    invalid = InvalidInput("malformed event cursor; use a cursor the API returned", field=field)
    if not cursor or len(cursor) > _MAX_LENGTH:
        raise invalid
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise invalid from None
    digits = text.removeprefix(_PREFIX)
    if digits == text or not digits.isdigit():
        raise invalid
    seq = int(digits)
    if encode_cursor(seq) != cursor:  # one spelling per seq: no leading zeros, no padding
        raise invalid
    return seq
