"""Reads answered by one statement that returns the whole answer as JSON, on both dialects.

A shape (app/capacity/shapes.py) is built once into one SQLAlchemy Core statement from the
read rules (app/capacity/read_rules.py: the tenant's lineage, the authz row that grants
each pool, archived pools for their owner only, the quota rows the tenant books against
with the offer that gives each, offers for the owner with compute:pools:share) and the
table of fields (app/capacity/fields.py: each value's column, each list's order), and
compiled once per dialect (the few pieces the dialects write differently are
app/capacity/json_sql.py's). A check that the caller's token is still live and its role
binding unchanged is inside the statement too. Per request only the parameters are bound;
on PostgreSQL asyncpg reuses the prepared statement, so a read is one round trip.

The statement answers only what it is sure of; it returns NULL whenever the plain read
might answer otherwise (a revoked or rebound token, an unknown tenant, a pool the tenant
cannot see), and the caller then takes the plain path, which gives the exact error.
Callers with narrowed role bindings, and shapes that need per-pool IAM beyond
compute:pools:read and compute:capacity:read, never come here (see `eligible`).

Where the answer shows cursors, the statement selects ids on PostgreSQL, encoded
(paging.encode_cursor) once the answer is parsed, as policies are masked (`readable`);
on SQLite it encodes them itself (json_sql.JsonCursor), and an answer with nothing left
to finish is handed to the transport unparsed (`answer`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import (
    CTE,
    Boolean,
    Column,
    ColumnElement,
    FromClause,
    Integer,
    Select,
    String,
    Text,
    and_,
    bindparam,
    case,
    cast,
    exists,
    func,
    literal_column,
    not_,
    null,
    or_,
    select,
)
from sqlalchemy.sql.util import ClauseAdapter
from sqlalchemy.sql.visitors import ExternallyTraversible, iterate, replacement_traverse

from app.capacity.fields import ACTING_TENANT, ROW_TABLES, IsoTimestamp, Relation, Value
from app.capacity.inputs import (
    MAX_AMOUNT,
    CapacityInput,
    ExplainAccessInput,
    GetPoolInput,
    LendingInput,
    ListPoolsInput,
    ListQuotasInput,
    ListReservationsInput,
    MethodInput,
)
from app.capacity.json_sql import (
    ENCODES_CURSORS,
    JsonArray,
    JsonBool,
    JsonCursor,
    JsonEntries,
    JsonNested,
    JsonObject,
    Statement,
    compile_statement,
    json_object,
    rows_from,
    sql_literal,
)
from app.capacity.paging import encode_cursor
from app.capacity.policy import readable_policy
from app.capacity.read_rules import (
    ReservationsPage,
    booked_quotas,
    capacity_lent,
    granting,
    lending_order,
    lineage_cte,
    nearest_grants,
    offers_shown,
    own_reservations,
    pool_seen_by,
    quota_offer,
    quotas_with_offers,
    reservations_after,
    row_lent,
    token_live,
)
from app.capacity.shapes import (
    AccessShape,
    CapacityShape,
    Constant,
    Field,
    LendingShape,
    ListShape,
    Nested,
    Paged,
    PageShape,
    PoolShape,
    QuotasShape,
    Read,
    ReservationsShape,
    Rows,
    Shape,
)
from app.capacity.views import overcommit
from app.db.direct import traced
from app.db.engine import Database
from app.db.models import AuthzRow, CapacityRow, Offer, Pool, QuotaRow, Reservation
from app.iam.principal import Principal
from app.iam.roles import CAPACITY_READ, POOLS_READ, POOLS_SHARE, RESERVATIONS_READ
from app.metrics import statement_sent

# json_build_object takes at most 100 arguments: 50 keys (SQLite's json_object, 63).
MAX_KEYS = 50

# The statement's parameters, bound per request by name (`CompiledRead.params`): the
# acting tenant (the table of fields' own: `owned` reads it), the caller's token hash and
# role, whether the role shares (compute:pools:share); then a page's `after` and `first`,
# or a pool's id.
_TENANT = ACTING_TENANT
_TOKEN = bindparam("token", type_=String)
_ROLE = bindparam("role", type_=String)
_SHARES = bindparam("shares", type_=Boolean)
_AFTER = bindparam("after", type_=String)
_FIRST = bindparam("first", type_=Integer)
_POOL_ID = bindparam("pool_id", type_=String)
_ONE = literal_column("1", Integer)

# What reads a cursor (an edge's, pageInfo's): the statement selects the id.
_CURSORS = frozenset({"cursor", "start_cursor", "end_cursor"})


class Unsupported(Exception):
    """The shape asks for something this statement does not build."""


# The values of each kind of object (a pool, and the rows of each compiled relation):
# the table of fields' rows that select a column or an expression.
_COLUMNS: dict[str, dict[str, Value]] = {
    kind: {
        e.name: e
        for e in table.entries
        if isinstance(e, Value) and isinstance(e.column, ColumnElement)
    }
    for kind, table in ROW_TABLES.items()
}
# Each list's order: the one the plain read sorts by (the table of fields' `order`).
_ROW_ORDER: dict[str, tuple[ColumnElement[Any], ...]] = {
    e.rows: e.order
    for table in ROW_TABLES.values()
    for e in table.entries
    if isinstance(e, Relation) and e.rows not in (None, "grant")
}


def _over(expr: ColumnElement[Any], row: CTE) -> ColumnElement[Any]:
    """A pool's expression over the statement's pool row (`row`: the pools' columns and
    `grant_tenant`) instead of the pools' table."""

    def swap(element: ExternallyTraversible, **_: Any) -> ExternallyTraversible | None:
        if isinstance(element, Column) and element.table is Pool.__table__:
            return row.c[element.key]
        return None

    swapped: ColumnElement[Any] = replacement_traverse(expr, {}, swap)
    return swapped


