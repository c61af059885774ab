"""The compiled statements on SQLite (app/capacity/json_sql.py, json_reads.py).

- Ordered JSON arrays (JsonArray): json_group_array over a subquery in the list's order
  where this SQLite keeps that order (checked once per process), over a window of that
  order where the check fails. Both answer every compiled surface as the plain path does
  (tests/test_read_differential.py's comparison; the default suite runs it on the
  subquery form).
- Cursors encoded in the statement (JsonCursor), and an answer with nothing to finish
  sent as the statement wrote it (json_reads.answer); one whose strings SQLite escaped
  goes through orjson. Both give the plain path's bytes.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client import REGISTRY

from app.capacity import json_reads, json_sql
from app.capacity.json_reads import compile_read
from app.rest.render import GET_SHAPE, LIST_SHAPE
from tests import test_read_differential as differential
from tests.compiled_world import Pair, World, pair, world
from tests.generated_world import BITE
from tests.support import Fleet

__all__ = ["pair", "world"]  # fixtures


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


@pytest.mark.slow
@pytest.mark.parametrize("dialect", ["sqlite"])
async def test_the_window_form_answers_as_the_plain_path(
    database_url: str, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The small world holds every case (generated_world.BITE); the window form is this
    # SQLite build's fallback, so the larger worlds run on the form it uses (the
    # differential test itself, default and soak).
    monkeypatch.setattr(json_sql, "sqlite_keeps_subquery_order", lambda: False)
    assert " OVER (ORDER BY" in _sql(LIST_SHAPE)
    await differential.test_the_read_paths_answer_alike_over_generated_data(
        database_url, fleet, BITE
    )


_PAGE = """query Page($t: String!, $after: String) {
  pools(tenantId: $t, first: 2, after: $after) {
    pageInfo { hasNextPage startCursor endCursor }
    edges { cursor node { id displayName version quotas { resource max used } } }
  }
}"""


async def _page(client: httpx.AsyncClient, token: str, after: str | None) -> tuple[Any, ...]:
    response = await client.post(
        "/graphql",
        json={"query": _PAGE, "variables": {"t": "acme", "after": after}},
        headers={"authorization": f"Bearer {token}"},
    )
    headers = {k: v for k, v in response.headers.items() if k != "x-request-id"}
    return response.status_code, headers, response.content


@pytest.mark.fast_path
@pytest.mark.parametrize("dialect", ["sqlite"])
@pytest.mark.parametrize(
    "name, verbatim",
    [
        ("Training H100s \u00e9 \u2603", True),
        ('quote " backslash \\ newline \n tab \t bell \x07 del \x7f \u2028', False),
    ],
    ids=["as-written", "escaped"],
)
async def test_a_page_gives_the_plain_bytes_as_written_or_through_orjson(
    pair: Pair, world: World, monkeypatch: pytest.MonkeyPatch, name: str, verbatim: bool
) -> None:
    token = world.tokens["acme-admin"]
    body = {"tenantId": "acme", "poolId": world.pools["p0"], "displayName": name}
    labelled = await pair.plain.post(
        "/api/compute/pools/label", json=body, headers={"authorization": f"Bearer {token}"}
    )
    assert labelled.status_code == 200, labelled.text
    parsed: list[str] = []
    readable = json_reads.readable

    def counted(data: Any, read: json_reads.CompiledRead, first: int | None = None) -> Any:
        parsed.append(read.shape.key)
        return readable(data, read, first)

    monkeypatch.setattr(json_reads, "readable", counted)
    before = _answered()
    after = None
    for _ in range(3):  # every page, following endCursor (the statement encodes it)
        plain = await _page(pair.plain, token, after)
        assert plain[0] == 200 and b"errors" not in plain[2], plain
        for _ in range(2):  # the first teaches the query text
            assert await _page(pair.fast, token, after) == plain
        page = orjson.loads(plain[2])["data"]["pools"]
        if not page["pageInfo"]["hasNextPage"]:
            break
        after = page["pageInfo"]["endCursor"]
    assert after is not None  # more than one page
    assert _answered() - before >= 2  # the compiled path answered each page
    # The page holding p0 went through orjson only when SQLite escaped its name; every
    # other page was sent as written.
    assert (parsed == []) is verbatim, parsed


def _answered() -> float:
    found = REGISTRY.get_sample_value("bettercompute_compiled_reads_total", {"outcome": "answered"})
    return found or 0.0
