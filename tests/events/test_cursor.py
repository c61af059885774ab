"""Event cursors: one spelling per position, today's `ev1:` for tx = 0, a bounded length."""

from __future__ import annotations

import base64

import pytest

from app.errors import InvalidInput
from app.events.cursor import (
    BIGINT_MAX,
    MAX_AHEAD,
    MAX_CURSOR_LENGTH,
    DeliveryState,
    Position,
    ResumePoint,
    advance,
    decode_cursor,
    decode_resume,
    encode_cursor,
    encode_resume,
    encode_state,
    encode_usage_cursor,
)


def _b64(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "position",
    [
        Position(0, 0),
        Position(0, 1),
        Position(0, BIGINT_MAX),
        Position(1, 0),
        Position(812_345, 77),
        Position(BIGINT_MAX, BIGINT_MAX),
    ],
)
def test_cursors_round_trip(position: Position) -> None:
    cursor = encode_cursor(position)
    assert decode_cursor(cursor) == position
    assert len(cursor) <= 58  # the longest: ev2:<19 digits>.<19 digits>, 43 bytes


def test_tx_zero_keeps_the_ev1_spelling_and_others_are_ev2() -> None:
    assert encode_cursor(Position(0, 42)) == _b64("ev1:42") == encode_cursor(42)
    assert encode_cursor(Position(9, 42)) == _b64("ev2:9.42")
    assert len(encode_cursor(Position(BIGINT_MAX, BIGINT_MAX))) == 58


