"""The dialect seam of the compiled JSON reads: the few pieces PostgreSQL and SQLite write
differently, each one SQLAlchemy construct compiled per dialect (as Prefect keeps
`build_json_object` and `json_arr_agg`), so one Core statement (app/capacity/json_reads.py)
builds the same JSON on both.

- `JsonObject`: PostgreSQL `json_build_object`, SQLite `json_object`.
- `JsonArray`: the rows of a selection as an array in an order, `[]` with none:
  PostgreSQL `json_agg(... ORDER BY ...)`; SQLite (before 3.44 it has no ORDER BY in an
  aggregate) `json_group_array` over a FROM-clause subquery in that order, which SQLite
  keeps for an aggregate (`sqlite_keeps_subquery_order`, checked once per process), or,
  where that check fails, over a window of that order (twice the statement's time on a
  dashboard page: the window sorts, and each nested array is parsed again by `json()`).
- `JsonNested`: a JSON value that did not come straight from a JSON function (a
  subquery's, a CASE's, a JSON column's): SQLite would embed it as a string without
  `json(...)`.
- `JsonBool`: SQLite has no boolean, and would show 0 and 1.
- `JsonIsEmptyObject`: a JSON column holding `{}`.
- `JsonEntries`: a JSON object column as an array of objects, one per key, in the stored
  object's order (a reservation's `resources` as GraphQL's ResourceAmount list):
  PostgreSQL `jsonb_each ... WITH ORDINALITY`, SQLite `json_each` in its `id` order.
- `JsonCursor`: a row's cursor (paging.encode_cursor of its id). PostgreSQL selects the
  id, encoded once the answer is parsed (json_reads.readable); SQLite encodes it in the
  statement, with the same function defined on its connections (`bc_cursor`,
  app/db/embedded.py's SQL_FUNCTIONS), so an answer with nothing else to finish is sent
  as the statement wrote it (json_reads.answer).
- `ExactQuotient`: the double nearest a quotient of integers wider than a double holds
  (Python's `int / int`): PostgreSQL divides in numeric; SQLite calls Python
  (`bc_quotient`, defined on its connections as `bc_cursor` is).
- `ExactSum`: an exact sum of BIGINTs over a group, whole or in halves: PostgreSQL's
  sum() of BIGINT is exact (numeric); SQLite's raises past 64 bits, so it sums halves.
- `compile_statement`: a statement's text for a dialect, with the names of its
  positional parameters (asyncpg's `$n`, sqlite3's `?`).

Timestamps are `fields.IsoTimestamp`, compiled per dialect beside the table of fields.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sqlite3
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
    Float,
    FromClause,
    Join,
    Select,
    func,
    literal_column,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.sql.util import ClauseAdapter
from sqlalchemy.sql.visitors import InternalTraversal, iterate

from app.capacity.paging import encode_cursor
from app.db.dialect_sql import per_dialect
from app.db.embedded import define_sql_function

log = logging.getLogger(__name__)

# The dialects the statements are compiled for, with their drivers' parameter styles.
DIALECTS: dict[str, Dialect] = {
    "postgresql": postgresql.asyncpg.dialect(),  # type: ignore[no-untyped-call]
    "sqlite": sqlite.aiosqlite.dialect(),
}


def sql_literal(value: str) -> ColumnElement[Any]:
    """A string as a literal of the statement's text (not a parameter): keys, constants."""
    return literal_column("'" + value.replace("'", "''") + "'")


class JsonObject(FunctionElement[Any]):
    """An object of alternating keys (`sql_literal`) and values: `json_object` below."""

    name, inherit_cache = "json_object", True


class JsonNested(FunctionElement[Any]):
    """A JSON value (a subquery's, a CASE's, a JSON column's) nested in an object as JSON."""

    name, inherit_cache = "json_nested", True


class JsonBool(FunctionElement[Any]):
    """A condition as JSON true, false or null."""

    name, inherit_cache = "json_bool", True


class JsonCursor(FunctionElement[Any]):
    """A row's cursor, of its id: encoded here on SQLite, once parsed on PostgreSQL."""

    name, inherit_cache = "json_cursor", True


# The dialects whose statements encode cursors themselves (`JsonCursor`).
ENCODES_CURSORS = frozenset({"sqlite"})


def _cursor(item_id: str | None) -> str | None:
    return None if item_id is None else encode_cursor(item_id)


define_sql_function("bc_cursor", 1, _cursor)