# The rows of each list of the pool `row` (or of the offer being built): the quota rows
# of the tenant whose grant lets the actor see the pool, with the offer that gives each;
# the rollup; the offers; an offer's own rows.
_ROW_SOURCES: dict[str, Callable[[CTE], Select[Any]]] = {
    "quotas": lambda row: rows_from(quotas_with_offers()).where(
        booked_quotas(row.c.id, row.c.grant_tenant)
    ),
    # Quota rows whose values read nothing of their offer: the same rows (at most one
    # offer gives a row), without the join (about a seventh of a dashboard page's
    # statement on SQLite).
    "quotas_alone": lambda row: rows_from(QuotaRow.__table__).where(
        booked_quotas(row.c.id, row.c.grant_tenant)
    ),
    "capacity": lambda row: rows_from(CapacityRow.__table__).where(CapacityRow.pool_id == row.c.id),
    "offers": lambda row: rows_from(Offer.__table__).where(Offer.pool_id == row.c.id),
    "offer_quotas": lambda _row: rows_from(QuotaRow.__table__).where(quota_offer()),
}


# What each kind of row may nest.
_NESTS = {"pool": {"quotas", "capacity", "offers"}, "offers": {"offer_quotas"}}


def _object(pairs: list[tuple[str, ColumnElement[Any]]]) -> JsonObject:
    if len(pairs) > MAX_KEYS:
        raise Unsupported(f"more than {MAX_KEYS} keys in one object")
    return json_object(pairs)


def _json(entry: Value, expr: ColumnElement[Any]) -> ColumnElement[Any]:
    """A value as JSON of its kind: a boolean as true/false, a JSON column nested."""
    if entry.kind == "bool":
        return JsonBool(expr)
    if entry.kind in ("json", "labels", "amounts"):
        return JsonNested(expr)
    return expr


def _value(field: Read, kind: str, row: CTE, lent: FromClause | None) -> ColumnElement[Any]:
    if kind in ("capacity", "lending") and field.value in _LENT and field.mapping is None:
        return _lent(field.value, kind, row, lent)
    entry = _COLUMNS[kind].get(field.value)
    if entry is None:
        raise Unsupported(f"{field.value} here")
    expr = _over(entry.selected, row) if kind == "pool" else entry.selected
    if lent is not None:  # a capacity row's columns, as `lent` selects them
        expr = ClauseAdapter(lent).traverse(expr)
    if field.mapping is not None:
        expr = case(*((sql_literal(a), sql_literal(b)) for a, b in field.mapping), value=expr)
    return _json(entry, expr)


def _reads_offer(expr: ColumnElement[Any]) -> bool:
    """Whether `expr` reads a column of the offers' table."""
    offers = Offer.__table__
    return any(isinstance(e, Column) and e.table is offers for e in iterate(expr))


def _rows(field: Rows, row: CTE) -> ColumnElement[Any]:
    item = _fields(field.kind, field.fields, row)
    source: str = field.kind
    if source == "quotas" and not _reads_offer(item):
        source = "quotas_alone"
    rows: ColumnElement[Any] = JsonArray(item, _ROW_SOURCES[source](row), _ROW_ORDER[field.kind])
    if field.kind == "offers":
        # Only the owner has offers to show, and only with compute:pools:share.
        rows = JsonNested(case((offers_shown(row.c.tenant_id, _TENANT, _SHARES), rows)))
    return rows


def _fields(
    kind: str, fields: tuple[Field, ...], row: CTE, lent: FromClause | None = None
) -> JsonObject:
    """An object of `kind` with `fields`, in order, under their keys; `row` is the pool
    (the pool's own, or the one whose rows these are); `lent`, capacity rows with the
    lender's values (read_rules.capacity_lent) where these are."""
    pairs: list[tuple[str, ColumnElement[Any]]] = []
    for f in fields:
        if isinstance(f, Constant):
            pairs.append((f.key, sql_literal(f.value)))
        elif isinstance(f, Read):
            pairs.append((f.key, _value(f, kind, row, lent)))
        elif isinstance(f, Rows) and f.kind in _NESTS.get(kind, ()):
            pairs.append((f.key, _rows(f, row)))
        elif isinstance(f, Nested) and f.kind == "grant" and kind == "quotas":
            grant = _fields("grant", f.fields, row)
            pairs.append((f.key, JsonNested(case((Offer.tenant_id.is_not(None), grant)))))
        elif isinstance(f, Nested) and f.kind == "grant" and kind == "offer_quotas":
            pairs.append((f.key, null()))  # an offer's rows: the offer says it
        elif isinstance(f, Paged) and kind == "pool":
            pairs.append((f.key, _paged(f, row)))
        elif isinstance(f, Nested) and f.kind == "amounts" and kind == "reservations":
            pairs.append((f.key, _amounts(f.fields)))
        else:
            raise Unsupported(f"{f.key} here")
    return _object(pairs)