@pytest.mark.parametrize(
    "raw",
    [
        "ev1:",
        "ev1:01",  # a leading zero
        "ev1:+1",
        "ev1:-1",
        "ev1: 1",
        "ev1:1_0",
        "ev1:\u0661",  # a non-ASCII digit
        "ev1:9223372036854775808",  # beyond a BIGINT
        "ev2:0.5",  # tx 0 is spelled ev1
        "ev2:5",
        "ev2:5.",
        "ev2:.5",
        "ev2:05.5",
        "ev2:5.05",
        "ev2:5.5.5",
        "ev2:9223372036854775808.1",
        "ev3:1.1",
        "1",
    ],
)
def test_every_other_spelling_is_refused(raw: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        decode_cursor(_b64(raw))
    assert refused.value.field == "after"


@pytest.mark.parametrize(
    "cursor",
    ["", "ZXYxOjQ=", "ZXYxOjQ==", "ZXYxOjQ*", "a" * 65, _b64("ev2:" + "1" * 30 + ".1")],
)
def test_malformed_strings_are_refused(cursor: str) -> None:
    with pytest.raises(InvalidInput):
        decode_cursor(cursor, field="after")


def test_a_usage_cursor_carries_a_position_and_a_usage_horizon() -> None:
    """`pool.usage` events' cursors (CONTRACT section 10): ev3:<tx>.<seq>.<usage>, one
    spelling, tx 0 included; the longest fits the bound the inputs allow."""
    point = ResumePoint(Position(0, 7), 12)
    cursor = encode_usage_cursor(point.position, point.usage or 0)
    assert cursor == _b64("ev3:0.7.12") == encode_resume(point)
    assert decode_resume(cursor) == point
    assert decode_cursor(cursor) == Position(0, 7)  # the outbox part
    assert decode_resume(encode_cursor(Position(3, 4))) == ResumePoint(Position(3, 4), None)
    longest = encode_usage_cursor(Position(BIGINT_MAX, BIGINT_MAX), BIGINT_MAX)
    assert len(longest) == 84 and decode_resume(longest).usage == BIGINT_MAX
    for raw in ("ev3:1.2", "ev3:1.2.3.4", "ev3:01.2.3", "ev3:1.2.", "ev3:1.2.9223372036854775808"):
        with pytest.raises(InvalidInput):
            decode_resume(_b64(raw))


def test_a_state_with_positions_above_l_is_spelled_ev4_once() -> None:
    """(L, D) with D not empty (ADR 0012, "Delivery above the horizon"): `ev4:` with L, the
    usage horizon if any, then each position of D as its difference from L (the seq's may
    be negative). D empty keeps ev1/ev2/ev3, so every older cursor means what it meant."""
    state = DeliveryState(Position(100, 50), (Position(100, 51), Position(103, 7)))
    assert encode_state(state) == _b64("ev4:100.50,0.1,3.-43")
    assert encode_state(state, 9) == _b64("ev4:100.50.9,0.1,3.-43")
    assert decode_resume(encode_state(state)) == ResumePoint(Position(100, 50), None, state.ahead)
    assert decode_resume(encode_state(state, 9)).state == state
    assert encode_state(DeliveryState(Position(0, 5))) == encode_cursor(Position(0, 5))
    assert encode_state(DeliveryState(Position(2, 5)), 3) == _b64("ev3:2.5.3")
    for raw in (
        "ev4:100.50",  # D empty is spelled ev2
        "ev4:100.50,0.0",  # D must be above L
        "ev4:100.50,3.-43,0.1",  # D ascending
        "ev4:100.50,0.1,0.1",  # once each
        "ev4:100.50,0.-0",
        "ev4:100.50,0.01",
        "ev4:100.50,-1.60",  # tx never below L's
        "ev4:100.50,0.+1",
        "ev4:100.50,0.1,",
        "ev4:100.50.1.2,0.1",
        "ev4:100.-50,0.1",
        "ev4:100.50,0.-51",  # a seq below 0
        "ev4:100.50,9223372036854775708.1",  # a tx beyond a BIGINT
        "ev4:100.50" + "".join(f",0.{i}" for i in range(1, MAX_AHEAD + 2)),  # D over its bound
    ):
        with pytest.raises(InvalidInput):
            decode_resume(_b64(raw))


def test_the_longest_cursor_is_the_bound_and_longer_is_refused_unread() -> None:
    settled = Position(10**18, BIGINT_MAX)
    ahead = tuple(Position(BIGINT_MAX - MAX_AHEAD + i, 0) for i in range(MAX_AHEAD))
    longest = encode_state(DeliveryState(settled, ahead), BIGINT_MAX)
    assert len(longest) == MAX_CURSOR_LENGTH == 1834
    assert decode_resume(longest).state == DeliveryState(settled, ahead)
    with pytest.raises(InvalidInput):
        decode_resume(longest + "A")


def test_advance_settles_below_the_horizon_and_bounds_what_is_above_it() -> None:
    """Below the horizon h an event settles L (nothing can appear at or below it); at or
    above it, it joins D while D has room; the first that does not fit stops the read."""
    start = DeliveryState(Position(10, 1))
    read = [Position(11, 2), Position(12, 3), Position(20, 4), Position(21, 5)]
    states, after = advance(start, read, horizon=15, complete=True)
    assert states == [
        DeliveryState(Position(11, 2)),
        DeliveryState(Position(12, 3)),
        DeliveryState(Position(12, 3), (Position(20, 4),)),
        DeliveryState(Position(12, 3), (Position(20, 4), Position(21, 5))),
    ]
    # The horizon passes 20 but not 21: L moves to 20 even with nothing new read.
    states, moved = advance(after, [], horizon=21, complete=True)
    assert states == [] and moved == DeliveryState(Position(20, 4), (Position(21, 5),))
    # D full: the first event above the horizon that does not fit stops the read there.
    full = DeliveryState(Position(1, 1), tuple(Position(100, i) for i in range(2, 2 + MAX_AHEAD)))
    states, same = advance(full, [Position(5, 90), Position(101, 1)], horizon=50, complete=True)
    assert states == [DeliveryState(Position(5, 90), full.ahead)] and same == states[-1]
    # A read cut by its limit, all below the horizon: L follows it, D keeps what is above.
    states, cut = advance(after, [Position(20, 9)], horizon=30, complete=False)
    assert cut == DeliveryState(Position(20, 9), (Position(21, 5),))