class JsonIsEmptyObject(FunctionElement[bool]):
    """Whether a JSON column holds `{}` (a role binding not narrowed by conditions)."""

    name, inherit_cache = "json_is_empty_object", True
    type = Boolean()


per_dialect(JsonObject, postgresql="json_build_object({0})", sqlite="json_object({0})")
per_dialect(JsonNested, postgresql="{0}", sqlite="json({0})")
per_dialect(
    JsonBool,
    postgresql="({0})",
    sqlite="json(CASE WHEN ({0}) THEN 'true' WHEN NOT ({0}) THEN 'false' END)",
)
per_dialect(JsonCursor, postgresql="{0}", sqlite="bc_cursor({0})")


class ExactQuotient(FunctionElement[float]):
    """The double nearest n / d, as Python's `n / d` of ints gives it, for integers a
    double may not hold: n >= 0 in halves (high * 2^32 + low: read_rules' sums), d >= 1
    below 2^63 (a BIGINT).

    PostgreSQL divides in numeric to 130 decimal places and rounds that once to a double
    (numeric to float8 reads the number's text: correctly rounded, ties to even). That is
    the exact quotient's rounding: with d below 2^63, n / d is at least 2^-63, so a
    midpoint between two doubles near it is a multiple of 2^-116; the quotient is either
    one (at most 116 decimal places: held exactly) or at least 2^-179 (about 1e-54) from
    every one, far more than 130 places' error."""

    name, inherit_cache = "exact_quotient", True
    type = Float()


# The base of an integer given in halves (`ExactQuotient`'s n): high * HALF + low.
HALF = 2**32


def _quotient(high: int, low: int, divisor: int) -> float:
    return (high * HALF + low) / divisor


define_sql_function("bc_quotient", 3, _quotient)


@compiles(ExactQuotient, "postgresql")
def _exact_quotient_postgresql(element: ExactQuotient, compiler: SQLCompiler, **kw: Any) -> str:
    high, low, divisor = (compiler.process(c, **kw) for c in element.clauses)
    whole = f"CAST({high} AS NUMERIC) * {HALF} + ({low})"
    return f"CAST(CAST({whole} AS NUMERIC(1000, 130)) / ({divisor}) AS FLOAT8)"


per_dialect(ExactQuotient, sqlite="bc_quotient({0})")


class ExactSum(FunctionElement[int]):
    """The sum of a BIGINT column over a group's rows (0 over none), exact, as `part`:
    "high" and "low", halves whose `high * HALF + low` is the sum at any size (each
    half's sum fits 64 bits for up to 2^31 rows), or "whole": that sum in SQL (exact on
    PostgreSQL; on SQLite exact below 2^63, a double past it).

    SQLite's sum() raises past 64 bits, so there the halves are what is summed. PostgreSQL's
    sum() of BIGINT is exact already (a numeric, from a 128-bit accumulator): its high half
    is 0 and its low one the whole sum, one aggregate for the three parts (halves there
    cost the lending read a tenth of its time: two more sums, and numeric arithmetic per
    group)."""

    name, inherit_cache = "exact_sum", True
    type = BigInteger()
    _traverse_internals = [
        *FunctionElement._traverse_internals,
        ("part", InternalTraversal.dp_string),
    ]

    def __init__(self, amount: ColumnElement[int], part: str) -> None:
        assert part in ("high", "low", "whole"), part
        self.part = part
        super().__init__(amount)


@compiles(ExactSum, "postgresql")
def _exact_sum_postgresql(element: ExactSum, compiler: SQLCompiler, **kw: Any) -> str:
    if element.part == "high":
        return "0"
    return f"coalesce(sum({compiler.process(element.clauses, **kw)}), 0)"


@compiles(ExactSum, "sqlite")
def _exact_sum_sqlite(element: ExactSum, compiler: SQLCompiler, **kw: Any) -> str:
    amount = compiler.process(element.clauses, **kw)
    high = f"coalesce(sum(({amount}) >> 32), 0)"
    low = f"coalesce(sum(({amount}) & {HALF - 1}), 0)"
    return {"high": high, "low": low, "whole": f"({high} * {HALF} + {low})"}[element.part]


per_dialect(JsonIsEmptyObject, postgresql="({0} = '{{}}'::jsonb)", sqlite="(json({0}) = '{{}}')")


class JsonEntries(FunctionElement[Any]):
    """A JSON object column (the one argument) as an array of objects, one per key in
    the stored object's order, `[]` for `{}`: each object's `pairs` are (its key, "key"
    for the entry's key, "value" for its value, or a fixed string: `__typename`)."""

    name, inherit_cache = "json_entries", False

    def __init__(self, column: ColumnElement[Any], pairs: Sequence[tuple[str, str]]) -> None:
        self.pairs = tuple(pairs)
        super().__init__(column)


