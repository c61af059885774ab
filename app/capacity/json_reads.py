"""Reads answered by one statement that returns the whole answer as JSON (PostgreSQL).

A shape (app/capacity/shapes.py) is compiled once into SQL text: the visibility rule of
CONTRACT section 2 (the tenant's authz rows, its ancestors' with includeDescendants,
archived pools for their owner only), the grant whose quota rows the tenant books
against, and a check that the caller's token is still live and its role binding
unchanged, all inside the one statement. Per request only the parameters are bound, and
asyncpg reuses the prepared statement, so a read is one round trip.

The statement answers only what it is sure of; it returns NULL whenever the plain read
might answer otherwise (a revoked or rebound token, an unknown tenant, a pool the tenant
cannot see), and the caller then takes the plain path, which gives the exact error.
Callers with narrowed role bindings, and shapes that need per-pool IAM beyond
compute:pools:read and compute:capacity:read, never come here (see `eligible`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Column, Table, literal_column
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.elements import BinaryExpression, BindParameter, ColumnElement
from sqlalchemy.sql.visitors import ExternallyTraversible, replacement_traverse

from app.capacity.fields import ACTING_TENANT, ROW_TABLES, Relation, Value
from app.capacity.inputs import GetPoolInput, ListPoolsInput, MethodInput
from app.capacity.policy import readable_policy
from app.capacity.shapes import (
    Constant,
    Field,
    Nested,
    PageShape,
    Read,
    Rows,
    Shape,
)
from app.db.direct import traced
from app.db.engine import Database
from app.iam.principal import Principal
from app.iam.roles import CAPACITY_READ, POOLS_READ

# json_build_object takes at most 100 arguments: 50 keys.
MAX_KEYS = 50

_TENANT, _TOKEN, _ROLE, _SHARES = "$1::text", "$2::text", "$3::text", "$4::bool"
_ARG, _FIRST = "$5::text", "$6::int"


class Unsupported(Exception):
    """The shape asks for something this statement does not build."""


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _cursor(expr: str) -> str:
    # paging.encode_cursor: urlsafe base64 of "v1:<id>"; PostgreSQL wraps base64 at 76.
    return (
        f"replace(translate(encode(convert_to('v1:' || {expr}, 'UTF8'), 'base64'), "
        f"'+/', '-_'), E'\\n', '')"
    )


# Each table's alias in the statements below.
_ALIASES = {"pools": "p", "quota_rows": "r", "capacity_rows": "r", "offers": "o"}
_DIALECT = postgresql.dialect()  # type: ignore[no-untyped-call]


def _sql(expr: ColumnElement[Any]) -> str:
    """A field's expression (app/capacity/fields.py) as this statement's SQL: its columns
    over the row aliases, the acting tenant bound to its parameter."""

    def swap(element: ExternallyTraversible, **_: Any) -> ExternallyTraversible | None:
        if isinstance(element, Column) and isinstance(element.table, Table):
            alias = element.table.alias(_ALIASES[element.table.name])
            return alias.c[element.key]
        if isinstance(element, BindParameter) and element.key == ACTING_TENANT.key:
            return literal_column(_TENANT)
        return None

    swapped = replacement_traverse(expr, {}, swap)
    text = str(swapped.compile(dialect=_DIALECT))
    return f"({text})" if isinstance(swapped, BinaryExpression) else text


# The values of each kind of object (a pool, and the rows of each compiled relation):
# the table of fields' expressions over the row aliases.
_COLUMNS: dict[str, dict[str, str]] = {
    kind: {
        e.name: _sql(e.selected)
        for e in table.entries
        if isinstance(e, Value) and isinstance(e.column, ColumnElement)
    }
    for kind, table in ROW_TABLES.items()
}
# Each list of pool `p` (or offer `o`), in the plain read's order: the quota rows of the
# tenant whose grant lets the actor see the pool (its own, or an ancestor's with
# includeDescendants: reads.effective_quotas) with the offer that gives each row; the
# rollup; the offers (reads.offers_of) and each offer's quota rows.
_ROW_SOURCES = {
    "quotas": "quota_rows r LEFT JOIN offers o ON o.pool_id = r.pool_id "
    "AND o.tenant_id = r.tenant_id WHERE r.pool_id = p.id AND r.tenant_id = p.grant_tenant",
    "capacity": "capacity_rows r WHERE r.pool_id = p.id",
    "offers": "offers o WHERE o.pool_id = p.id",
    "offer_quotas": "quota_rows r WHERE r.pool_id = o.pool_id AND r.tenant_id = o.tenant_id",
}
# Each list's order: the one the plain read sorts by (the table of fields' `order`).
_ROW_ORDER = {
    e.rows: ", ".join(_sql(c) for c in e.order)
    for table in ROW_TABLES.values()
    for e in table.entries
    if isinstance(e, Relation) and e.rows in _ROW_SOURCES
}
# What each kind of row may nest.
_NESTS = {"pool": {"quotas", "capacity", "offers"}, "offers": {"offer_quotas"}}


def _object(pairs: list[tuple[str, str]]) -> str:
    if len(pairs) > MAX_KEYS:
        raise Unsupported(f"more than {MAX_KEYS} keys in one object")
    return "json_build_object(" + ", ".join(f"{_literal(k)}, {v}" for k, v in pairs) + ")"


def _value(field: Read, columns: dict[str, str]) -> str:
    expr = columns.get(field.value)
    if expr is None:
        raise Unsupported(f"{field.value} here")
    if field.mapping is None:
        return expr
    cases = " ".join(f"WHEN {_literal(a)} THEN {_literal(b)}" for a, b in field.mapping)
    return f"CASE {expr} {cases} END"


def _rows(field: Rows) -> str:
    row = _fields(field.kind, field.fields)
    rows = (
        f"COALESCE((SELECT json_agg({row} ORDER BY {_ROW_ORDER[field.kind]}) "
        f"FROM {_ROW_SOURCES[field.kind]}), '[]'::json)"
    )
    if field.kind == "offers":
        # Only the owner has offers to show, and only with compute:pools:share.
        return f"CASE WHEN p.tenant_id = {_TENANT} AND {_SHARES} THEN {rows} END"
    return rows


def _fields(kind: str, fields: tuple[Field, ...]) -> str:
    """An object of `kind` with `fields`, in order, under their keys."""
    columns = _COLUMNS[kind]
    pairs: list[tuple[str, str]] = []
    for f in fields:
        if isinstance(f, Constant):
            pairs.append((f.key, _literal(f.value)))
        elif isinstance(f, Read):
            pairs.append((f.key, _value(f, columns)))
        elif isinstance(f, Rows) and f.kind in _NESTS.get(kind, ()):
            pairs.append((f.key, _rows(f)))
        elif isinstance(f, Nested) and f.kind == "grant" and kind == "quotas":
            grant = _fields("grant", f.fields)
            pairs.append((f.key, f"CASE WHEN o.tenant_id IS NOT NULL THEN {grant} END"))
        elif isinstance(f, Nested) and f.kind == "grant" and kind == "offer_quotas":
            pairs.append((f.key, "NULL"))  # an offer's rows: the offer says it
        else:
            raise Unsupported(f"{f.key} here")
    return _object(pairs)


def _pool(fields: tuple[Field, ...]) -> str:
    return _fields("pool", fields)


def _edge(fields: tuple[Field, ...]) -> str:
    pairs: list[tuple[str, str]] = []
    for f in fields:
        if isinstance(f, Read) and f.value == "cursor":
            pairs.append((f.key, _cursor("p.id")))
        elif isinstance(f, Nested) and f.kind == "node":
            pairs.append((f.key, _pool(f.fields)))
        elif isinstance(f, Constant):
            pairs.append((f.key, _literal(f.value)))
        else:
            raise Unsupported(f"{f.key} on an edge")
    return _object(pairs)


_PAGE_INFO = {
    "has_next_page": f"((SELECT count(*) FROM page) > {_FIRST})",
    "has_previous_page": f"({_ARG} IS NOT NULL)",
    "start_cursor": f"(SELECT {_cursor('s.id')} FROM shown s ORDER BY s.id LIMIT 1)",
    "end_cursor": f"(SELECT {_cursor('s.id')} FROM shown s ORDER BY s.id DESC LIMIT 1)",
}


def _page(fields: tuple[Field, ...]) -> str:
    pairs: list[tuple[str, str]] = []
    for f in fields:
        if isinstance(f, Constant):
            pairs.append((f.key, _literal(f.value)))
        elif isinstance(f, Nested) and f.kind == "page_info":
            info: list[tuple[str, str]] = []
            for g in f.fields:
                if isinstance(g, Read):
                    info.append((g.key, _value(g, _PAGE_INFO)))
                elif isinstance(g, Constant):
                    info.append((g.key, _literal(g.value)))
                else:
                    raise Unsupported(f"{g.key} on pageInfo")
            pairs.append((f.key, _object(info)))
        elif isinstance(f, Nested) and f.kind in ("nodes", "edges"):
            item = _pool(f.fields) if f.kind == "nodes" else _edge(f.fields)
            items = f"SELECT json_agg({item} ORDER BY p.id) FROM shown p"
            pairs.append((f.key, f"COALESCE(({items}), '[]'::json)"))
        else:
            raise Unsupported(f"{f.key} on a page")
    return _object(pairs)


# The tenant and its ancestors (reads.load_lineage), and whether the token is live with
# the role the caller was planned for and no narrowing.
_COMMON = f"""WITH RECURSIVE lineage(id, parent_id, depth) AS (
  SELECT t.id, t.parent_id, 0 FROM tenants t WHERE t.id = {_TENANT}
  UNION ALL
  SELECT t.id, t.parent_id, l.depth + 1 FROM tenants t JOIN lineage l ON t.id = l.parent_id
), caller AS (
  SELECT {_SHARES} AS shares FROM api_tokens k JOIN role_bindings b ON b.caller_id = k.caller_id
  WHERE k.token_hash = {_TOKEN} AND k.revoked_at IS NULL AND b.role = {_ROLE}
    AND b.conditions = '{{}}'::jsonb
)"""
# The pools the lineage sees (reads._visible_pools_query), each with the row that grants
# it (reads.load_grants: the actor's own authz row first, else the nearest ancestor's
# with includeDescendants), archived pools for their owner only.
_GRANTS = """SELECT DISTINCT ON (a.pool_id) a.pool_id, a.tenant_id AS grant_tenant
    FROM lineage l JOIN authz_rows a ON a.tenant_id = l.id
    WHERE (l.depth = 0 OR a.include_descendants) AND {where}
    ORDER BY a.pool_id, l.depth"""
# The same for one pool `p`, by the authz rows' primary key.
_GRANT = """SELECT l.id AS grant_tenant FROM lineage l WHERE EXISTS (
      SELECT 1 FROM authz_rows a WHERE a.tenant_id = l.id AND a.pool_id = p.id
      AND (l.depth = 0 OR a.include_descendants))
    ORDER BY l.depth LIMIT 1"""
_SEES = f"(NOT p.archived OR p.tenant_id = {_TENANT})"


@dataclass(frozen=True, slots=True)
class CompiledRead:
    """A shape's statement: parameters $1 tenant, $2 token hash, $3 role, $4 whether
    the role shares (compute:pools:share), then $5 `after` and $6 `first` for a page,
    $5 the pool id for a pool.

    `input` is the catalog method's input (`list` or `get`, app/catalog.py): the
    arguments are validated by it, whole, as the plain read validates them, so input it
    refuses (an unknown field included) gets no answer here."""

    shape: Shape
    sql: str
    input: type[MethodInput]
    reads_capacity: bool
    shows_policy: bool  # masked once parsed (`readable`)

    @property
    def page(self) -> bool:
        return isinstance(self.shape, PageShape)


def compile_read(shape: Shape, root: tuple[Constant, ...] = ()) -> CompiledRead | None:
    """The statement for `shape` under its key (with `root`'s constants beside it), or
    None when it builds no such answer. Done once per shape by the transport's plan."""
    try:
        sql = _statement(shape, root)
    except Unsupported:
        return None
    needs = _needs(shape.fields)
    model = ListPoolsInput if isinstance(shape, PageShape) else GetPoolInput
    return CompiledRead(shape, sql, model, "capacity" in needs, "policy" in needs)


def _statement(shape: Shape, root: tuple[Constant, ...]) -> str:
    pairs = [(c.key, _literal(c.value)) for c in root]
    # An owner's caller without compute:pools:share asking for offers gets the plain
    # read's PERMISSION_DENIED on that field: answer nothing here.
    declines = any(
        isinstance(f, Rows) and f.kind == "offers" and f.if_denied == "decline"
        for f in _all(shape.fields)
    )
    if isinstance(shape, PageShape):
        pairs.append((shape.key, _page(shape.fields)))
        grants = _GRANTS.format(where=f"({_ARG} IS NULL OR a.pool_id > {_ARG})")
        unshared = (
            f"AND ({_SHARES} OR NOT EXISTS (SELECT 1 FROM shown s WHERE s.tenant_id = {_TENANT}))"
        )
        return f"""{_COMMON}, page AS (
  SELECT p.*, g.grant_tenant FROM ({grants}) g JOIN pools p ON p.id = g.pool_id
  WHERE {_SEES} ORDER BY p.id LIMIT {_FIRST} + 1
), shown AS (SELECT * FROM page ORDER BY id LIMIT {_FIRST})
SELECT {_object(pairs)}::text
WHERE EXISTS (SELECT 1 FROM caller) AND EXISTS (SELECT 1 FROM lineage)
{unshared if declines else ""}"""
    pairs.append((shape.key, _pool(shape.fields)))
    unshared = f"AND ({_SHARES} OR p.tenant_id <> {_TENANT})"
    return f"""{_COMMON}, target AS (
  SELECT p.*, g.grant_tenant FROM pools p CROSS JOIN LATERAL ({_GRANT}) g
  WHERE p.id = {_ARG} AND {_SEES}
)
SELECT {_object(pairs)}::text FROM target p WHERE EXISTS (SELECT 1 FROM caller)
{unshared if declines else ""}"""


def _all(fields: tuple[Field, ...]) -> list[Field]:
    """Every field, nested ones too."""
    found: list[Field] = []
    for f in fields:
        found.append(f)
        if isinstance(f, Rows | Nested):
            found += _all(f.fields)
    return found


def _needs(fields: tuple[Field, ...]) -> set[str]:
    """The kinds of rows the fields read, and `policy` if they show it."""
    found: set[str] = set()
    for f in _all(fields):
        if isinstance(f, Rows):
            found.add(f.kind)
        elif isinstance(f, Read) and f.value == "policy":
            found.add("policy")
    return found


def readable(data: Any, read: CompiledRead) -> Any:
    """The parsed answer with every policy as every surface shows it (readable_policy:
    no secret), found by the shape's keys."""
    if read.shows_policy:
        _mask(data[read.shape.key], read.shape.fields)
    return data


def _mask(value: Any, fields: tuple[Field, ...]) -> None:
    if isinstance(value, list):
        for item in value:
            _mask(item, fields)
        return
    if not isinstance(value, dict):
        return  # null
    for f in fields:
        if isinstance(f, Read) and f.value == "policy":
            value[f.key] = readable_policy(value[f.key])
        elif isinstance(f, Nested) and "policy" in _needs(f.fields):
            _mask(value[f.key], f.fields)


def eligible(principal: Principal, tenant_id: str, read: CompiledRead) -> bool:
    """Whether this statement's answer is the plain read's for this caller: acting for a
    tenant it may act for, with a role binding that is not narrowed (so every pool's
    decision is the role's), and a role holding every permission the shape reads."""
    if principal.conditions or not principal.has(POOLS_READ):
        return False
    if principal.tenant_id != tenant_id and not principal.is_fleet_admin:
        return False
    return not read.reads_capacity or principal.has(CAPACITY_READ)


async def fetch(db: Database, sql: str, params: tuple[object, ...]) -> str | None:
    """One round trip: on the direct pool (app/db/direct.py), prepared once per
    connection; else on a read connection of the engine, in a transaction behind
    PgBouncer (its statement timeout is SET LOCAL there, app/db/engine.py)."""
    if db.direct is not None:
        value = await db.direct.fetchval(sql, params)
        return value if isinstance(value, str) else None
    async with db.reader.connect() as conn:
        if db.pooled_by_transaction:
            value = (await conn.exec_driver_sql(sql, params)).scalar()
        else:
            raw = await conn.get_raw_connection()
            driver: Any = raw.driver_connection  # asyncpg's Connection
            with traced(sql):  # past SQLAlchemy's events: its span is ours
                value = await driver.fetchval(sql, *params)
    return value if isinstance(value, str) else None
