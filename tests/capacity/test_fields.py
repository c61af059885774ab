"""The table of fields (app/capacity/fields.py) agrees with the Strawberry types, the
models and the compiled builder, so a field forgotten in one of them fails here instead of
sending its queries to the plain path in silence."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest
from graphql import (
    GraphQLEnumType,
    GraphQLList,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLOutputType,
    get_named_type,
)
from sqlalchemy import Column, DateTime, literal, select

from app.capacity import json_reads
from app.capacity.access import LockedPool
from app.capacity.fields import (
    CAPACITY,
    LENDING_ROW,
    PAGE_INFO,
    POOL,
    QUOTA,
    RESERVATION,
    ROW_TABLES,
    STATEMENT,
    TABLES,
    IsoTimestamp,
    Relation,
    Table,
    Value,
    timestamp,
)
from app.capacity.json_sql import DIALECTS
from app.capacity.shapes import (
    Constant,
    Field,
    Nested,
    Paged,
    PageShape,
    PoolShape,
    Read,
    Rows,
    Shape,
)
from app.capacity.views import PoolView, StoredPool
from app.compat import graphql_core_schema
from app.db.engine import Database
from app.db.models import Pool
from schema.app import schema
from schema.compiled_reads import CompiledReads

GRAPHQL = graphql_core_schema(schema)

# The GraphQL scalar each kind is, and the kind of list `amounts` is.
_SCALARS = {
    "ID": "id",
    "String": "string",
    "Int": "int",
    "Long": "long",
    "Float": "float",
    "Boolean": "bool",
    "DateTime": "timestamp",
    "JSON": "json",
}
# Kinds that GraphQL shows as another kind's scalar: a label map is JSON there.
_GRAPHQL_KIND = {"labels": "json"}
# GraphQL types whose fields are the same as a table's, and the fields they add.
_SAME_FIELDS = {"OfferedPool": (POOL, {"poolId"})}


def disagreements(table: Table, graphql_type: GraphQLObjectType) -> list[str]:
    """Where `table` and the GraphQL type it describes differ: a field of one missing in
    the other, a nullability, a kind, an enum's values, a relation's type."""
    found: list[str] = []
    name = graphql_type.name
    entries = table.by_graphql
    for missing in sorted(set(graphql_type.fields) - set(entries)):
        found.append(f"{name}.{missing}: in the GraphQL type, not in the table")
    for extra in sorted(set(entries) - set(graphql_type.fields)):
        found.append(f"{name}.{extra}: in the table, not in the GraphQL type")
    for field_name, entry in entries.items():
        field = graphql_type.fields.get(field_name)
        if field is None:
            continue
        where = f"{name}.{field_name}"
        kind: GraphQLOutputType = field.type
        if entry.nullable == isinstance(kind, GraphQLNonNull):
            found.append(f"{where}: nullable {entry.nullable} in the table")
        inner = kind.of_type if isinstance(kind, GraphQLNonNull) else kind
        listed = isinstance(inner, GraphQLList)
        named = get_named_type(kind)
        if isinstance(entry, Relation):
            if named.name != entry.of or listed != entry.many:
                found.append(f"{where}: {kind} in GraphQL, {entry.of} (many {entry.many})")
            continue
        if entry.kind == "amounts":
            if not (listed and named.name == "ResourceAmount"):
                found.append(f"{where}: amounts are a list of ResourceAmount, not {kind}")
        elif isinstance(named, GraphQLEnumType):
            values = tuple(str(v.value) for v in named.values.values())
            if entry.kind != "enum" or entry.values != values:
                found.append(f"{where}: enum {values}, the table {entry.kind} {entry.values}")
        elif listed or _SCALARS.get(named.name) != _GRAPHQL_KIND.get(entry.kind, entry.kind):
            found.append(f"{where}: {kind} in GraphQL, {entry.kind} in the table")
    for entry in table.entries:
        if entry.compiled == bool(entry.uncompiled):
            found.append(f"{name}.{entry.name}: compiled, or not with a reason: not both")
    return found


def test_every_table_agrees_with_its_graphql_type() -> None:
    found: list[str] = []
    for name, table in TABLES.items():
        graphql_type = GRAPHQL.type_map[name]
        assert isinstance(graphql_type, GraphQLObjectType)
        found += disagreements(table, graphql_type)
    for name, (table, added) in _SAME_FIELDS.items():
        graphql_type = GRAPHQL.type_map[name]
        assert isinstance(graphql_type, GraphQLObjectType)
        assert set(graphql_type.fields) == set(table.by_graphql) | added, name
    assert found == []


def test_a_forgotten_or_wrong_entry_is_found() -> None:
    pool = GRAPHQL.type_map["Pool"]
    assert isinstance(pool, GraphQLObjectType)
    without_agent = dataclasses.replace(
        POOL, entries=tuple(e for e in POOL.entries if e.name != "agent")
    )
    assert disagreements(without_agent, pool) == [
        "Pool.agent: in the GraphQL type, not in the table"
    ]
    wrong = tuple(
        dataclasses.replace(e, nullable=True) if e.name == "region" else e for e in POOL.entries
    )
    assert disagreements(dataclasses.replace(POOL, entries=wrong), pool) == [
        "Pool.region: nullable True in the table"
    ]
    unexplained = tuple(
        dataclasses.replace(e, column=None) if e.name == "version" else e for e in POOL.entries
    )
    assert disagreements(dataclasses.replace(POOL, entries=unexplained), pool) == [
        "Pool.version: compiled, or not with a reason: not both"
    ]


def test_nullable_columns_are_nullable_fields() -> None:
    for table in TABLES.values():
        for entry in table.entries:
            column = entry.column if isinstance(entry, Value) else None
            if isinstance(column, Column) and column.nullable:
                assert entry.nullable, f"{table.graphql}.{entry.name}"


def test_a_pools_stored_columns_are_the_models() -> None:
    """views.StoredPool, the stored part of PoolView and the row a write locks and changes
    (access.LockedPool), holds every column of the model's table and nothing else: a
    column added to one and not the other fails here. Its rows of the table of fields
    name the same columns."""
    stored = {f.name for f in dataclasses.fields(StoredPool)}
    assert stored == {c.key for c in Pool.__table__.columns}
    assert LockedPool is StoredPool and issubclass(PoolView, StoredPool)
    read = {e.name for e in POOL.entries if isinstance(e, Value) and isinstance(e.column, Column)}
    assert read == stored


def _shape_fields(table: Table) -> tuple[Field, ...]:
    """Every compiled field of `table`, nested relations too, under its GraphQL name."""
    fields: list[Field] = []
    for entry in table.entries:
        if not entry.compiled or entry.graphql is None:
            continue
        if isinstance(entry, Value) and entry.kind == "amounts":
            amount = (Read("resource", "resource"), Read("amount", "amount"))
            fields.append(Nested(entry.graphql, "amounts", amount))
        elif isinstance(entry, Value):
            fields.append(Read(entry.graphql, entry.name))
        elif entry.rows == "reservations":  # a connection: a page per pool
            page = (
                Nested("nodes", "nodes", _shape_fields(RESERVATION)),
                Nested("pageInfo", "page_info", _shape_fields(PAGE_INFO)),
            )
            fields.append(Paged(entry.graphql, "reservations", page, "rsv0"))
        elif entry.rows == "grant":
            fields.append(Nested(entry.graphql, "grant", _shape_fields(TABLES[entry.of])))
        elif entry.rows is not None:
            fields.append(Rows(entry.graphql, entry.rows, _shape_fields(TABLES[entry.of])))
    return tuple(fields)


class _Compiler:
    """What CompiledReads asks of the domain, without a database: the statement for a
    dialect."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect

    def compile_read(
        self, shape: Shape, root: tuple[Constant, ...] = ()
    ) -> json_reads.CompiledRead | None:
        return json_reads.compile_read(shape, root, dialect=self.dialect)


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_every_compiled_field_compiles(dialect: str) -> None:
    pool = _shape_fields(POOL)
    assert json_reads.compile_read(PoolShape("pool", pool), dialect=dialect) is not None
    page = (
        Nested("nodes", "nodes", pool),
        Nested("pageInfo", "page_info", _shape_fields(PAGE_INFO)),
    )
    assert json_reads.compile_read(PageShape("pools", page), dialect=dialect) is not None
    for kind, table in ROW_TABLES.items():
        for entry in table.entries:
            if isinstance(entry, Value) and entry.compiled and entry.column is not STATEMENT:
                assert entry.name in json_reads._COLUMNS[kind], (kind, entry.name)