def _edge(fields: tuple[Field, ...], row: CTE) -> JsonObject:
    pairs: list[tuple[str, ColumnElement[Any]]] = []
    for f in fields:
        if isinstance(f, Read) and f.value == "cursor":
            pairs.append((f.key, JsonCursor(row.c.id)))
        elif isinstance(f, Nested) and f.kind == "node":
            pairs.append((f.key, _fields("pool", f.fields, row)))
        elif isinstance(f, Constant):
            pairs.append((f.key, sql_literal(f.value)))
        else:
            raise Unsupported(f"{f.key} on an edge")
    return _object(pairs)


def _page_info(page: CTE, shown: CTE) -> dict[str, ColumnElement[Any]]:
    """pageInfo's values over the page (`first` + 1 rows: one more says there is a next)
    and the rows shown; the cursors as JsonCursor."""
    return {
        "has_next_page": JsonBool(
            select(func.count()).select_from(page).scalar_subquery() > _FIRST
        ),
        "has_previous_page": JsonBool(_AFTER.is_not(None)),
        "start_cursor": JsonCursor(
            select(shown.c.id).order_by(shown.c.id).limit(_ONE).scalar_subquery()
        ),
        "end_cursor": JsonCursor(
            select(shown.c.id).order_by(shown.c.id.desc()).limit(_ONE).scalar_subquery()
        ),
    }


def _page_info_object(
    fields: tuple[Field, ...], values: dict[str, ColumnElement[Any]]
) -> JsonObject:
    """A connection's pageInfo from its selected fields and the page's values (a page of
    pools, a pool's page of reservations)."""
    info: list[tuple[str, ColumnElement[Any]]] = []
    for g in fields:
        if isinstance(g, Read) and g.value in values and g.mapping is None:
            info.append((g.key, values[g.value]))
        elif isinstance(g, Constant):
            info.append((g.key, sql_literal(g.value)))
        else:
            raise Unsupported(f"{g.key} on pageInfo")
    return _object(info)


def _page(fields: tuple[Field, ...], page: CTE, shown: CTE) -> JsonObject:
    info_values = _page_info(page, shown)
    pairs: list[tuple[str, ColumnElement[Any]]] = []
    for f in fields:
        if isinstance(f, Constant):
            pairs.append((f.key, sql_literal(f.value)))
        elif isinstance(f, Nested) and f.kind == "page_info":
            pairs.append((f.key, _page_info_object(f.fields, info_values)))
        elif isinstance(f, Nested) and f.kind in ("nodes", "edges"):
            item = _fields("pool", f.fields, shown) if f.kind == "nodes" else _edge(f.fields, shown)
            pairs.append((f.key, JsonArray(item, rows_from(shown), (shown.c.id,))))
        else:
            raise Unsupported(f"{f.key} on a page")
    return _object(pairs)


@dataclass(frozen=True, slots=True)
class CompiledRead:
    """A shape's statement for one dialect, its parameters bound by name (`params`).

    `input` is the catalog method's input (`list` or `get`, app/catalog.py): the
    arguments are validated by it, whole, as the plain read validates them, so input it
    refuses (an unknown field included) gets no answer here."""

    shape: Shape
    statement: Statement
    input: type[MethodInput]
    reads_capacity: bool
    shows_policy: bool  # masked once parsed (`readable`)
    shows_cursors: bool  # encoded once parsed (`readable`)
    # Nothing to finish, and every value one whose JSON SQLite writes as orjson does
    # (`answer`).
    verbatim: bool = False
    shows_lender: bool = False  # finished once parsed (`readable`)
    needs_share: bool = False  # decided with compute:pools:share on the tenant (`lending`)
    # Decided with compute:reservations:read (REST `reservations/list`, a pool's page).
    reads_reservations: bool = False
    # Holds a pool's page of reservations (`Paged`), its arguments beside the root's.
    pages: bool = False
    # What `readable` does to the parsed answer, worked out once from the shape's fields
    # (`_finishing`): empty when nothing is finished.
    finishing: tuple[_Step, ...] = ()

    @property
    def page(self) -> bool:
        return isinstance(self.shape, PageShape)

    @property
    def quotas(self) -> bool:
        """The tenant's quota rows (`quotas`): every pool, or one (`pool_id`)."""
        return isinstance(self.shape, QuotasShape)

    @property
    def lending(self) -> bool:
        """The owner's ranked capacity rows (`lending`): the first `first`."""
        return isinstance(self.shape, LendingShape)

    @property
    def access(self) -> bool:
        """Why the caller holds a permission on one pool (`access`): the statement reads
        the facts, explain.explanation decides once they are parsed."""
        return isinstance(self.shape, AccessShape)

    @property
    def reservations(self) -> bool:
        """The tenant's reservations (REST `reservations/list`): every pool's, or one's."""
        return isinstance(self.shape, ReservationsShape)

    @property
    def every(self) -> bool:
        """Every pool the tenant sees, unpaged (REST's `list`)."""
        return isinstance(self.shape, ListShape)

    @property
    def sql(self) -> str:
        return self.statement.sql

    def params(
        self,
        tenant_id: str,
        token_hash: str,
        role: str,
        shares: bool,
        **arguments: object,
    ) -> tuple[Any, ...]:
        """The positional parameters: the caller's, then a page's `after` and `first` or
        a pool's `pool_id`."""
        values = {
            _TENANT.key: tenant_id,
            _TOKEN.key: token_hash,
            _ROLE.key: role,
            _SHARES.key: shares,
            **arguments,
        }
        return self.statement.params(values)


