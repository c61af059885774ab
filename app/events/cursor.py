"""Event positions and the cursors that carry them: opaque strings.

An event's position is (tx, seq) (docs/decisions/0012-commit-ordered-positions.md):
delivery order is position order. A position with tx = 0 (every row on SQLite, every row
written before migration 0009) keeps today's spelling, base64url of `ev1:<seq>`, so every
cursor handed out before the upgrade still means the same event; any other position is
spelled `ev2:<tx>.<seq>`. Clients must treat cursors as opaque. A string that does not
decode to exactly what `encode_cursor` would produce is INVALID_INPUT: one spelling per
position (no leading zeros, no padding, no `ev2:` for tx = 0, nothing beyond a BIGINT).

Length bound: both numbers are BIGINTs (at most 19 digits), so the longest raw cursor is
`ev2:` + 19 + `.` + 19 = 43 characters, 58 in base64url without padding; anything longer
than 64 is refused before it is decoded.
"""

from __future__ import annotations

import base64
import binascii
from typing import Final, NamedTuple

from app.errors import InvalidInput

_V1: Final = "ev1:"
_V2: Final = "ev2:"
_MAX_LENGTH: Final = 64
BIGINT_MAX: Final = 2**63 - 1


class Position(NamedTuple):
    """Where an event sits in delivery order; tuples compare as positions do."""

    tx: int
    seq: int


START: Final = Position(0, 0)  # before every event


def as_position(value: Position | int) -> Position:
    """An int is the seq of an `ev1:` cursor: the position (0, seq)."""
    return value if isinstance(value, Position) else Position(0, value)


def encode_cursor(position: Position | int) -> str:
    tx, seq = as_position(position)
    raw = f"{_V1}{seq}" if tx == 0 else f"{_V2}{tx}.{seq}"
    return base64.urlsafe_b64encode(raw.encode("ascii")).decode("ascii").rstrip("=")


def decode_cursor(cursor: str, *, field: str = "after") -> Position:
    """The position in `cursor`, or INVALID_INPUT naming `field`."""
    invalid = InvalidInput("malformed event cursor; use a cursor the API returned", field=field)
    if not cursor or len(cursor) > _MAX_LENGTH:
        raise invalid
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise invalid from None
    if text.startswith(_V1):
        parts = [text.removeprefix(_V1)]
    elif text.startswith(_V2):
        parts = text.removeprefix(_V2).split(".")
        if len(parts) != 2:
            raise invalid
    else:
        raise invalid
    # isdecimal and isascii: no signs, no spaces, no underscores, no non-ASCII digits.
    if not all(p.isascii() and p.isdecimal() for p in parts):
        raise invalid
    numbers = [int(p) for p in parts]
    if any(n > BIGINT_MAX for n in numbers):
        raise invalid
    position = Position(0, numbers[0]) if len(numbers) == 1 else Position(*numbers)
    if encode_cursor(position) != cursor:  # one spelling per position
        raise invalid
    return position
