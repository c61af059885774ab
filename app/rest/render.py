"""Domain read models to the REST JSON shapes of CONTRACT section 4."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

from app.capacity.fields import (
    ACCESS,
    CAPACITY,
    GRANT,
    LENDING_ROW,
    OFFER,
    POOL,
    QUOTA,
    RESERVATION,
    TABLES,
    Entry,
    Relation,
    Table,
    Value,
    timestamp,
)
from app.capacity.paging import Page
from app.capacity.shapes import (
    AccessShape,
    CapacityShape,
    LendingShape,
    ListShape,
    Nested,
    PoolShape,
    Read,
    ReservationsShape,
    Rows,
)
from app.capacity.shapes import Field as ShapeField
from app.capacity.view_json import view_json
from app.capacity.views import (
    AccessExplanation,
    CapacityView,
    ImpactView,
    LendingRowView,
    PoolDetail,
    ReservationView,
)

# Each REST object is its table's keys (app/capacity/fields.py), in the table's order,
# each value read from the read model's attribute of the row's name and rendered as its
# kind renders; a relation's rows by their own table.
_Getter = Callable[[Any], Any]


def _keys(table: Table, keeps: tuple[str, ...] = ()) -> tuple[tuple[str, Entry], ...]:
    """The keys REST always shows of `table`, and the optional ones in `keeps`."""
    return tuple(
        (e.rest, e)
        for e in table.rest_entries
        if e.rest is not None and (e.optional is None or e.name in keeps)
    )


def _renderer(
    table: Table, keeps: tuple[str, ...] = (), values_at: str = ""
) -> Callable[[Any], dict[str, Any]]:
    """`table`'s JSON object of a read model: its values (read under `values_at`, the
    pool of a PoolDetail), and its relations' rows (each rendered as the relation's
    `rest_keeps` say). Built once as one dict display, as fast as a written one."""
    names: dict[str, Any] = {"_timestamp": timestamp}
    items: list[str] = []
    for i, (key, entry) in enumerate(_keys(table, keeps)):
        if isinstance(entry, Value):
            if not entry.name.isidentifier():
                raise ValueError(f"{table.graphql}.{entry.name}: not an attribute name")
            value = f"view.{values_at}{entry.name}"
            if entry.kind == "timestamp":
                value = f"_timestamp({value})"
        else:
            names[f"_rows{i}"] = _relation(entry)
            value = f"_rows{i}(view)"
        items.append(f"{key!r}: {value}")
    # Evaluated text made of the table's own names and keys only (checked above).
    render: Callable[[Any], dict[str, Any]] = eval("lambda view: {" + ", ".join(items) + "}", names)
    return render


def _relation(entry: Relation) -> _Getter:
    """A relation's rows as REST shows them: a list, an object, or null (rows its caller
    may not read: withheld, or nothing to show)."""
    get = attrgetter(entry.name)
    row = _renderer(TABLES[entry.of], entry.rest_keeps)
    if entry.many:
        return lambda view: (
            [row(item) for item in items] if isinstance(items := get(view), tuple | list) else None
        )
    return lambda view: None if (item := get(view)) is None else row(item)


quota_json = _renderer(QUOTA)
"""An offer's row in the owner's `offers`: no grant, the offer beside it says it."""
own_quota_json = _renderer(QUOTA, POOL.relation("quotas").rest_keeps)
"""A row the viewing tenant books against, with the offer that gives it."""
offer_json = _renderer(OFFER)
grant_json = _renderer(GRANT)
reservation_json = _renderer(RESERVATION)
_capacity_json = _renderer(CAPACITY)
_LENDER_KEYS = tuple(e.name for e in CAPACITY.entries if e.optional)
_lender_json = _renderer(CAPACITY, _LENDER_KEYS)


def capacity_json(c: CapacityView) -> dict[str, Any]:
    # The lender's view (offered...): the owner with share only.
    return _capacity_json(c) if c.offered is None else _lender_json(c)


lending_json: Callable[[LendingRowView], dict[str, Any]] = _renderer(LENDING_ROW)
"""A row of the owner's fleet: its pool, then the capacity row with the lender's values."""


pool_json: Callable[[PoolDetail], dict[str, Any]] = _renderer(POOL, values_at="pool.")
"""A PoolDetail: the pool's values from its view, its quota rows and offers from the
detail (the parts the read asked for). Offers withheld (no compute:pools:share) or not the
owner's: null, as CONTRACT 4 shows it."""