def compile_read(
    shape: Shape, root: tuple[Constant, ...] = (), *, dialect: str
) -> CompiledRead | None:
    """The statement for `shape` under its key (with `root`'s constants beside it) on
    `dialect`, or None when it builds no such answer. Done once per shape and dialect
    (the transport's plan keeps it)."""
    try:
        statement = compile_statement(_statement(shape, root), dialect)
    except Unsupported:
        return None
    needs = _needs(shape.fields)
    # The statement's cursors: encoded in it (JsonCursor), or once parsed.
    cursors = "cursor" in needs and dialect not in ENCODES_CURSORS
    lending = isinstance(shape, LendingShape)
    pages = any(isinstance(f, Paged) for f in _all(shape.fields))
    verbatim = (
        dialect == "sqlite"
        and not cursors
        and not lending
        and not isinstance(shape, AccessShape)
        and not needs & {"policy", "lender"}
        and not any(isinstance(f, Read) and f.value in _NOT_VERBATIM for f in _all(shape.fields))
    )
    return CompiledRead(
        shape,
        statement,
        _INPUTS.get(type(shape), ListPoolsInput),
        "capacity" in needs or isinstance(shape, CapacityShape),
        "policy" in needs,
        cursors,
        verbatim,
        "lender" in needs,
        lending,
        isinstance(shape, ReservationsShape) or pages,
        pages,
        _finishing(
            shape.fields,
            cursors,
            "lender" in needs,
            isinstance(shape, CapacityShape) and shape.lender_keys_absent,
        ),
    )


# The values whose JSON SQLite may write otherwise than orjson: floats (`1.0e+20`), and
# JSON columns (kept as stored: spaces, number forms, duplicate keys).
_NOT_VERBATIM = frozenset(
    e.name
    for table in ROW_TABLES.values()
    for e in table.entries
    if isinstance(e, Value) and e.kind in ("float", "json", "labels", "amounts")
)


# Each read's method input (app/catalog.py), by shape; a page or a list is `list`'s.
_INPUTS: dict[type, type[MethodInput]] = {
    PoolShape: GetPoolInput,
    QuotasShape: ListQuotasInput,
    CapacityShape: CapacityInput,
    LendingShape: LendingInput,
    AccessShape: ExplainAccessInput,
    ReservationsShape: ListReservationsInput,
}


def _statement(shape: Shape, root: tuple[Constant, ...]) -> Select[Any]:
    pairs: list[tuple[str, ColumnElement[Any]]] = [(c.key, sql_literal(c.value)) for c in root]
    if isinstance(shape, QuotasShape):
        return _quotas_statement(shape, pairs)
    if isinstance(shape, CapacityShape):
        return _capacity_statement(shape, pairs)
    if isinstance(shape, LendingShape):
        return _lending_statement(shape, pairs)
    if isinstance(shape, AccessShape):
        return _access_statement(shape, pairs)
    if isinstance(shape, ReservationsShape):
        return _reservations_statement(shape, pairs)
    # An owner's caller without compute:pools:share asking for offers gets the plain
    # read's PERMISSION_DENIED on that field: answer nothing here.
    declines = any(
        isinstance(f, Rows) and f.kind == "offers" and f.if_denied == "decline"
        for f in _all(shape.fields)
    )
    lineage = lineage_cte(_TENANT, "lineage")
    pools = Pool.__table__
    live = token_live(_TOKEN, _ROLE)

    def granted(*where: ColumnElement[bool]) -> Select[Any]:
        return _granted(lineage, *where)

    if isinstance(shape, ListShape):
        every = granted().cte("every")
        pool = _fields("pool", shape.fields, every)
        pairs.append((shape.key, JsonArray(pool, rows_from(every), (every.c.id,))))
        statement = select(cast(_object(pairs), Text)).where(live, exists(select(lineage.c.id)))
        if declines:
            owned = exists(select(every.c.id).where(every.c.tenant_id == _TENANT))
            statement = statement.where(or_(_SHARES, not_(owned)))
        return statement
    if isinstance(shape, PageShape):
        after = or_(_AFTER.is_(None), AuthzRow.pool_id > _AFTER)
        page = granted(after).order_by(pools.c.id).limit(_FIRST + _ONE).cte("page")
        shown = select(page).order_by(page.c.id).limit(_FIRST).cte("shown")
        pairs.append((shape.key, _page(shape.fields, page, shown)))
        statement = select(cast(_object(pairs), Text)).where(live, exists(select(lineage.c.id)))
        if declines:
            owned = exists(select(shown.c.id).where(shown.c.tenant_id == _TENANT))
            statement = statement.where(or_(_SHARES, not_(owned)))
        return statement
    target = granted(AuthzRow.pool_id == _POOL_ID).cte("target")
    pairs.append((shape.key, _fields("pool", shape.fields, target)))
    statement = select(cast(_object(pairs), Text)).select_from(target).where(live)
    if declines:
        statement = statement.where(or_(_SHARES, target.c.tenant_id != _TENANT))
    return statement


