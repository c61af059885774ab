"""Event positions and the cursors that carry them: opaque strings.

An event's position is (tx, seq) (docs/decisions/0012-commit-ordered-positions.md):
delivery order is position order. A position with tx = 0 (every row on SQLite, every row
written before migration 0009) keeps today's spelling, base64url of `ev1:<seq>`, so every
cursor handed out before the upgrade still means the same event; any other position is
spelled `ev2:<tx>.<seq>`. Clients must treat cursors as opaque. A string that does not
decode to exactly what `encode_cursor` would produce is INVALID_INPUT: one spelling per
position (no leading zeros, no padding, no `ev2:` for tx = 0, nothing beyond a BIGINT).

A `pool.usage` event's cursor (CONTRACT section 10: state, not history) carries two
things, `ev3:<tx>.<seq>.<usage>`: the position of the last outbox event its subscription
had delivered, and the usage horizon through which the subscriber holds every pool's
usage (app/events/usage.py). Resuming after it replays the outbox after the position, and
sends the latest usage of each pool stamped at or above the horizon. `ev3:` is always
spelled with its three numbers, tx 0 included.

Length bound: every number is a BIGINT (at most 19 digits), so the longest raw cursor is
`ev3:` + 19 + `.` + 19 + `.` + 19 = 63 characters, 84 in base64url without padding;
anything longer than 84 is refused before it is decoded.
"""

from __future__ import annotations

import base64
import binascii
from typing import Final, NamedTuple

from app.errors import InvalidInput

_V1: Final = "ev1:"
_V2: Final = "ev2:"
_V3: Final = "ev3:"
MAX_CURSOR_LENGTH: Final = 84
_MAX_LENGTH: Final = MAX_CURSOR_LENGTH
BIGINT_MAX: Final = 2**63 - 1


class Position(NamedTuple):
    """Where an event sits in delivery order; tuples compare as positions do."""

    tx: int
    seq: int


START: Final = Position(0, 0)  # before every event


class ResumePoint(NamedTuple):
    """What a cursor says to resume after: the outbox position, and for a `pool.usage`
    event's cursor the usage horizon (None: the cursor says nothing of usage)."""

    position: Position
    usage: int | None = None


def as_position(value: Position | int) -> Position:
    """An int is the seq of an `ev1:` cursor: the position (0, seq)."""
    return value if isinstance(value, Position) else Position(0, value)


def _b64(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode("ascii")).decode("ascii").rstrip("=")


def encode_cursor(position: Position | int) -> str:
    tx, seq = as_position(position)
    return _b64(f"{_V1}{seq}" if tx == 0 else f"{_V2}{tx}.{seq}")


def encode_usage_cursor(position: Position, usage: int) -> str:
    """A `pool.usage` event's cursor: the outbox position and the usage horizon."""
    return _b64(f"{_V3}{position.tx}.{position.seq}.{usage}")


def encode_resume(point: ResumePoint) -> str:
    if point.usage is None:
        return encode_cursor(point.position)
    return encode_usage_cursor(point.position, point.usage)


def decode_cursor(cursor: str, *, field: str = "after") -> Position:
    """The outbox position in `cursor`, or INVALID_INPUT naming `field`."""
    return decode_resume(cursor, field=field).position


def decode_resume(cursor: str, *, field: str = "after") -> ResumePoint:
    """What `cursor` says to resume after, or INVALID_INPUT naming `field`."""
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
    elif text.startswith(_V3):
        parts = text.removeprefix(_V3).split(".")
        if len(parts) != 3:
            raise invalid
    else:
        raise invalid
    # isdecimal and isascii: no signs, no spaces, no underscores, no non-ASCII digits.
    if not all(p.isascii() and p.isdecimal() for p in parts):
        raise invalid
    numbers = [int(p) for p in parts]
    if any(n > BIGINT_MAX for n in numbers):
        raise invalid
    if len(numbers) == 1:
        point = ResumePoint(Position(0, numbers[0]))
    elif len(numbers) == 2:
        point = ResumePoint(Position(*numbers))
    else:
        point = ResumePoint(Position(numbers[0], numbers[1]), numbers[2])
    if encode_resume(point) != cursor:  # one spelling per position
        raise invalid
    return point
