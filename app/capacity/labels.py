"""Pool labels: Kubernetes' key and value syntax, and the label selector (CONTRACT
section 10 "Names and labels").

A label key is an optional DNS-subdomain prefix (at most 253 characters, lowercase) and
`/`, then a name of at most 63 characters; a value is at most 63 characters, empty or of
the name's syntax. A selector is Kubernetes' equality- and set-based syntax, requirements
joined by commas (all must hold):

    a=b   a==b   a!=b   a in (x,y)   a notin (x)   a   !a

As in Kubernetes, `!=` and `notin` also hold for a pool without the label. The parser is
one pass over the text, bounded (MAX_SELECTOR_LENGTH characters, MAX_REQUIREMENTS
requirements, MAX_SET_VALUES values in a set); anything else is INVALID_INPUT on
`labelSelector`. `selector_clause` compiles the parsed requirements to one SQLAlchemy
condition over the pools' `labels` JSON column, which renders on both dialects
(PostgreSQL `->>`, SQLite `JSON_EXTRACT`): the one definition of what a selector selects.

A leaf of the domain: it imports SQLAlchemy and the errors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final, Literal

from sqlalchemy import and_, or_, true
from sqlalchemy.sql.elements import ColumnElement

from app.errors import InvalidInput

MAX_LABELS: Final = 32
MAX_DISPLAY_NAME: Final = 128
MAX_SELECTOR_LENGTH: Final = 4096
MAX_REQUIREMENTS: Final = 32
MAX_SET_VALUES: Final = 32

_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
# The JSON schema's patterns (OpenAPI); the prefix's total length is checked in code.
LABEL_KEY_PATTERN: Final = rf"^(?:{_DNS_LABEL}(?:\.{_DNS_LABEL})*/)?{_NAME}$"
LABEL_VALUE_PATTERN: Final = rf"^(?:{_NAME})?$"
MAX_KEY_LENGTH: Final = 253 + 1 + 63
_KEY = re.compile(LABEL_KEY_PATTERN)
_VALUE = re.compile(LABEL_VALUE_PATTERN)


def label_key_problem(key: str) -> str | None:
    """Why `key` is not a label key, or None."""
    if len(key) > MAX_KEY_LENGTH or _KEY.fullmatch(key) is None:
        return (
            "a label key is [prefix/]name: name at most 63 characters, alphanumeric at both "
            "ends with -, _ or . between; prefix a lowercase DNS subdomain"
        )
    prefix, _, _name = key.rpartition("/")
    if len(prefix) > 253:
        return "a label key's prefix is at most 253 characters"
    return None


def label_value_problem(value: str) -> str | None:
    """Why `value` is not a label value, or None."""
    if len(value) > 63 or _VALUE.fullmatch(value) is None:
        return (
            "a label value is empty or at most 63 characters, alphanumeric at both ends "
            "with -, _ or . between"
        )
    return None


def check_label_key(key: str) -> str:
    """A pydantic after-validator: the prefix's length, which the pattern cannot say."""
    problem = label_key_problem(key)
    if problem is not None:
        raise ValueError(problem)
    return key


# --- the selector ------------------------------------------------------------------------

Operator = Literal["=", "!=", "in", "notin", "exists", "!"]


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: Operator
    values: tuple[str, ...] = ()


_SPACE = " \t\n\r"
_BARE = frozenset(_SPACE + "=!(),")