def _granted(lineage: CTE, *where: ColumnElement[bool]) -> Select[Any]:
    """The pools the lineage sees (of the authz rows matching `where`), each with the
    tenant whose authz row grants it, archived ones for their owner only."""
    pools = Pool.__table__
    grants = nearest_grants(lineage, *where).subquery("grants")
    return (
        select(pools, grants.c.grant_tenant)
        .join(grants, grants.c.pool_id == pools.c.id)
        .where(pool_seen_by(_TENANT))
    )


# --- the tenant's quota rows (`quotas`), a pool's rollup (`capacity`), and the owner's
# --- capacity rows ranked by what it lent (`lending`) -----------------------------------

# The lender's values of a capacity row: read_rules.capacity_lent's sums, as the plain
# read reads them (app/capacity/lending.py); overcommit divided once parsed
# (views.overcommit, as the plain read's rows divide), over the rows shown.
_LENT = frozenset({"offered", "guest_used", "overcommit"})


class _Unsure(Exception):
    """The parsed answer is not one this path is sure of: the plain read answers."""


def _lent(value: str, kind: str, row: CTE, lent: FromClause | None) -> ColumnElement[Any]:
    """A lender's value of a capacity row: the sum (`offered`, `guest_used`), or for
    `overcommit` {"o": offered, "a": allocatable}. A `lending` row's are its own columns
    (`lent`: the ranked rows of read_rules.capacity_lent); a pool's capacity row's are
    read_rules.row_lent's, null for anyone but the pool's owner with compute:pools:share
    (read_rules.offers_shown)."""
    offered: ColumnElement[Any]
    allocatable: ColumnElement[Any]
    found: ColumnElement[Any]
    if kind == "lending":
        if lent is None:
            raise Unsupported(f"{value} here")
        offered, allocatable, found = lent.c.offered, lent.c.allocatable, lent.c[value]
    else:
        of_row = row_lent(row.c.tenant_id)

        def scalar(name: str) -> ColumnElement[Any]:
            return of_row.with_only_columns(of_row.selected_columns[name]).scalar_subquery()

        offered, allocatable = scalar("offered"), CapacityRow.__table__.c.allocatable
        found = offered if value == "offered" else scalar(value)
    if value == "overcommit":
        found = json_object([("o", offered), ("a", allocatable)])
    if kind == "lending":
        return found
    return JsonNested(case((offers_shown(row.c.tenant_id, _TENANT, _SHARES), found)))


def _amount(value: Any) -> int:
    """A sum as the statement gave it; past a Long (on SQLite past 2^63 a double), the
    plain read's to answer (GraphQL's Long refuses it there)."""
    if not isinstance(value, int) or value > MAX_AMOUNT:
        raise _Unsure
    return value


def _lender_value(value: dict[str, Any], field: Read, absent: bool) -> None:
    """A lender's value of a parsed capacity row, in place: a sum, or offered /
    allocatable (views.overcommit). Not shown: null, or no key at all where the surface
    leaves it out (`absent`: REST)."""
    lent = value[field.key]
    if lent is None:
        if absent:
            del value[field.key]
        return
    if field.value == "overcommit":
        value[field.key] = overcommit(_amount(lent["o"]), lent["a"])
    else:
        value[field.key] = _amount(lent)


def _lending_statement(
    shape: LendingShape, pairs: list[tuple[str, ColumnElement[Any]]]
) -> Select[Any]:
    """The capacity rows of the tenant's live pools whose offers the caller reads
    (read_rules.offers_shown: its own, with compute:pools:share) and its lineage is
    granted (read_rules.granting), with what they lent (read_rules.capacity_lent), ranked
    (read_rules.lending_order): the first `first`.

    The sums are taken over the owner's live pools, and the grant narrows the summed rows:
    a generic plan cannot know how many pools a lineage's grant walk finds (PostgreSQL
    guessed 38 of 1,000) and, given that set first, summed the rows by an index probe per
    capacity row and per quota row (2.5 times the floor's time); the pools' own columns
    it estimates from their statistics, and hashes."""
    lineage = lineage_cte(_TENANT, "lineage")
    pools = Pool.__table__
    owned = (
        select(pools.c.id, pools.c.tenant_id)
        .where(
            pools.c.archived.is_(False),
            pool_seen_by(_TENANT),
            offers_shown(pools.c.tenant_id, _TENANT, _SHARES),
        )
        .cte("owned")
    )
    lent = capacity_lent(_TENANT, CapacityRow.pool_id.in_(select(owned.c.id))).subquery("lent")
    granted = select(AuthzRow.pool_id).select_from(
        lineage.join(AuthzRow.__table__, granting(lineage))
    )
    ranked = (
        select(lent)
        .where(lent.c.pool_id.in_(granted))
        .order_by(*lending_order(lent))
        .limit(_FIRST)
        .subquery("ranked")
    )
    item = _fields("lending", shape.fields, owned, ranked)
    pairs.append((shape.key, JsonArray(item, rows_from(ranked), lending_order(ranked))))
    return select(cast(_object(pairs), Text)).where(
        token_live(_TOKEN, _ROLE), exists(select(lineage.c.id))
    )


