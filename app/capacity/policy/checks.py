"""Shared checks for policy validators: JSON type tests and error field paths.

Every check builds a fresh value rather than returning the input object, so the
normalized policy never aliases the caller's data.
"""

from __future__ import annotations

import json
import re
from typing import Any

from app.errors import InvalidInput

# Object keys that read unambiguously after a dot; anything else is bracketed.
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")
# Echoed input is cut short so one huge value can't bloat an error response.
_ECHO_MAX = 64


def child(field: str, key: str) -> str:
    """`policy.hugepages` + `2Mi` -> `policy.hugepages.2Mi`; odd keys get `["..."]`."""
    if _PLAIN_KEY.fullmatch(key):
        return f"{field}.{key}"
    return f"{field}[{json.dumps(key)}]"


def item(field: str, index: int) -> str:
    return f"{field}[{index}]"


def json_type(value: object) -> str:
    """The JSON name of a value's type, for messages ("boolean", not "bool")."""
    if value is None:
        return "null"
    if isinstance(value, bool):  # before int: bool is an int subclass
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def echo(value: str) -> str:
    """A quoted, length-capped copy of user input for an error message."""
    if len(value) > _ECHO_MAX:
        value = value[:_ECHO_MAX] + "..."
    return json.dumps(value)


def expect_bool(value: object, field: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(f"{field} must be a boolean, got {json_type(value)}", field=field)
    return value


def expect_int(value: object, field: str, *, minimum: int, maximum: int) -> int:
    # bool is an int subclass; a JSON `true` must not pass as 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(
            f"{field} must be an integer from {minimum} to {maximum}, got {json_type(value)}",
            field=field,
        )
    if not minimum <= value <= maximum:
        raise InvalidInput(
            f"{field} must be from {minimum} to {maximum}, got {value}",
            field=field,
        )
    return int(value)


def expect_str(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"{field} must be a string, got {json_type(value)}", field=field)
    return value


def expect_object(value: object, field: str) -> dict[str, Any]:
    """A JSON object: a dict whose keys are all strings. Returns a shallow copy."""
    if not isinstance(value, dict):
        raise InvalidInput(f"{field} must be an object, got {json_type(value)}", field=field)
    for key in value:
        if not isinstance(key, str):
            raise InvalidInput(f"{field} must be an object with string keys", field=field)
    return dict(value)


def expect_list(value: object, field: str, *, max_items: int | None = None) -> list[Any]:
    """A JSON array, optionally capped in length. Returns a shallow copy."""
    if not isinstance(value, list):
        raise InvalidInput(f"{field} must be an array, got {json_type(value)}", field=field)
    if max_items is not None and len(value) > max_items:
        raise InvalidInput(
            f"{field} may hold at most {max_items} items, got {len(value)}", field=field
        )
    return list(value)


def reject_unknown_keys(obj: dict[str, Any], allowed: tuple[str, ...], field: str) -> None:
    """Unknown keys are refused rather than dropped, so typos don't pass silently."""
    for key in obj:
        if key not in allowed:
            raise InvalidInput(
                f"{child(field, key)} is not a known key; allowed: {', '.join(allowed)}",
                field=child(field, key),
            )


def expect_unique(values: list[str], field: str) -> None:
    """Names the second occurrence, which is the one to delete."""
    seen: dict[str, int] = {}
    for index, value in enumerate(values):
        if value in seen:
            raise InvalidInput(
                f"{item(field, index)} repeats {item(field, seen[value])}: {echo(value)}",
                field=item(field, index),
            )
        seen[value] = index