def _shape(table: Table, keeps: tuple[str, ...] = ()) -> tuple[ShapeField, ...]:
    """`table`'s REST object as a shape, the compiled read's description of it."""
    fields: list[ShapeField] = []
    for key, entry in _keys(table, keeps):
        if isinstance(entry, Value):
            fields.append(Read(key, entry.name))
            continue
        if entry.rows is None:
            raise ValueError(f"{table.graphql}.{entry.name} is not compiled")
        inside = _shape(TABLES[entry.of], entry.rest_keeps)
        if entry.rows == "grant":
            fields.append(Nested(key, "grant", inside))
        elif entry.rows == "binding" or entry.rows == "denial":
            fields.append(Nested(key, entry.rows, inside))
        else:
            # A list its caller may not read shows null on REST (`offers`).
            if entry.nullable:
                fields.append(Rows(key, entry.rows, inside, if_denied="null"))
            else:
                fields.append(Rows(key, entry.rows, inside))
    return tuple(fields)


# `get`'s answer, {"pool": pool_json(...)}, as a shape derived from the same table: the
# compiled read builds it in one statement (app/capacity/json_reads.py).
# tests/rest/test_compiled_get.py holds the two to the same bytes.
GET_SHAPE = PoolShape("pool", _shape(POOL))
# `list`'s answer, {"pools": [pool_json(...), ...]}: every pool, each as `get` shows it.
LIST_SHAPE = ListShape("pools", GET_SHAPE.fields)
# `capacity`'s answer, {"capacity": [capacity_json(...), ...]}: the lender's keys for the
# owner with compute:pools:share only, absent for anyone else.
# `lending`'s answer, {"lending": [lending_json(...), ...]}, ranked once parsed.
LENDING_SHAPE = LendingShape("lending", _shape(LENDING_ROW))
CAPACITY_SHAPE = CapacityShape("capacity", _shape(CAPACITY, _LENDER_KEYS), lender_keys_absent=True)
# `explain`'s answer, {"access": access_json(...)}: the grant says `via`, a denial its
# binding condition `key` (left out when there is none).
ACCESS_SHAPE = AccessShape("access", _shape(ACCESS), optional_keys_absent=True)
# `reservations/list`'s answer, {"reservations": [reservation_json(...), ...]}.
RESERVATIONS_SHAPE = ReservationsShape("reservations", _shape(RESERVATION))


def access_json(a: AccessExplanation) -> dict[str, Any]:
    """`explain`'s answer, on the plain path and the compiled one alike (view_json)."""
    return view_json(a, ACCESS_SHAPE.fields, ACCESS, optional_absent=True)


def impact_json(i: ImpactView) -> dict[str, Any]:
    return {
        "tenantsLosingAccess": list(i.tenants_losing_access),
        "quotaKept": i.quota_kept,
        "reservations": [reservation_json(r) for r in i.reservations],
        "offersEnded": list(i.offers_ended),
        "truncated": i.truncated,
    }


def render(result: object) -> Any:
    """Any method's result, by its type."""
    if isinstance(result, PoolDetail):
        return pool_json(result)
    if isinstance(result, Page):  # `list`: every pool, one page
        return [render(item) for item in result.items]
    if isinstance(result, CapacityView):
        return capacity_json(result)
    if isinstance(result, ReservationView):
        return reservation_json(result)
    if isinstance(result, LendingRowView):
        return lending_json(result)
    if isinstance(result, ImpactView):
        return impact_json(result)
    if isinstance(result, AccessExplanation):
        return access_json(result)
    if isinstance(result, bool):
        return result
    if isinstance(result, Sequence):
        return [render(item) for item in result]
    raise TypeError(f"cannot render {type(result).__name__}")