def _entry_object(element: JsonEntries, compiler: SQLCompiler, build: str, **kw: Any) -> str:
    parts: list[str] = []
    for key, what in element.pairs:
        value = {"key": "e.key", "value": "e.value"}.get(what)
        if value is None:
            value = compiler.process(sql_literal(what), **kw)
        parts += [compiler.process(sql_literal(key), **kw), value]
    return f"{build}({', '.join(parts)})"


@compiles(JsonEntries, "postgresql")
def _json_entries_postgresql(element: JsonEntries, compiler: SQLCompiler, **kw: Any) -> str:
    column = compiler.process(element.clauses, **kw)
    item = _entry_object(element, compiler, "json_build_object", **kw)
    return (
        f"coalesce((SELECT json_agg({item} ORDER BY e.n) FROM jsonb_each({column})"
        " WITH ORDINALITY AS e(key, value, n)), '[]'::json)"
    )


@compiles(JsonEntries, "sqlite")
def _json_entries_sqlite(element: JsonEntries, compiler: SQLCompiler, **kw: Any) -> str:
    # json_each's rows in `id` order are the object's keys in its text's order; the
    # ordered subquery keeps that order for the aggregate (`sqlite_keeps_subquery_order`,
    # else a window of it).
    column = compiler.process(element.clauses, **kw)
    item = _entry_object(element, compiler, "json_object", **kw)
    each = f"(SELECT key, value, id FROM json_each({column}) ORDER BY id)"
    if not sqlite_keeps_subquery_order():
        return (
            f"json(coalesce((SELECT json_group_array({item}) OVER (ORDER BY e.id ROWS BETWEEN"
            f" UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) FROM {each} AS e LIMIT 1), '[]'))"
        )
    return f"(SELECT json_group_array({item}) FROM {each} AS e)"


def json_object(pairs: Sequence[tuple[str, ColumnElement[Any]]]) -> JsonObject:
    args: list[ColumnElement[Any]] = []
    for key, value in pairs:
        args += [sql_literal(key), value]
    return JsonObject(*args)


def rows_from(source: FromClause) -> Select[Any]:
    """The rows of `source` (a table, a CTE, a join) for a JsonArray, to add a WHERE to:
    its columns name what its FROM reads (SQLite's form selects the item's from them)."""
    return select(*source.c).select_from(source)


class JsonArray(ColumnElement[Any]):
    """The array of `item` (a JSON object over each row) for the rows `rows` selects
    (`rows_from`, with a WHERE), in `order`; `[]` when there are none. Correlated to the
    enclosing statement as a scalar subquery would be."""

    # Compiled once per shape and dialect by json_reads, never keyed by SQLAlchemy.
    inherit_cache = False
    # Traversed (and copied) like any clause: SQLite's form re-points an item's columns
    # at its ordered subquery, the nested arrays' correlations included.
    _traverse_internals = [
        ("item", InternalTraversal.dp_clauseelement),
        ("rows", InternalTraversal.dp_clauseelement),
        ("order", InternalTraversal.dp_clauseelement_tuple),
    ]

    def __init__(
        self, item: ColumnElement[Any], rows: Select[Any], order: Sequence[ColumnElement[Any]]
    ) -> None:
        self.item = item
        self.rows = rows
        self.order = tuple(order)


# The clauses a JsonArray's form builds while compiling, kept until that compile ends: an
# anonymous name (`json_agg_1`, `anon_2`) is drawn from its clause's id(), so a clause
# freed while the statement still compiles lends its id, and its name, to the next one
# built; the same statement would then compile to different texts from run to run.
_BUILT: weakref.WeakKeyDictionary[SQLCompiler, list[Any]] = weakref.WeakKeyDictionary()


def _process_built(compiler: SQLCompiler, built: ColumnElement[Any], **kw: Any) -> str:
    """`built`'s text within `compiler`'s statement, `built` alive until that ends."""
    _BUILT.setdefault(compiler, []).append(built)
    return compiler.process(built, **kw)


@compiles(JsonArray, "postgresql")
def _json_array_postgresql(element: JsonArray, compiler: SQLCompiler, **kw: Any) -> str:
    item: ColumnElement[Any] = element.item
    if element.order:
        item = aggregate_order_by(item, *element.order)
    rows = element.rows.with_only_columns(func.json_agg(item)).scalar_subquery()
    return _process_built(compiler, func.coalesce(rows, literal_column("'[]'::json")), **kw)