def _quotas_statement(
    shape: QuotasShape, pairs: list[tuple[str, ColumnElement[Any]]]
) -> Select[Any]:
    """The rows the tenant books against in every pool it sees, or in one (`pool_id`:
    NULL when the tenant does not see it, for the plain read's NOT_FOUND), in pool and
    resource order."""
    lineage = lineage_cte(_TENANT, "lineage")
    every = _granted(lineage, or_(_POOL_ID.is_(None), AuthzRow.pool_id == _POOL_ID)).cte("every")
    item = _fields("quotas", shape.fields, every)
    source = quotas_with_offers() if _reads_offer(item) else QuotaRow.__table__
    rows = rows_from(every.join(source, booked_quotas(every.c.id, every.c.grant_tenant)))
    pairs.append((shape.key, JsonArray(item, rows, (every.c.id, *_ROW_ORDER["quotas"]))))
    return select(cast(_object(pairs), Text)).where(
        token_live(_TOKEN, _ROLE),
        exists(select(lineage.c.id)),
        or_(_POOL_ID.is_(None), exists(select(every.c.id))),
    )


def _capacity_statement(
    shape: CapacityShape, pairs: list[tuple[str, ColumnElement[Any]]]
) -> Select[Any]:
    """One pool's rollup rows, the pool as `get` finds it (NULL when not visible)."""
    lineage = lineage_cte(_TENANT, "lineage")
    target = _granted(lineage, AuthzRow.pool_id == _POOL_ID).cte("target")
    item = _fields("capacity", shape.fields, target)
    rows = JsonArray(item, _ROW_SOURCES["capacity"](target), _ROW_ORDER["capacity"])
    pairs.append((shape.key, rows))
    return select(cast(_object(pairs), Text)).select_from(target).where(token_live(_TOKEN, _ROLE))


# --- why the caller holds a permission on one pool (`access`) ---------------------------


def _access_statement(
    shape: AccessShape, pairs: list[tuple[str, ColumnElement[Any]]]
) -> Select[Any]:
    """The facts `access` is decided on, for one pool as `get` finds it (NULL when not
    visible, for the plain read's NOT_FOUND): its owner, the tenant whose authz row grants
    it (read_rules.nearest_grants), that row's attributes and that tenant's offer of the
    pool. explain.explained decides the answer once they are parsed, by the rule the
    plain read decides it with; the answer is then rendered by the shape (view_json)."""
    lineage = lineage_cte(_TENANT, "lineage")
    target = _granted(lineage, AuthzRow.pool_id == _POOL_ID).cte("target")
    authz, offer = AuthzRow.__table__.c, Offer.__table__.c
    terms = json_object(
        [
            ("d", JsonBool(offer.include_descendants)),
            ("p", offer.priority),
            ("at", IsoTimestamp(offer.created_at)),
        ]
    )
    facts = json_object(
        [
            ("owner", target.c.tenant_id),
            ("grant", target.c.grant_tenant),
            ("gpuModel", authz.gpu_model),
            ("class", authz.pool_class),
            ("sharing", authz.sharing),
            ("region", authz.region),
            ("owned", JsonBool(authz.owned)),
            ("offer", JsonNested(case((offer.tenant_id.is_not(None), terms)))),
        ]
    )
    granting = and_(authz.pool_id == target.c.id, authz.tenant_id == target.c.grant_tenant)
    held = and_(offer.pool_id == target.c.id, offer.tenant_id == target.c.grant_tenant)
    rows = target.join(AuthzRow.__table__, granting).outerjoin(Offer.__table__, held)
    pairs.append((shape.key, facts))
    return select(cast(_object(pairs), Text)).select_from(rows).where(token_live(_TOKEN, _ROLE))


# --- the tenant's reservations (REST `reservations/list`) -------------------------------


def _reservations_statement(
    shape: ReservationsShape, pairs: list[tuple[str, ColumnElement[Any]]]
) -> Select[Any]:
    """The tenant's own reservations (read_rules.own_reservations), in every pool or in
    one (`pool_id`: the pool as `get` finds it, NULL when the tenant does not see it, for
    the plain read's NOT_FOUND), in the table of fields' order."""
    lineage = lineage_cte(_TENANT, "lineage")
    target = _granted(lineage, AuthzRow.pool_id == _POOL_ID).cte("target")
    table = Reservation.__table__
    rows = rows_from(table).where(
        own_reservations(_TENANT), or_(_POOL_ID.is_(None), table.c.pool_id == _POOL_ID)
    )
    item = _fields("reservations", shape.fields, target)
    pairs.append((shape.key, JsonArray(item, rows, _ROW_ORDER["reservations"])))
    return select(cast(_object(pairs), Text)).where(
        token_live(_TOKEN, _ROLE),
        exists(select(lineage.c.id)),
        or_(_POOL_ID.is_(None), exists(select(target.c.id))),
    )


