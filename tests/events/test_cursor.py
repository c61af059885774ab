"""Event cursors: one spelling per position, today's `ev1:` for tx = 0, a bounded length."""

from __future__ import annotations

import base64

import pytest

from app.errors import InvalidInput
from app.events.cursor import (
    BIGINT_MAX,
    MAX_CURSOR_LENGTH,
    Position,
    ResumePoint,
    decode_cursor,
    decode_resume,
    encode_cursor,
    encode_resume,
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
    assert len(longest) == MAX_CURSOR_LENGTH and decode_resume(longest).usage == BIGINT_MAX
    for raw in ("ev3:1.2", "ev3:1.2.3.4", "ev3:01.2.3", "ev3:1.2.", "ev3:1.2.9223372036854775808"):
        with pytest.raises(InvalidInput):
            decode_resume(_b64(raw))
