"""The dialect seam of the compiled JSON reads: the few pieces PostgreSQL and SQLite write
differently, each one SQLAlchemy construct compiled per dialect (as Prefect keeps
`build_json_object` and `json_arr_agg`), so one Core statement (app/capacity/json_reads.py)
builds the same JSON on both.

- `JsonObject`: PostgreSQL `json_build_object`, SQLite `json_object`.
- `JsonArray`: the rows of a selection as an array in an order, `[]` with none:
  PostgreSQL `json_agg(... ORDER BY ...)`, SQLite `json_group_array` over a window of
  that order (SQLite before 3.44 has no ORDER BY in an aggregate).
- `JsonNested`: a JSON value that did not come straight from a JSON function (a
  subquery's, a CASE's, a JSON column's): SQLite would embed it as a string without
  `json(...)`.
- `JsonBool`: SQLite has no boolean, and would show 0 and 1.
- `JsonIsEmptyObject`: a JSON column holding `{}`.
- `compile_statement`: a statement's text for a dialect, with the names of its
  positional parameters (asyncpg's `$n`, sqlite3's `?`).

Timestamps are `fields.IsoTimestamp`, compiled per dialect beside the table of fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Boolean, ColumnElement, Select, func, literal_column
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

# The dialects the statements are compiled for, with their drivers' parameter styles.
DIALECTS: dict[str, Dialect] = {
    "postgresql": postgresql.asyncpg.dialect(),  # type: ignore[no-untyped-call]
    "sqlite": sqlite.aiosqlite.dialect(),
}


def sql_literal(value: str) -> ColumnElement[Any]:
    """A string as a literal of the statement's text (not a parameter): keys, constants."""
    return literal_column("'" + value.replace("'", "''") + "'")


def per_dialect(element: type[FunctionElement[Any]], **templates: str) -> None:
    """Compile `element` on each dialect named by `templates`: its one argument (or its
    arguments, comma separated) where the template says `{0}`."""
    for dialect, template in templates.items():

        def render(
            e: FunctionElement[Any], compiler: SQLCompiler, template: str = template, **kw: Any
        ) -> str:
            return template.format(compiler.process(e.clauses, **kw))

        compiles(element, dialect)(render)


class JsonObject(FunctionElement[Any]):
    """An object of alternating keys (`sql_literal`) and values: `json_object` below."""

    name, inherit_cache = "json_object", True


class JsonNested(FunctionElement[Any]):
    """A JSON value (a subquery's, a CASE's, a JSON column's) nested in an object as JSON."""

    name, inherit_cache = "json_nested", True


class JsonBool(FunctionElement[Any]):
    """A condition as JSON true, false or null."""

    name, inherit_cache = "json_bool", True


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
per_dialect(JsonIsEmptyObject, postgresql="({0} = '{{}}'::jsonb)", sqlite="(json({0}) = '{{}}')")


def json_object(pairs: Sequence[tuple[str, ColumnElement[Any]]]) -> JsonObject:
    args: list[ColumnElement[Any]] = []
    for key, value in pairs:
        args += [sql_literal(key), value]
    return JsonObject(*args)


class JsonArray(ColumnElement[Any]):
    """The array of `item` (a JSON object over each row) for the rows `rows` selects (its
    FROM and WHERE: its columns are not used), in `order`; `[]` when there are none.
    Correlated to the enclosing statement as a scalar subquery would be."""

    # Compiled once per shape and dialect by json_reads, never keyed by SQLAlchemy.
    inherit_cache = False

    def __init__(
        self, item: ColumnElement[Any], rows: Select[Any], order: Sequence[ColumnElement[Any]]
    ) -> None:
        self.item = item
        self.rows = rows
        self.order = tuple(order)


@compiles(JsonArray, "postgresql")
def _json_array_postgresql(element: JsonArray, compiler: SQLCompiler, **kw: Any) -> str:
    item: ColumnElement[Any] = element.item
    if element.order:
        item = aggregate_order_by(item, *element.order)
    rows = element.rows.with_only_columns(func.json_agg(item)).scalar_subquery()
    return compiler.process(func.coalesce(rows, literal_column("'[]'::json")), **kw)


@compiles(JsonArray, "sqlite")
def _json_array_sqlite(element: JsonArray, compiler: SQLCompiler, **kw: Any) -> str:
    # Every row's window is the whole set, in `order`: the first row's value is the array.
    agg = func.json_group_array(element.item).over(
        order_by=element.order or None, rows=(None, None)
    )
    rows = element.rows.with_only_columns(agg).limit(literal_column("1")).scalar_subquery()
    return compiler.process(func.json(func.coalesce(rows, literal_column("'[]'"))), **kw)


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