# --- a pool's page of the tenant's reservations (GraphQL `Pool.reservations`) -----------


def _amounts(fields: tuple[Field, ...]) -> ColumnElement[Any]:
    """A reservation's `resources` as GraphQL's list of ResourceAmount, in the stored
    object's order (the plain read's: reads.reservation_view keeps it)."""
    pairs: list[tuple[str, str]] = []
    for f in fields:
        if isinstance(f, Read) and f.value in ("resource", "amount") and f.mapping is None:
            pairs.append((f.key, "key" if f.value == "resource" else "value"))
        elif isinstance(f, Constant):
            pairs.append((f.key, f.value))
        else:
            raise Unsupported(f"{f.key} on an amount")
    return JsonEntries(Reservation.__table__.c.resources, pairs)


def _paged(field: Paged, row: CTE) -> JsonObject:
    """Pool `row`'s page of the acting tenant's reservations: those after `after` whose
    the first `first` (the field's own parameters; read_rules.ReservationsPage, found once
    per pool row), and whether one lies beyond for hasNextPage, as the plain read's
    reservations_pages pages them."""
    first = bindparam(f"{field.param}_first", type_=Integer)
    after = bindparam(f"{field.param}_after", type_=String)
    table = Reservation.__table__
    mine = (own_reservations(_TENANT), reservations_after(after), table.c.pool_id == row.c.id)
    page = ReservationsPage(row.c.id, _TENANT, after, first)
    shown = rows_from(table).where(*mine, page.shown())
    order = _ROW_ORDER["reservations"]
    ids = select(table.c.id).where(*mine, page.shown())
    info_values: dict[str, ColumnElement[Any]] = {
        "has_next_page": JsonBool(exists(select(table.c.id).where(*mine, page.beyond()))),
        "has_previous_page": JsonBool(after.is_not(None)),
        "start_cursor": JsonCursor(ids.order_by(*order).limit(_ONE).scalar_subquery()),
        "end_cursor": JsonCursor(
            ids.order_by(*(c.desc() for c in order)).limit(_ONE).scalar_subquery()
        ),
    }
    pairs: list[tuple[str, ColumnElement[Any]]] = []
    for f in field.fields:
        if isinstance(f, Constant):
            pairs.append((f.key, sql_literal(f.value)))
        elif isinstance(f, Nested) and f.kind == "page_info":
            pairs.append((f.key, _page_info_object(f.fields, info_values)))
        elif isinstance(f, Nested) and f.kind == "nodes":
            item = _fields("reservations", f.fields, row)
            pairs.append((f.key, JsonArray(item, shown, order)))
        elif isinstance(f, Nested) and f.kind == "edges":
            edge: list[tuple[str, ColumnElement[Any]]] = []
            for g in f.fields:
                if isinstance(g, Read) and g.value == "cursor":
                    edge.append((g.key, JsonCursor(table.c.id)))
                elif isinstance(g, Nested) and g.kind == "node":
                    edge.append((g.key, _fields("reservations", g.fields, row)))
                elif isinstance(g, Constant):
                    edge.append((g.key, sql_literal(g.value)))
                else:
                    raise Unsupported(f"{g.key} on an edge")
            pairs.append((f.key, JsonArray(_object(edge), shown, order)))
        else:
            raise Unsupported(f"{f.key} on a page of reservations")
    return _object(pairs)


def _all(fields: tuple[Field, ...]) -> list[Field]:
    """Every field, nested ones too."""
    found: list[Field] = []
    for f in fields:
        found.append(f)
        if isinstance(f, Rows | Nested | Paged):
            found += _all(f.fields)
    return found


def _needs(fields: tuple[Field, ...]) -> set[str]:
    """The kinds of rows the fields read, `policy` if they show it, `cursor` if they show
    a cursor."""
    found: set[str] = set()
    for f in _all(fields):
        if isinstance(f, Rows):
            found.add(f.kind)
        elif isinstance(f, Read) and f.value == "policy":
            found.add("policy")
        elif isinstance(f, Read) and f.value in _CURSORS:
            found.add("cursor")
        elif isinstance(f, Read) and f.value in _LENT:
            found.add("lender")
    return found


def answer(text: str, read: CompiledRead) -> Any:
    """The statement's answer as the transports encode it (orjson): the text itself
    (orjson.Fragment, not parsed) when it is the bytes orjson would write for it, else
    parsed and finished (`readable`; None as it says). SQLite's JSON is orjson's for a
    verbatim read (compact, keys in order, integers alike) as long as no string needed an
    escape: the two may escape a control character differently, so a backslash anywhere
    (only ever inside a string, in JSON) sends the answer through orjson."""
    if read.verbatim and "\\" not in text:
        return orjson.Fragment(text)
    return readable(orjson.loads(text), read)


