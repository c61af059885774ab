"""Blind writes carried by a unit of work's last statement (PostgreSQL).

A write often ends with UPDATEs whose results nobody reads (the pool's row, its authz
rows), then its event's INSERT. Each would be a round trip of its own; on PostgreSQL they
can ride in the event's statement as data-modifying CTEs (one snapshot, one round trip;
each CTE runs once, whether or not the statement reads it). The statements are the same
Core objects the plain path sends: each is cloned with its bind parameters renamed (a
prefix per position), and an UPDATE or INSERT gets the columns its parameters name as
explicit values (a CTE takes no column values from the execution's parameters). The
combined statement is built once per combination and kept (bounded), so the driver path
compiles it once (app/db/session_statements.py).

SQLite has no data-modifying CTEs: there every write is sent when it is asked for.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

from sqlalchemy import Select, bindparam
from sqlalchemy.sql.dml import Insert, Update, UpdateBase
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.sql.visitors import ExternallyTraversible, iterate, replacement_traverse

# Combinations kept (a write's shape: a few per kind of write).
MAX_COMBINED: Final = 64

Write = tuple[UpdateBase, Mapping[str, Any]]
CARRIER: Final = "carrier_"  # the prefix of the target's own parameters


def _columns(statement: UpdateBase, params: Mapping[str, Any]) -> list[str]:
    """The columns an UPDATE or INSERT takes from its parameters, as compile's
    column_keys: parameters named like a column of its table and bound nowhere in it."""
    if not isinstance(statement, Update | Insert):
        return []
    bound = _bound(statement)
    table = statement.table
    return sorted(k for k in params if k in table.c and k not in bound)


@functools.lru_cache(maxsize=256)  # statements built once: a few, each walked once
def _bound(statement: UpdateBase) -> frozenset[str]:
    """The names of the parameters bound in the statement itself (its WHERE, its values)."""
    return frozenset(e.key for e in iterate(statement) if isinstance(e, BindParameter))


def _renamed(statement: Any, prefix: str) -> Any:
    """`statement` cloned with each named bind parameter prefixed (an anonymous one, a
    literal that carries its value, stays as it is)."""

    def renamed(element: Any, **_: Any) -> Any:  # (replacement_traverse's names)
        if isinstance(element, BindParameter) and not element.unique:
            key, kind = prefix + element.key, element.type
            return bindparam(key, type_=kind, expanding=element.expanding)
        return None

    return replacement_traverse(cast(ExternallyTraversible, statement), {}, renamed)


def _as_cte_body(statement: UpdateBase, columns: Sequence[str], prefix: str) -> UpdateBase:
    table: Any = statement.table
    if columns:
        assert isinstance(statement, Update | Insert)
        statement = statement.values({k: bindparam(k, type_=table.c[k].type) for k in columns})
    return cast(UpdateBase, _renamed(statement, prefix))


class CarriedWrites:
    """The combined statements of one Database: `target` with `writes` as CTEs."""

    def __init__(self) -> None:
        self._made: OrderedDict[tuple[Any, ...], tuple[tuple[Any, ...], Select[Any]]]
        self._made = OrderedDict()

    def combine(
        self, target: Select[Any], target_params: Mapping[str, Any], writes: Sequence[Write]
    ) -> tuple[Select[Any], dict[str, Any]]:
        """`target` carrying `writes` as CTEs (each runs once, of one snapshot with the
        target), and the parameters of it all."""
        shapes = [(statement, _columns(statement, params)) for statement, params in writes]
        key = (id(target), *((id(s), tuple(c)) for s, c in shapes))
        objects = (target, *(s for s, _ in shapes))
        found = self._made.get(key)
        if found is not None and all(a is b for a, b in zip(found[0], objects, strict=True)):
            self._made.move_to_end(key)
            combined = found[1]
        else:
            # Every parameter is renamed, the target's too: SQLAlchemy's plain path compiles
            # with the execution's parameter names as column keys, and an UPDATE in a CTE
            # would SET any column so named (the event's `tenant_id`, say).
            combined = _renamed(target, CARRIER).add_cte(
                *(
                    _as_cte_body(s, columns, f"carried{i}_").cte(f"carried{i}")
                    for i, (s, columns) in enumerate(shapes)
                )
            )
            self._made[key] = (objects, combined)  # holding them keeps their ids theirs
            while len(self._made) > MAX_COMBINED:
                self._made.popitem(last=False)
        params = {CARRIER + name: value for name, value in target_params.items()}
        params.update(
            (f"carried{i}_{name}", value)
            for i, (_, given) in enumerate(writes)
            for name, value in given.items()
        )
        return combined, params