def _selection(table: Table) -> str:
    parts = []
    for entry in table.entries:
        if not entry.compiled or entry.graphql is None:
            continue
        if isinstance(entry, Relation) and entry.rows == "reservations":
            node = _selection(RESERVATION)
            parts.append(
                f"{entry.graphql} {{ nodes {{ {node} }} edges {{ cursor node {{ {node} }} }}"
                f" pageInfo {{ {_selection(PAGE_INFO)} }} }}"
            )
        elif isinstance(entry, Relation):
            parts.append(f"{entry.graphql} {{ {_selection(TABLES[entry.of])} }}")
        elif isinstance(entry, Value) and entry.kind == "amounts":
            parts.append(f"{entry.graphql} {{ resource amount __typename }}")
        else:
            parts.append(entry.graphql)
    return " ".join(parts)


_POOL, _PAGE = _selection(POOL), _selection(PAGE_INFO)


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
@pytest.mark.parametrize(
    "query",
    [
        "query($t: String!) { pools(tenantId: $t) { "
        f"nodes {{ {_POOL} }} pageInfo {{ {_PAGE} }} }} }}",
        f"query($t: String!, $p: ID!) {{ pool(tenantId: $t, poolId: $p) {{ {_POOL} }} }}",
        f"query($t: String!) {{ quotas(tenantId: $t) {{ {_selection(QUOTA)} }} }}",
        "query($t: String!, $p: ID!) { capacity(tenantId: $t, poolId: $p) "
        f"{{ {_selection(CAPACITY)} }} }}",
        f"query($t: String!) {{ lending(tenantId: $t) {{ {_selection(LENDING_ROW)} }} }}",
    ],
)
def test_a_query_of_every_compiled_field_is_planned(query: str, dialect: str) -> None:
    reads = CompiledReads(GRAPHQL, max_cost=10**9)
    reads.learn(query, None)
    plan = reads.plan(query, None)
    assert plan is not None
    variables: dict[str, Any] = {"t": "acme", "p": "pool_01j00000000000000000000000"}
    compiler = _Compiler(dialect)
    assert reads.prepare(plan, variables, compiler) is not None  # type: ignore[arg-type]


