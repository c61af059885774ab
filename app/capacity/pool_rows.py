"""Rows a write changes by Core statements built once (run by the unit of work's
statements, app/db/session_statements.py), kept in step with the session's objects.

The ORM's flush costs more than the UPDATE it sends; a write that changes a locked pool's
row, or rows of one pool, sends the UPDATE itself. Objects of those rows already in the
session (the locked Pool, an authz row read beside it, a fleet apply's) are given the
written values as their committed state, so they read what the row holds and have
nothing to flush.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from sqlalchemy import Table, bindparam, update
from sqlalchemy.orm.attributes import set_committed_value

from app.capacity.access import LockedPool
from app.db.models import Pool
from app.db.session_statements import SessionStatements

_POOLS: Table = Pool.__table__  # type: ignore[assignment]
# The pool's row: the columns set are those the call names (attribute names are the
# columns' keys). Built once.
_WRITE_POOL = update(_POOLS).where(_POOLS.c.id == bindparam("pool_key"))


async def write_pool(
    statements: SessionStatements, pool: LockedPool, values: Mapping[str, Any]
) -> LockedPool:
    """Set `values` (by attribute) on the locked pool's row, and on the session's Pool of
    that row if one is loaded, as its committed state; returns `pool` with them."""
    # Sent with the write's event, or before its next statement (carried_writes.py).
    await statements.write_later(_WRITE_POOL, {"pool_key": pool.id, **values})
    sync_loaded(statements, Pool, lambda loaded: loaded.id == pool.id, lambda _: values)
    return replace(pool, **values)


def sync_loaded(
    statements: SessionStatements,
    kind: type[Any],
    match: Callable[[Any], bool],
    values: Callable[[Any], Mapping[str, Any] | None],
) -> None:
    """Give the session's loaded `kind` objects that `match` the values just written to
    their rows (None: that row was not written), as their committed state."""
    for obj in statements.loaded():
        if isinstance(obj, kind) and match(obj):
            written = values(obj)
            for name, value in (written or {}).items():
                set_committed_value(obj, name, value)


def forget_loaded(
    statements: SessionStatements, kind: type[Any], match: Callable[[Any], bool]
) -> None:
    """Take the session's loaded `kind` objects that `match` out of it: their rows are
    being deleted by a Core statement, so a later `session.get` must read afresh."""
    for obj in statements.loaded():
        if isinstance(obj, kind) and match(obj):
            statements.session.expunge(obj)
