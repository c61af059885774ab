"""SQLite's ordered JSON arrays (app/capacity/json_sql.py's JsonArray): json_group_array
over a subquery in the list's order where this SQLite keeps that order (checked once per
process), over a window of that order where the check fails. Both answer every compiled
surface as the plain path does (tests/test_read_differential.py's comparison; the default
suite runs it on the subquery form)."""

from __future__ import annotations

import logging

import pytest

from app.capacity import json_sql
from app.capacity.json_reads import compile_read
from app.rest.render import GET_SHAPE, LIST_SHAPE
from tests import test_read_differential as differential
from tests.generated_world import DEFAULT
from tests.support import Fleet


def _sql(shape: object) -> str:
    read = compile_read(shape, dialect="sqlite")  # type: ignore[arg-type]
    assert read is not None
    return read.sql


def test_this_sqlite_keeps_an_ordered_subquerys_order_and_the_arrays_use_it() -> None:
    assert json_sql.sqlite_keeps_subquery_order()
    for shape in (GET_SHAPE, LIST_SHAPE):
        sql = _sql(shape)
        assert " OVER " not in sql and "json_group_array" in sql


@pytest.mark.parametrize(
    "probe, expected",
    [
        (None, '["not", "what it answers"]'),  # another order
        ("SELECT json_group_array(", None),  # the check itself fails
    ],
    ids=["other-order", "broken-check"],
)
def test_a_failed_check_orders_by_windows_with_a_warning(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    probe: str | None,
    expected: str | None,
) -> None:
    if probe is not None:
        monkeypatch.setattr(json_sql, "_ORDER_PROBE", probe)
    if expected is not None:
        monkeypatch.setattr(json_sql, "_ORDER_EXPECTED", expected)
    json_sql.sqlite_keeps_subquery_order.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=json_sql.__name__):
            assert not json_sql.sqlite_keeps_subquery_order()
            assert " OVER (ORDER BY" in _sql(GET_SHAPE)
    finally:
        json_sql.sqlite_keeps_subquery_order.cache_clear()
    assert "order their arrays by a window" in caplog.text
    monkeypatch.undo()
    assert json_sql.sqlite_keeps_subquery_order()  # checked anew: this build keeps it


@pytest.mark.parametrize("dialect", ["sqlite"])
async def test_the_window_form_answers_as_the_plain_path(
    database_url: str, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(json_sql, "sqlite_keeps_subquery_order", lambda: False)
    assert " OVER (ORDER BY" in _sql(LIST_SHAPE)
    await differential.test_the_read_paths_answer_alike_over_generated_data(
        database_url, fleet, DEFAULT
    )
