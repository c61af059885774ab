"""One table of fields per read type: the single place a field of the API is described.

Each row says, for one field: the domain's name (the read model's attribute, and the
value a shape reads: app/capacity/shapes.py), its GraphQL name, its REST/JSON key, its
kind and nullability (how it renders: one timestamp form, `timestamp` below), and the
SQLAlchemy column or expression the compiled read selects for it, or why the compiled
reads do not build it. Everything that used to keep its own list of names is derived from
these tables:

- the compiled JSON statement's columns (app/capacity/json_reads.py),
- the GraphQL plan's name mappings (schema/compiled_reads.py),
- the REST renderer and `get`'s compiled shape (app/rest/render.py),
- the OpenAPI component schemas (app/rest/openapi.py).

tests/capacity/test_fields.py holds the tables to the Strawberry types (every GraphQL
field is a row, names, kinds and nullability agree), to the models' columns, and checks
that every row marked compiled does compile: a forgotten entry fails a test instead of
sending a field's queries to the plain path in silence.

A leaf of the domain: it imports the models' tables and the input literals, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal, get_args

from sqlalchemy import String, bindparam, null
from sqlalchemy.sql.elements import BindParameter, ColumnElement
from sqlalchemy.sql.functions import FunctionElement

from app.capacity.inputs import Agent, PoolClass, Sharing
from app.capacity.shapes import RowsKind
from app.db.dialect_sql import per_dialect
from app.db.models import CapacityRow, Offer, Pool, QuotaRow, Reservation

# --- how values render ------------------------------------------------------------------

Kind = Literal[
    "id",  # a string id (GraphQL ID)
    "string",
    "int",  # GraphQL Int
    "long",  # GraphQL Long: quota and capacity amounts
    "float",
    "bool",
    "timestamp",  # `timestamp` below, on every surface
    "json",  # a JSON object (GraphQL JSON)
    "enum",  # a GraphQL enum; REST shows the stored strings (`values`)
    "amounts",  # {resource: amount}: REST a JSON object, GraphQL a list of ResourceAmount
    "labels",  # {key: value} of strings: REST a JSON object of strings, GraphQL JSON
]


def timestamp(value: datetime | None) -> str | None:
    """The one form of a point in time, on REST, GraphQL (schema/scalars.py) and in the
    compiled statement (`IsoTimestamp`): ISO 8601 in UTC with a trailing Z, microseconds
    only when there are some (`2026-05-01T12:00:00Z`, `2026-05-01T12:00:00.123456Z`).
    `value` is in UTC, as every stored time reads back; it is not converted."""
    return None if value is None else value.isoformat().replace("+00:00", "Z")


class IsoTimestamp(FunctionElement[str]):
    """`timestamp` of a column, computed by the database (the compiled reads)."""

    name = "iso_timestamp"
    inherit_cache = True
    type = String()


# SQLAlchemy stores a time on SQLite as 'YYYY-MM-DD HH:MM:SS.ffffff' (a row written with
# CURRENT_TIMESTAMP has no fraction): shown with its fraction unless it is zero.
_UTC = "({0} AT TIME ZONE 'UTC')"
per_dialect(
    IsoTimestamp,
    postgresql=(
        f"(to_char({_UTC}, 'YYYY-MM-DD\"T\"HH24:MI:SS') || CASE WHEN "
        f"extract(microseconds FROM {_UTC})::bigint % 1000000 = 0 THEN '' "
        f"ELSE to_char({_UTC}, '.US') END || 'Z')"
    ),
    sqlite=(
        "(substr({0}, 1, 10) || 'T' || substr({0}, 12, 8) || CASE WHEN "
        "substr({0}, 20) IN ('', '.000000') THEN '' ELSE substr({0}, 20, 7) END || 'Z')"
    ),
)


# The acting tenant of a compiled read: the builder binds it to its statement's parameter.
ACTING_TENANT: BindParameter[str] = bindparam("acting_tenant", type_=String)

# --- the rows of a table ----------------------------------------------------------------

# Built by the compiled statement itself, not read from a column: a page's pageInfo.
STATEMENT: Literal["statement"] = "statement"


@dataclass(frozen=True, slots=True)
class Value:
    """A leaf field.

    `name`: the read model's attribute (views.py) and the value a shape's Read names.
    `graphql` / `rest`: its name on each surface, None where the surface does not show it.
    `column`: what the compiled read selects (over the model's table; the builder aliases
    it), STATEMENT when the statement builds it, None with `uncompiled` saying why not.
    `optional`: why the REST key may be absent (else it is always there: required).
    `rest_nullable`: REST's nullability where it differs from GraphQL's (a key REST
    leaves out rather than shows null).
    `values`: the stored strings of an enum (or of a string with a closed set on REST)."""

    name: str
    graphql: str | None
    rest: str | None
    kind: Kind
    nullable: bool = False
    column: ColumnElement[Any] | Literal["statement"] | None = None
    uncompiled: str | None = None
    optional: str | None = None
    rest_nullable: bool | None = None
    values: tuple[str, ...] = ()

    @property
    def compiled(self) -> bool:
        return self.column is not None

    @property
    def selected(self) -> ColumnElement[Any]:
        """The expression the compiled read selects: the column, rendered as every
        surface renders the kind (a timestamp as `timestamp`)."""
        if not isinstance(self.column, ColumnElement):
            raise ValueError(f"{self.name} is not read from a column")
        return IsoTimestamp(self.column) if self.kind == "timestamp" else self.column

    @property
    def json_nullable(self) -> bool:
        return self.nullable if self.rest_nullable is None else self.rest_nullable


@dataclass(frozen=True, slots=True)
class Relation:
    """A field that holds rows of another table (`of`, a GraphQL type name), a list when
    `many`.

    `rows`: the compiled builder's kind of rows for it (json_reads: which rows under which
    rule; for one object, `many` False, the kind of that object), None with `uncompiled`
    saying why not. `order`: the order of a list's rows, the
    one both reads sort by (reads.py's loaders per pool, json_reads' JsonArray).
    `rest_keeps`: the optional REST keys of the rows that REST shows here (a pool's own
    quota rows show their `grant`; an offer's rows do not)."""

    name: str
    graphql: str | None
    rest: str | None
    of: str
    many: bool = True
    nullable: bool = False
    rows: RowsKind | Literal["grant", "binding", "denial"] | None = None
    uncompiled: str | None = None
    optional: str | None = None
    rest_keeps: tuple[str, ...] = ()
    order: tuple[ColumnElement[Any], ...] = ()

    @property
    def compiled(self) -> bool:
        return self.rows is not None


Entry = Value | Relation


@dataclass(frozen=True, slots=True)
class Table:
    """The fields of one type, in REST's key order (GraphQL's order is its type's)."""

    graphql: str  # the GraphQL object type
    rest: str | None  # the OpenAPI component, None when REST has none
    entries: tuple[Entry, ...]

    def entry(self, name: str) -> Entry:
        for e in self.entries:
            if e.name == name:
                return e
        raise KeyError(name)

    def relation(self, name: str) -> Relation:
        entry = self.entry(name)
        if not isinstance(entry, Relation):
            raise KeyError(name)
        return entry

    @property
    def by_graphql(self) -> dict[str, Entry]:
        return {e.graphql: e for e in self.entries if e.graphql is not None}

    @property
    def rest_entries(self) -> tuple[Entry, ...]:
        return tuple(e for e in self.entries if e.rest is not None)


def _c(model: Any, key: str) -> ColumnElement[Any]:
    column: ColumnElement[Any] = model.__table__.c[key]
    return column


# A pool's quota rows, and an offer's, come in resource order; so do its capacity rows.
QUOTA_ORDER = (_c(QuotaRow, "resource"),)
CAPACITY_ORDER = (_c(CapacityRow, "resource"),)
# A tenant's reservations come in id (creation) order, on every read of them (REST
# `reservations/list`, GraphQL `Pool.reservations`), paged by that id (read_rules).
RESERVATION_ORDER = (_c(Reservation, "id"),)

POOL = Table(
    "Pool",
    "Pool",
    (
        Value("id", "id", "id", "id", column=_c(Pool, "id")),
        Value(
            "viewer_tenant_id",
            "viewerTenantId",
            None,
            "string",
            uncompiled="the acting tenant of the request, not a column: not compiled yet",
        ),
        Value("tenant_id", "tenantId", "tenantId", "string", column=_c(Pool, "tenant_id")),
        Value("site_id", "siteId", "siteId", "id", column=_c(Pool, "site_id")),
        Value(
            "pool_class",
            "class",
            "class",
            "enum",
            column=_c(Pool, "pool_class"),
            values=get_args(PoolClass),
        ),
        Value("gpu_model", "gpuModel", "gpuModel", "string", True, _c(Pool, "gpu_model")),
        Value(
            "sharing",
            "sharing",
            "sharing",
            "enum",
            column=_c(Pool, "sharing"),
            values=get_args(Sharing),
        ),
        Value("agent", "agent", "agent", "enum", column=_c(Pool, "agent"), values=get_args(Agent)),
        # Stored as is; every surface shows it through policy.readable_policy (no secret):
        # the compiled read masks it once parsed (json_reads.readable).
        Value("policy", "policy", "policy", "json", column=_c(Pool, "policy")),
        Value(
            "provider_account_id",
            "providerAccountId",
            "providerAccountId",
            "id",
            True,
            _c(Pool, "provider_account_id"),
        ),
        Value("region", "region", "region", "string", column=_c(Pool, "region")),
        Value(
            "display_name", "displayName", "displayName", "string", True, _c(Pool, "display_name")
        ),
        Value("labels", "labels", "labels", "labels", column=_c(Pool, "labels")),
        Value("owned", "owned", "owned", "bool", column=_c(Pool, "tenant_id") == ACTING_TENANT),
        Value("archived", "archived", "archived", "bool", column=_c(Pool, "archived")),
        Value("version", "version", "version", "int", column=_c(Pool, "version")),
        Relation(
            "quotas",
            "quotas",
            "quotas",
            "Quota",
            rows="quotas",
            rest_keeps=("grant",),
            order=QUOTA_ORDER,
        ),
        Relation(
            "capacity",
            "capacity",
            None,
            "CapacityRow",
            nullable=True,
            rows="capacity",
            order=CAPACITY_ORDER,
        ),
        Relation(
            "offers",
            "offers",
            "offers",
            "Offer",
            nullable=True,
            rows="offers",
            order=(_c(Offer, "created_at"), _c(Offer, "tenant_id")),
        ),
        Relation(
            "lending",
            "lending",
            None,
            "GuestLending",
            nullable=True,
            uncompiled="the owner's offers to guests, each with its rows: not compiled yet",
        ),
        Relation(
            "reservations",
            "reservations",
            None,
            "ReservationConnection",
            many=False,
            rows="reservations",  # a page per pool (json_reads._paged)
            order=RESERVATION_ORDER,
        ),
        Value("created_at", "createdAt", "createdAt", "timestamp", column=_c(Pool, "created_at")),
        Value("updated_at", "updatedAt", "updatedAt", "timestamp", column=_c(Pool, "updated_at")),
    ),
)

QUOTA = Table(
    "Quota",
    "Quota",
    (
        Value("pool_id", "poolId", None, "id", column=_c(QuotaRow, "pool_id")),
        Value("resource", "resource", "resource", "string", column=_c(QuotaRow, "resource")),
        Value("max", "max", "max", "long", column=_c(QuotaRow, "max")),
        Value("used", "used", "used", "long", column=_c(QuotaRow, "used")),
        Relation(
            "grant",
            "grant",
            "grant",
            "Grant",
            many=False,
            nullable=True,
            rows="grant",
            optional="on the rows the tenant books against; absent on an offer's rows "
            "(owner's view)",
        ),
    ),
)

# An offer's terms, shown on an Offer and on the Grant that quota rows carry.
_OFFER_TERMS = (
    Value("tenant_id", "tenantId", "tenantId", "string", column=_c(Offer, "tenant_id")),
    Value(
        "include_descendants",
        "includeDescendants",
        "includeDescendants",
        "bool",
        column=_c(Offer, "include_descendants"),
    ),
    Value("priority", "priority", "priority", "int", column=_c(Offer, "priority")),
)

# The offer that gives a quota row (on quota rows) or lets a tenant see a pool (`access`).
GRANT = Table(
    "Grant",
    "Grant",
    (
        Value(
            "via",
            "via",
            "via",
            "string",
            True,
            null(),  # on quota rows; `access` says it
            optional="on `access` only",
            rest_nullable=False,
            values=("owner", "offer", "ancestorOffer"),
        ),
        *_OFFER_TERMS,
        Value("offered_at", "offeredAt", "offeredAt", "timestamp", True, _c(Offer, "created_at")),
    ),
)

_LENDER = "the lender's view: present for the owner with compute:pools:share only"

CAPACITY = Table(
    "CapacityRow",
    "CapacityRow",
    (
        Value("resource", "resource", "resource", "string", column=_c(CapacityRow, "resource")),
        Value("total", "total", "total", "long", column=_c(CapacityRow, "total")),
        Value(
            "allocatable",
            "allocatable",
            "allocatable",
            "long",
            column=_c(CapacityRow, "allocatable"),
        ),
        Value("booked", "booked", "booked", "long", column=_c(CapacityRow, "booked")),
        Value(
            "available",
            "available",
            "available",
            "long",
            column=_c(CapacityRow, "allocatable") - _c(CapacityRow, "booked"),
        ),
        Value(
            "offered",
            "offered",
            "offered",
            "long",
            True,
            column=STATEMENT,  # the guests' rows summed (read_rules.capacity_lent)
            optional=_LENDER,
            rest_nullable=False,
        ),
        Value(
            "guest_used",
            "guestUsed",
            "guestUsed",
            "long",
            True,
            column=STATEMENT,  # the guests' rows summed (read_rules.capacity_lent)
            optional=_LENDER,
            rest_nullable=False,
        ),
        Value(
            "overcommit",
            "overcommit",
            "overcommit",
            "float",
            True,
            column=STATEMENT,  # the guests' rows summed (read_rules.capacity_lent)
            optional=_LENDER,
        ),
    ),
)

# A capacity row of the owner's fleet, ranked by what it lent (`lending`): the pool, and
# the row with the lender's values, always shown here (the read is the owner's with
# compute:pools:share). REST's component (openapi.py: LendingRow) is CapacityRow's.
LENDING_ROW = Table(
    "LendingRow",
    None,
    (
        Value("pool_id", "poolId", "poolId", "id", column=_c(CapacityRow, "pool_id")),
        *(
            replace(e, nullable=e.kind == "float", optional=None, rest_nullable=None)
            if isinstance(e, Value) and e.optional is not None
            else e
            for e in CAPACITY.entries
        ),
    ),
)

# `access` (REST `pools/explain`): why the caller holds a permission on a pool. Decided in
# Python by the rule the plain read decides it with (explain.explanation), over the facts
# one statement reads (json_reads' access statement): its values are the statement's.
_EXPLAINED = "the explanation, decided once the statement's facts are parsed (explain.py)"

ACCESS = Table(
    "Access",
    "Access",
    (
        Value("allowed", "allowed", "allowed", "bool", column=STATEMENT),
        Value("permission", "permission", "permission", "string", column=STATEMENT),
        Relation("binding", "binding", "binding", "AccessBinding", many=False, rows="binding"),
        Relation(
            "grant",
            "grant",
            "grant",
            "Grant",
            many=False,
            nullable=True,
            rows="grant",
            rest_keeps=("via",),
        ),
        Relation(
            "denied_by",
            "deniedBy",
            "deniedBy",
            "AccessDenial",
            many=False,
            nullable=True,
            rows="denial",
            rest_keeps=("key",),
        ),
    ),
)

ACCESS_BINDING = Table(
    "AccessBinding",
    None,
    (
        Value("caller_id", "callerId", "callerId", "id", column=STATEMENT),
        Value("tenant_id", "tenantId", "tenantId", "string", column=STATEMENT),
        Value("role", "role", "role", "string", column=STATEMENT),
        Value("where", "where", "where", "labels", column=STATEMENT),
        Value("acting_for", "actingFor", "actingFor", "string", column=STATEMENT),
        Value("fleet_admin", "fleetAdmin", "fleetAdmin", "bool", column=STATEMENT),
    ),
)

ACCESS_DENIAL = Table(
    "AccessDenial",
    None,
    (
        Value(
            "check",
            "check",
            "check",
            "string",
            column=STATEMENT,
            values=("owner", "role", "where"),
        ),
        Value("message", "message", "message", "string", column=STATEMENT),
        Value(
            "key",
            "key",
            "key",
            "string",
            True,
            column=STATEMENT,
            optional="the binding condition of a `where` denial; absent otherwise",
            rest_nullable=False,
        ),
    ),
)

OFFER = Table(
    "Offer",
    "Offer",
    (
        Value(
            "id",
            "id",
            None,
            "id",
            uncompiled="the node id, offer_node_id(pool, tenant): not compiled yet",
        ),
        *_OFFER_TERMS,
        Relation("quotas", "quotas", "quotas", "Quota", rows="offer_quotas", order=QUOTA_ORDER),
    ),
)

RESERVATION = Table(
    "Reservation",
    "Reservation",
    (
        Value("id", "id", "id", "id", column=_c(Reservation, "id")),
        Value("pool_id", "poolId", "poolId", "id", column=_c(Reservation, "pool_id")),
        Value("tenant_id", "tenantId", "tenantId", "string", column=_c(Reservation, "tenant_id")),
        # Stored as {resource: amount}: REST shows the object, GraphQL a list of
        # ResourceAmount in the stored object's order (json_reads._amounts).
        Value(
            "resources", "resources", "resources", "amounts", column=_c(Reservation, "resources")
        ),
        Value(
            "state",
            "state",
            "state",
            "enum",
            column=_c(Reservation, "state"),
            values=("active", "ended"),
        ),
        Value(
            "created_at",
            "createdAt",
            "createdAt",
            "timestamp",
            column=_c(Reservation, "created_at"),
        ),
        Value("ended_at", "endedAt", "endedAt", "timestamp", True, _c(Reservation, "ended_at")),
    ),
)

# A page's pageInfo: the page statement builds each value (json_reads._page_info; the
# cursors as ids, encoded once parsed).
PAGE_INFO = Table(
    "PageInfo",
    None,
    (
        Value("has_next_page", "hasNextPage", None, "bool", column=STATEMENT),
        Value("has_previous_page", "hasPreviousPage", None, "bool", column=STATEMENT),
        Value("start_cursor", "startCursor", None, "string", True, STATEMENT),
        Value("end_cursor", "endCursor", None, "string", True, STATEMENT),
    ),
)

TABLES: dict[str, Table] = {
    t.graphql: t
    for t in (
        POOL,
        QUOTA,
        GRANT,
        CAPACITY,
        LENDING_ROW,
        OFFER,
        RESERVATION,
        PAGE_INFO,
        ACCESS,
        ACCESS_BINDING,
        ACCESS_DENIAL,
    )
}

# The compiled builder's kinds of objects (json_reads), each with its table: a pool, and
# the rows each compiled relation holds.
ROW_TABLES: dict[str, Table] = {"pool": POOL}
for _table in tuple(TABLES.values()):
    for _entry in _table.entries:
        if isinstance(_entry, Relation) and _entry.rows is not None and _entry.of in TABLES:
            ROW_TABLES[_entry.rows] = TABLES[_entry.of]
ROW_TABLES["lending"] = LENDING_ROW  # a root's rows, no relation's
ROW_TABLES["access"] = ACCESS  # a root's object, no relation's
# A connection's nodes (`Pool.reservations`), and REST `reservations/list`'s rows.
ROW_TABLES["reservations"] = RESERVATION


def graphql_values(kind: str) -> dict[str, str]:
    """GraphQL name -> value name, of the compiled leaf fields of `kind`'s rows."""
    return {
        e.graphql: e.name
        for e in ROW_TABLES[kind].entries
        if isinstance(e, Value) and e.graphql is not None and e.compiled
    }


def graphql_relations(kind: str) -> dict[str, Relation]:
    """GraphQL name -> relation, of the compiled relations of `kind`'s rows."""
    return {
        e.graphql: e
        for e in ROW_TABLES[kind].entries
        if isinstance(e, Relation) and e.graphql is not None and e.compiled
    }
