"""Event positions, delivery states, and the cursors that carry them: opaque strings.

An event's position is (tx, seq) (docs/decisions/0012-commit-ordered-positions.md). A
reader's **delivery state** is (L, D): every event at or below position L has been
delivered (or was not for it), and D holds the positions above L delivered too, at most
`MAX_AHEAD` of them (events committed above the transaction-id horizon, delivered at once;
ADR 0012, "Delivery above the horizon"). "After (L, D)" is every visible event above L and
not in D. Each event's cursor encodes the state just after it.

Spellings (base64url of the raw text, no padding), one per state:
- D empty, no usage horizon: a position with tx = 0 (every row on SQLite, every row
  written before migration 0009) is `ev1:<seq>`, so every cursor handed out before the
  upgrade still means the same; any other is `ev2:<tx>.<seq>`.
- D empty, with the usage horizon of a `pool.usage` event (CONTRACT section 10: state,
  not history; app/events/usage.py): `ev3:<tx>.<seq>.<usage>`, tx 0 included.
- D not empty: `ev4:<tx>.<seq>[.<usage>]` followed, for each position of D in ascending
  order, by `,<tx - L.tx>.<seq - L.seq>` (the seq difference may be negative, `-3`).
A string that does not decode to exactly what `encode_resume` would produce is
INVALID_INPUT: no leading zeros, no `-0`, no padding, no `ev2:` for tx = 0, nothing beyond
a BIGINT, D ascending, above L, at most MAX_AHEAD.

Length bound: every number is at most 19 digits (a BIGINT; a difference at most 19 digits
and a sign), so the longest raw cursor is `ev4:` + 19 + `.` + 19 + `.` + 19 (63) plus
MAX_AHEAD times (`,` + 19 + `.` + `-` + 19) = 63 + 32 x 41 = 1,375 characters, 1,834 in
base64url; anything longer than 1,834 is refused before it is decoded. (`ev1:` to `ev3:`
stay within 84.)
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Sequence
from typing import Final, NamedTuple

from app.errors import InvalidInput

_V1: Final = "ev1:"
_V2: Final = "ev2:"
_V3: Final = "ev3:"
_V4: Final = "ev4:"
BIGINT_MAX: Final = 2**63 - 1
# Positions above L a delivery state holds at most (ADR 0012): past it, events above the
# horizon wait for it, as before.
MAX_AHEAD: Final = 32
MAX_CURSOR_LENGTH: Final = 1834
_MAX_LENGTH: Final = MAX_CURSOR_LENGTH


class Position(NamedTuple):
    """Where an event sits in delivery order; tuples compare as positions do."""

    tx: int
    seq: int


START: Final = Position(0, 0)  # before every event


class DeliveryState(NamedTuple):
    """(L, D): every event at or below `settled` delivered, and those at `ahead` (above it,
    ascending, at most MAX_AHEAD). Once set, nothing new can appear at or below `settled`:
    it only moves to positions whose tx was below a horizon read in the same snapshot."""

    settled: Position
    ahead: tuple[Position, ...] = ()

    def covers(self, position: Position) -> bool:
        """Whether the event at `position` is delivered (or passed) in this state."""
        return position <= self.settled or position in self.ahead

    def within(self, other: DeliveryState) -> bool:
        """Whether everything this state covers, `other` covers too (as far as can be
        told from the two: a position between their L's counts as not covered)."""
        return self.settled <= other.settled and all(
            d <= other.settled or d in other.ahead for d in self.ahead
        )

    @property
    def newest(self) -> Position:
        """The largest position this state names."""
        return self.ahead[-1] if self.ahead else self.settled


def settle(state: DeliveryState, settled: Position) -> DeliveryState:
    """`state` with L moved up to `settled` (never down); D keeps what is above it."""
    if settled <= state.settled:
        return state
    return DeliveryState(settled, tuple(d for d in state.ahead if d > settled))


def advance(
    state: DeliveryState,
    read: Sequence[Position],
    horizon: int,
    *,
    complete: bool,
) -> tuple[list[DeliveryState], DeliveryState]:
    """What a reader delivers of `read` and its state after each, and after the read.

    `read`: positions of visible events not covered by `state`, ascending, read in one
    snapshot with its horizon; `complete`: every such event was read (no limit cut it).
    A position with tx below the horizon is settled: every event at or below it is visible
    in that snapshot and was covered or read before it (position order), and none can
    still appear (ADR 0012). One at or above it goes into D if D has room; the first that
    does not fit stops the read there (a pool's later events sit above it, so they wait
    too). Returns the states after each delivered event (as many as delivered, a prefix
    of `read`), and the state to continue from."""
    states: list[DeliveryState] = []
    below = [p for p in read if p.tx < horizon]
    for p in below:
        state = settle(state, p)
        states.append(state)
    if complete or len(below) < len(read):
        # Every event with tx below the horizon is covered now (they come first in position
        # order): L passes the positions of D the horizon has passed too.
        passed = [d for d in state.ahead if d.tx < horizon]
        if passed:
            state = settle(state, passed[-1])
            if states:
                states[-1] = state  # the same events covered, spelled shorter
    for p in read[len(below) :]:
        if len(state.ahead) >= MAX_AHEAD:
            break
        state = DeliveryState(state.settled, tuple(sorted((*state.ahead, p))))
        states.append(state)
    return states, state


def covered_between(
    state: DeliveryState, target: DeliveryState, delivered: Position
) -> DeliveryState:
    """A replay's state once it has delivered `delivered`, reading target \\ state in
    position order (`state.within(target)`): every event of the target at or below it is
    covered now."""
    if delivered <= target.settled:
        return settle(state, delivered)
    settled = max(state.settled, target.settled)
    ahead = tuple(d for d in target.ahead if d > settled and (d <= delivered or d in state.ahead))
    return DeliveryState(settled, ahead)


class ResumePoint(NamedTuple):
    """What a cursor says to resume after: the delivery state (L = `position`, D =
    `ahead`), and for a `pool.usage` event's cursor the usage horizon (None: the cursor
    says nothing of usage)."""

    position: Position
    usage: int | None = None
    ahead: tuple[Position, ...] = ()

    @property
    def state(self) -> DeliveryState:
        return DeliveryState(self.position, self.ahead)


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


def encode_state(state: DeliveryState, usage: int | None = None) -> str:
    return encode_resume(ResumePoint(state.settled, usage, state.ahead))


def encode_resume(point: ResumePoint) -> str:
    if point.ahead:
        at = point.position
        head = f"{_V4}{at.tx}.{at.seq}" + ("" if point.usage is None else f".{point.usage}")
        return _b64(head + "".join(f",{d.tx - at.tx}.{d.seq - at.seq}" for d in point.ahead))
    if point.usage is None:
        return encode_cursor(point.position)
    return encode_usage_cursor(point.position, point.usage)


def decode_cursor(cursor: str, *, field: str = "after") -> Position:
    """The outbox position (L) in `cursor`, or INVALID_INPUT naming `field`."""
    return decode_resume(cursor, field=field).position


def _numbers(parts: Iterable[str], signed: frozenset[int] = frozenset()) -> list[int] | None:
    # isdecimal and isascii: no spaces, no underscores, no non-ASCII digits; a sign only
    # where one is allowed (one spelling: the round trip refuses `-0` and leading zeros).
    numbers = []
    for i, part in enumerate(parts):
        digits = part[1:] if i in signed and part.startswith("-") else part
        if not (digits.isascii() and digits.isdecimal()):
            return None
        numbers.append(int(part))
    return numbers


def decode_resume(cursor: str, *, field: str = "after") -> ResumePoint:
    """What `cursor` says to resume after, or INVALID_INPUT naming `field`."""
    invalid = InvalidInput("malformed event cursor; use a cursor the API returned", field=field)
    if not cursor or len(cursor) > _MAX_LENGTH:  # bounded before anything is decoded
        raise invalid
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise invalid from None
    point = _parse(text)
    if point is None or encode_resume(point) != cursor:  # one spelling per state
        raise invalid
    return point


def _parse(text: str) -> ResumePoint | None:
    ahead: list[Position] = []
    if text.startswith(_V1):
        numbers = _numbers([text.removeprefix(_V1)])
        if numbers is None:
            return None
        head = [0, *numbers]
    elif text.startswith((_V2, _V3)):
        parts = text[len(_V2) :].split(".")
        head = _numbers(parts) or []
        if len(head) != (2 if text.startswith(_V2) else 3):
            return None
    elif text.startswith(_V4):
        groups = text.removeprefix(_V4).split(",")
        head = _numbers(groups[0].split(".")) or []
        if len(head) not in (2, 3) or not 1 <= len(groups) - 1 <= MAX_AHEAD:
            return None
        for group in groups[1:]:
            delta = _numbers(group.split("."), signed=frozenset({1}))
            if delta is None or len(delta) != 2:
                return None
            ahead.append(Position(head[0] + delta[0], head[1] + delta[1]))
    else:
        return None
    if any(not 0 <= n <= BIGINT_MAX for n in (*head, *(n for p in ahead for n in p))):
        return None
    settled = Position(head[0], head[1])
    if any(d <= prev for prev, d in zip([settled, *ahead], ahead, strict=False)):
        return None  # D ascending, above L
    return ResumePoint(settled, head[2] if len(head) == 3 else None, tuple(ahead))
