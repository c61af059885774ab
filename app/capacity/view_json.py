"""A read model as JSON, by a shape (app/capacity/shapes.py) and the table of fields.

For an answer decided in Python over facts one statement read (the `access` explanation:
explain.explanation), the object is rendered here from the read model, the same way on
every path: REST's `pools/explain` renders its plain answer and its compiled one with
this, GraphQL's compiled `access` with its selection (the plain GraphQL path resolves the
same read model through Strawberry). Each Read names a row of the table (its value is the
read model's attribute of that name, rendered as its kind renders); each Nested the
relation holding that kind of object.
"""

from __future__ import annotations

from typing import Any

from app.capacity.fields import TABLES, Relation, Table, Value, timestamp
from app.capacity.shapes import Constant, Field, Nested, Read


def view_json(
    view: object, fields: tuple[Field, ...], table: Table, optional_absent: bool = False
) -> dict[str, Any]:
    """`view` (a read model of `table`'s type) as the object `fields` describe: their keys
    in order; an optional value that is null left out with `optional_absent` (REST)."""
    found: dict[str, Any] = {}
    for f in fields:
        if isinstance(f, Constant):
            found[f.key] = f.value
        elif isinstance(f, Read):
            entry = table.entry(f.value)
            if not isinstance(entry, Value):
                raise TypeError(f"{table.graphql}.{f.value} is not a value")
            value = getattr(view, entry.name)
            if value is None and optional_absent and entry.optional is not None:
                continue
            if entry.kind == "timestamp":
                value = timestamp(value)
            elif f.mapping is not None and value is not None:
                value = dict(f.mapping)[value]
            found[f.key] = value
        elif isinstance(f, Nested):
            relation = _relation(table, f.kind)
            inner = getattr(view, relation.name)
            found[f.key] = (
                None
                if inner is None
                else view_json(inner, f.fields, TABLES[relation.of], optional_absent)
            )
        else:
            raise TypeError(f"{f.key}: no list here")
    return found


def _relation(table: Table, kind: str) -> Relation:
    for e in table.entries:
        if isinstance(e, Relation) and e.rows == kind:
            return e
    raise KeyError(f"{table.graphql} holds no {kind}")
