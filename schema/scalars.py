"""Scalars: `Long` for quota and capacity amounts, `DateTime` as REST prints it, `JSON`."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NewType

import strawberry
from graphql import IntValueNode, ValueNode
from strawberry.scalars import JSON
from strawberry.types.scalar import ScalarDefinition

from app.capacity.fields import timestamp
from app.capacity.inputs import MAX_AMOUNT

_MIN_LONG = -(2**63)


def _long_value(value: Any) -> int:
    # bool is an int in Python, but never an amount.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"Long cannot represent a non-integer value: {value!r}")
    if not _MIN_LONG <= value <= MAX_AMOUNT:
        raise ValueError(f"Long cannot represent a value outside 64 bits: {value}")
    return value


def _long_literal(node: ValueNode, _variables: dict[str, Any] | None = None) -> int:
    if not isinstance(node, IntValueNode):
        raise ValueError("Long cannot represent a non-integer value")
    return _long_value(int(node.value))


Long = NewType("Long", int)

LONG = strawberry.scalar(
    name="Long",
    description=(
        "A signed 64-bit integer (quota and capacity amounts can exceed GraphQL's 32-bit "
        "Int). Sent as a JSON number, as REST sends it; JavaScript clients lose precision "
        "above 2^53."
    ),
    # IBM's Long: a 64-bit signed integer as a JSON number (our upper bound is MAX_AMOUNT).
    specified_by_url="https://ibm.github.io/graphql-specs/custom-scalars/long.html",
    serialize=_long_value,
    parse_value=_long_value,
    parse_literal=_long_literal,
)


def _timestamp(value: datetime) -> str:
    # The one form of every surface (app/capacity/fields.py): UTC with a trailing Z.
    shown = timestamp(value)
    assert shown is not None
    return shown


DATETIME = strawberry.scalar(
    name="DateTime",
    description=(
        "A point in time: an RFC 3339 date-time in UTC with a trailing Z "
        "(`2026-05-01T12:00:00.123456Z`), as REST prints it."
    ),
    specified_by_url="https://scalars.graphql.org/andimarek/date-time",
    serialize=_timestamp,
    parse_value=datetime.fromisoformat,
)

# For StrawberryConfig.scalar_map: fields annotated `Long` or `datetime` use these.
SCALAR_MAP: dict[object, ScalarDefinition] = {Long: LONG, datetime: DATETIME}

__all__ = ["JSON", "SCALAR_MAP", "Long"]