def test_a_field_not_compiled_is_not_planned() -> None:
    """`lending` is a row with a reason: its query runs on the plain path."""
    assert not POOL.entry("lending").compiled
    query = "query($t: String!) { pools(tenantId: $t) { nodes { id lending { priority } } } }"
    reads = CompiledReads(GRAPHQL, max_cost=10**9)
    reads.learn(query, None)
    plan = reads.plan(query, None)
    assert plan is not None
    compiler = _Compiler("postgresql")
    assert reads.prepare(plan, {"t": "acme"}, compiler) is None  # type: ignore[arg-type]


_MOMENTS = [
    datetime(2026, 5, 1, 12, tzinfo=UTC),
    datetime(2026, 5, 1, 12, 0, 0, 1230, tzinfo=UTC),
    datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(2026, 5, 1, 14, 30, 5, 500000, tzinfo=UTC),
]  # UTC, as every stored time reads back (`timestamp` does not convert)


async def test_the_statement_renders_timestamps_as_python_does(db: Database) -> None:
    """IsoTimestamp (the compiled reads) and `timestamp` (REST, GraphQL) agree, on both
    dialects (SQLite: over the text SQLAlchemy stores)."""
    async with db.reader.connect() as conn:
        for moment in _MOMENTS:
            moment_sql = literal(moment, DateTime(timezone=True))
            shown = (await conn.execute(select(IsoTimestamp(moment_sql)))).scalar()
            assert shown == timestamp(moment), moment
        if db.dialect == "sqlite":
            # A row written by SQL's CURRENT_TIMESTAMP (migration 0002's fleet tenant) has
            # no fraction; SQLAlchemy reads it as a whole second.
            stored = literal("2026-05-01 12:00:00")
            shown = (await conn.execute(select(IsoTimestamp(stored)))).scalar()
            assert shown == timestamp(datetime(2026, 5, 1, 12, tzinfo=UTC)), shown


def test_one_timestamp_form() -> None:
    assert timestamp(datetime(2026, 5, 1, 12, tzinfo=UTC)) == "2026-05-01T12:00:00Z"
    assert timestamp(datetime(2026, 5, 1, 12, 0, 0, 1230, tzinfo=UTC)) == (
        "2026-05-01T12:00:00.001230Z"
    )
    assert timestamp(None) is None
