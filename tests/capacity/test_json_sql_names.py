"""A statement with JSON arrays compiles to one text, every time: the clauses a
JsonArray's form builds while compiling draw their anonymous names (`json_agg_1`,
`anon_2`) from their id(), so one freed mid-compile would lend its name to the next
(CI saw `test_the_event_pool_is_query_pools_statement[sqlite-nested]` fail so: the
same statement, `json_group_array_1` in one text and `_2` in the other)."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import Select, column, select, table

from app.capacity import json_sql
from app.capacity.json_sql import JsonArray, compile_statement, json_object, rows_from

COMPILES = 200  # without the fix, PostgreSQL's form gave two texts within 200


def _siblings() -> Select[tuple[object, object]]:
    """Two arrays side by side: the first's built clauses are done with before the
    second's are built."""
    a = table("a", column("id"), column("k"))
    b = table("b", column("id"), column("k"))
    first = JsonArray(json_object([("k", a.c.k)]), rows_from(a), (a.c.id,))
    second = JsonArray(json_object([("k", b.c.k)]), rows_from(b), (b.c.id,))
    return select(first.label("first"), second.label("second"))


def _texts(dialect: str) -> set[str]:
    return {compile_statement(_siblings(), dialect).sql for _ in range(COMPILES)}


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_sibling_arrays_compile_to_one_text_with_names_of_their_own(dialect: str) -> None:
    (text,) = _texts(dialect)
    aggregate = "json_agg" if dialect == "postgresql" else "json_group_array"
    names = re.findall(rf"AS ({aggregate}_\d+)", text)
    assert len(names) == 2 and len(set(names)) == 2, text


def test_the_window_form_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_sql, "sqlite_keeps_subquery_order", lambda: False)
    (text,) = _texts("sqlite")
    assert text.count(" OVER (ORDER BY") == 2
    names = re.findall(r"AS (anon_\d+)", text)
    assert len(names) == len(set(names)) == 2, text
