"""Answers holding an integer past 64 bits (a sum of quota amounts, each up to 2^63 - 1:
the owner's `offered` over three guests) are encoded exactly, in the compact form orjson
gives every other answer (app/http/responses.py); the lending read over such sums is
tests/test_compiled_lending.py's."""

from __future__ import annotations

import json

import orjson
import pytest

from app.capacity.inputs import MAX_AMOUNT
from app.http.responses import WIDE_INTEGER, dumps

ORDINARY = {"pool": {"id": "p", "labels": {"é": "ü"}, "overcommit": 2.5, "quotas": [1, None]}}


def test_orjson_still_says_so() -> None:
    """The fallback keys on orjson's wording: a changed one would turn it off unseen."""
    with pytest.raises(TypeError) as refused:
        orjson.dumps({"offered": 3 * MAX_AMOUNT})
    assert str(refused.value) == WIDE_INTEGER


def test_an_ordinary_answer_is_orjsons() -> None:
    assert dumps(ORDINARY) == orjson.dumps(ORDINARY)


def test_an_integer_past_64_bits_is_exact_in_the_same_form() -> None:
    wide = ORDINARY | {"lending": [{"offered": 3 * MAX_AMOUNT, "overcommit": 1.5}]}
    encoded = dumps(wide)
    assert json.loads(encoded) == wide
    narrow = wide | {"lending": [{"offered": 1, "overcommit": 1.5}]}
    assert encoded == orjson.dumps(narrow).replace(
        b'"offered":1', f'"offered":{3 * MAX_AMOUNT}'.encode()
    )


def test_other_refusals_are_not_hidden() -> None:
    with pytest.raises(TypeError):
        dumps({"x": object()})