class _Reader:
    """One pass over the selector's text."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0

    def skip(self) -> None:
        while self.at < len(self.text) and self.text[self.at] in _SPACE:
            self.at += 1

    def done(self) -> bool:
        self.skip()
        return self.at >= len(self.text)

    def peek(self, token: str) -> bool:
        self.skip()
        return self.text.startswith(token, self.at)

    def take(self, token: str) -> bool:
        if self.peek(token):
            self.at += len(token)
            return True
        return False

    def word(self) -> str:
        """A run of characters that are neither space nor an operator ("" when none)."""
        self.skip()
        start = self.at
        while self.at < len(self.text) and self.text[self.at] not in _BARE:
            self.at += 1
        return self.text[start : self.at]

    def keyword(self, word: str) -> bool:
        """`word` (in, notin) followed by a space or `(`."""
        self.skip()
        end = self.at + len(word)
        if self.text.startswith(word, self.at) and (
            end < len(self.text) and self.text[end] in _SPACE + "("
        ):
            self.at = end
            return True
        return False


def _malformed(why: str) -> InvalidInput:
    return InvalidInput(f"labelSelector: {why}", field="labelSelector")


def _key(reader: _Reader) -> str:
    key = reader.word()
    if not key:
        raise _malformed(f"a label key expected at character {reader.at + 1}")
    problem = label_key_problem(key)
    if problem is not None:
        raise _malformed(f"{key!r}: {problem}")
    return key


def _value(reader: _Reader) -> str:
    value = reader.word()
    problem = label_value_problem(value)
    if problem is not None:
        raise _malformed(f"{value!r}: {problem}")
    return value


def _set(reader: _Reader) -> tuple[str, ...]:
    if not reader.take("("):
        raise _malformed(f"'(' expected at character {reader.at + 1}")
    values: list[str] = []
    while True:
        values.append(_value(reader))
        if len(values) > MAX_SET_VALUES:
            raise _malformed(f"at most {MAX_SET_VALUES} values in a set")
        if reader.take(")"):
            return tuple(values)
        if not reader.take(","):
            raise _malformed(f"',' or ')' expected at character {reader.at + 1}")


def _requirement(reader: _Reader) -> Requirement:
    if reader.take("!"):
        return Requirement(_key(reader), "!")
    key = _key(reader)
    if reader.take("=="):
        return Requirement(key, "=", (_value(reader),))
    if reader.take("!="):
        return Requirement(key, "!=", (_value(reader),))
    if reader.take("="):
        return Requirement(key, "=", (_value(reader),))
    if reader.keyword("notin"):
        return Requirement(key, "notin", _set(reader))
    if reader.keyword("in"):
        return Requirement(key, "in", _set(reader))
    return Requirement(key, "exists")


def parse_selector(text: str) -> tuple[Requirement, ...]:
    """The requirements of a selector; "" (or only spaces) selects every pool."""
    if len(text) > MAX_SELECTOR_LENGTH:
        raise _malformed(f"at most {MAX_SELECTOR_LENGTH} characters")
    reader = _Reader(text)
    found: list[Requirement] = []
    if reader.done():
        return ()
    while True:
        found.append(_requirement(reader))
        if len(found) > MAX_REQUIREMENTS:
            raise _malformed(f"at most {MAX_REQUIREMENTS} requirements")
        if reader.done():
            return tuple(found)
        if not reader.take(","):
            raise _malformed(f"',' expected at character {reader.at + 1}")


def selector_clause(
    requirements: tuple[Requirement, ...], labels: ColumnElement[Any]
) -> ColumnElement[bool]:
    """The condition a pool's `labels` meets when it matches every requirement. A label's
    value is a string, never JSON null, so a missing key reads as SQL NULL."""
    conditions: list[ColumnElement[bool]] = []
    for r in requirements:
        value: ColumnElement[Any] = labels[r.key].as_string()
        if r.operator == "exists":
            conditions.append(value.is_not(None))
        elif r.operator == "!":
            conditions.append(value.is_(None))
        elif r.operator == "=":
            conditions.append(value == r.values[0])
        elif r.operator == "!=":
            conditions.append(or_(value.is_(None), value != r.values[0]))
        elif r.operator == "in":
            conditions.append(value.in_(r.values))
        else:
            conditions.append(or_(value.is_(None), value.not_in(r.values)))
    return and_(true(), *conditions)