# SQLite keeps a FROM-clause subquery's ORDER BY when the query over it calls an
# aggregate other than count(), min() or max() (it neither flattens such a subquery nor
# drops its ORDER BY), so json_group_array reads the rows in that order. SQLite does not
# document that order, so it is checked on this process's SQLite (the library aiosqlite
# uses too) with a statement of the same form before any array is compiled so; where the
# check fails the arrays are windows of their order.
_ORDER_PROBE = """
WITH p(id) AS (VALUES ('b'), ('c'), ('a')),
     q(pool, k) AS (VALUES ('a', 'z'), ('c', 'y'), ('a', 'x'), ('b', 'w'), ('c', 'v'))
SELECT (SELECT json_group_array(json_object('id', r.id, 'k',
    (SELECT json_group_array(s.k) FROM (SELECT q.k AS k FROM q WHERE q.pool = r.id
                                        ORDER BY q.k DESC) AS s)))
  FROM (SELECT p.id AS id FROM p ORDER BY p.id) AS r)
"""
_ORDER_EXPECTED = '[{"id":"a","k":["z","x"]},{"id":"b","k":["w"]},{"id":"c","k":["y","v"]}]'


@functools.cache
def sqlite_keeps_subquery_order() -> bool:
    """Whether this SQLite aggregates a FROM-clause subquery's rows in its ORDER BY (the
    form of `_ORDER_PROBE`); False, with one warning, when it does not or cannot say."""
    try:
        with contextlib.closing(sqlite3.connect(":memory:")) as conn:
            found = conn.execute(_ORDER_PROBE).fetchone()[0]
    except sqlite3.Error as exc:
        found = f"{type(exc).__name__}: {exc}"
    if found == _ORDER_EXPECTED:
        return True
    log.warning(
        "SQLite %s does not aggregate an ordered subquery in its order (%s); compiled"
        " reads order their arrays by a window instead",
        sqlite3.sqlite_version,
        found,
    )
    return False


def _tables(from_: FromClause) -> list[FromClause]:
    """The tables (or CTEs) a FROM object reads, a join's sides unfolded."""
    if isinstance(from_, Join):
        return _tables(from_.left) + _tables(from_.right)
    return [from_]


@compiles(JsonArray, "sqlite")
def _json_array_sqlite(element: JsonArray, compiler: SQLCompiler, **kw: Any) -> str:
    if not sqlite_keeps_subquery_order():
        # Every row's window is the whole set, in `order`: the first row's value is the
        # array.
        agg = func.json_group_array(element.item).over(
            order_by=element.order or None, rows=(None, None)
        )
        rows = element.rows.with_only_columns(agg).limit(literal_column("1")).scalar_subquery()
        window = func.json(func.coalesce(rows, literal_column("'[]'")))
        return _process_built(compiler, window, **kw)
    # The rows' columns the item (its nested arrays' correlations included) reads, in
    # `order`, as a subquery; the item is built over it, outside it (a value that leaves
    # a subquery loses its JSON subtype; a scalar subquery's keeps it, so no json() is
    # needed around a nested array). An aggregate over no rows is `[]`.
    own = [t for f in element.rows.columns_clause_froms for t in _tables(f)]
    needed: dict[Any, ColumnElement[Any]] = {}
    for part in (element.item, *element.order):
        for e in iterate(part):
            if isinstance(e, ColumnElement) and getattr(e, "table", None) in own:
                needed.setdefault(e, e)
    ordered = (
        element.rows.with_only_columns(*needed.values())
        .order_by(*element.order)
        .correlate_except(*own)
        .subquery()
    )
    item = ClauseAdapter(ordered).traverse(element.item)
    array = select(func.json_group_array(item)).select_from(ordered).scalar_subquery()
    return _process_built(compiler, array, **kw)


@dataclass(frozen=True, slots=True)
class Statement:
    """Compiled SQL text, the names of its positional parameters in order, and the values
    of those the builders fixed (literals)."""

    sql: str
    names: tuple[str, ...]
    fixed: dict[str, Any]

    def params(self, values: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(values[n] if n in values else self.fixed[n] for n in self.names)


def compile_statement(statement: Any, dialect: str) -> Statement:
    """`statement`'s text for `dialect` (a name of DIALECTS), with positional parameters."""
    compiled = statement.compile(dialect=DIALECTS[dialect])
    names = tuple(compiled.positiontup or ())
    return Statement(str(compiled), names, dict(compiled.params))