def answer_under_key(text: str, read: CompiledRead) -> Any:
    """The value under the shape's key of an answer with no root constants beside it (a
    subscription event's `pool`, spliced into the event's rendering), as `answer` gives
    the whole: the text itself when it is orjson's, else parsed and finished; None when
    the plain read might answer otherwise. The statement writes `{"<key>":<value>}`."""
    head = "{" + orjson.dumps(read.shape.key).decode() + ":"
    if read.verbatim and "\\" not in text and text.startswith(head) and text.endswith("}"):
        return orjson.Fragment(text[len(head) : -1])
    data = readable(orjson.loads(text), read)
    return None if data is None else data[read.shape.key]


def readable(data: Any, read: CompiledRead) -> Any:
    """The parsed answer with every policy as every surface shows it (readable_policy:
    no secret), every cursor the statement left as an id encoded (paging.encode_cursor)
    and the lender's values finished (`_lender_value`), found by the shape's keys; None
    when the plain read might answer otherwise (a sum past a Long)."""
    if read.finishing:
        try:
            _finish(data[read.shape.key], read.finishing)
        except _Unsure:
            return None
    return data


# A step of finishing a parsed object: (its key, what is done there, the field, for a
# nested object or list the steps inside it).
_Step = tuple[str, str, "Read | None", tuple["_Step", ...]]


def _finishing(
    fields: tuple[Field, ...], cursors: bool, lender: bool, absent: bool = False
) -> tuple[_Step, ...]:
    """The steps `_finish` takes over an object of `fields`, in their order: each policy
    made readable, each cursor encoded (`cursors`: the statement left them as ids), each
    lender's value finished (`lender`; `absent`: a null one's key dropped, REST), and
    the nested objects and lists that hold any of these. Worked out once per compiled
    read, not per answer."""
    steps: list[_Step] = []
    for f in fields:
        if isinstance(f, Read) and f.value == "policy":
            steps.append((f.key, "policy", f, ()))
        elif isinstance(f, Read) and f.value in _CURSORS:
            if cursors:
                steps.append((f.key, "cursor", f, ()))
        elif lender and isinstance(f, Read) and f.value in _LENT:
            steps.append((f.key, "absent" if absent else "lender", f, ()))
        elif (
            isinstance(f, Nested | Paged) and _needs(f.fields) & {"policy", "cursor", "lender"}
        ) or (
            lender and isinstance(f, Rows) and f.kind == "capacity"  # a pool's rollup
        ):
            assert isinstance(f, Nested | Paged | Rows)
            inner = _finishing(f.fields, cursors, lender)
            if inner:
                steps.append((f.key, "nested", None, inner))
    return tuple(steps)


def _finish(value: Any, steps: tuple[_Step, ...]) -> None:
    if isinstance(value, list):
        for item in value:
            _finish(item, steps)
        return
    if not isinstance(value, dict):
        return  # null
    for key, what, f, inner in steps:
        if what == "policy":
            value[key] = readable_policy(value[key])
        elif what == "cursor":
            if value[key] is not None:
                value[key] = encode_cursor(value[key])
        elif what == "nested":
            _finish(value[key], inner)
        else:
            assert f is not None
            _lender_value(value, f, what == "absent")


def eligible(principal: Principal, tenant_id: str, read: CompiledRead) -> bool:
    """Whether this statement's answer is the plain read's for this caller: acting for a
    tenant it may act for, with a role binding that is not narrowed (so every pool's
    decision is the role's), and a role holding every permission the shape reads."""
    if principal.conditions or not principal.has(POOLS_READ):
        return False
    if principal.tenant_id != tenant_id and not principal.is_fleet_admin:
        return False
    if read.needs_share and not principal.has(POOLS_SHARE):
        return False
    if read.reads_reservations and not principal.has(RESERVATIONS_READ):
        return False
    return not read.reads_capacity or principal.has(CAPACITY_READ)


async def fetch(db: Database, sql: str, params: tuple[object, ...]) -> str | None:
    """One round trip: on PostgreSQL's direct pool (app/db/direct.py), prepared once per
    connection; on SQLite's direct connections (app/db/direct_sqlite.py), one hand-off to
    a connection's thread; else on a read connection of the engine: PostgreSQL's in a transaction
    behind PgBouncer (its statement timeout is SET LOCAL there, app/db/engine.py), or its
    asyncpg connection itself; SQLite's aiosqlite connection itself, outside a
    transaction (one SELECT reads one snapshot; a BEGIN would cost a round trip through
    aiosqlite's thread as long as the one-pool statement). Past SQLAlchemy's events, the
    statement is counted and traced here (app/db/direct.py's `traced`)."""
    if db.direct is not None:
        value = await db.direct.fetchval(sql, params)
        return value if isinstance(value, str) else None
    if db.sqlite_reads is not None:
        value = await db.sqlite_reads.fetchval(sql, params)
        return value if isinstance(value, str) else None
    async with db.reader.connect() as conn:
        if db.pooled_by_transaction:
            value = (await conn.exec_driver_sql(sql, params)).scalar()
        else:
            raw = await conn.get_raw_connection()
            driver: Any = raw.driver_connection  # asyncpg's, or aiosqlite's, Connection
            statement_sent()  # past SQLAlchemy's events: counted and traced here
            with traced(sql):
                if db.dialect == "sqlite":
                    rows = await driver.execute_fetchall(sql, params)
                    value = rows[0][0] if rows else None
                else:
                    value = await driver.fetchval(sql, *params)
    return value if isinstance(value, str) else None
