"""The inventory rows (app/db/inventory_rows.py) in the embedded SQLite file, written with
the stdlib `sqlite3`: an admin command at the shell then loads no SQLAlchemy (about 0.3 s
of imports for a one-row insert).

Only for a file at head (app/db/embedded.py checks that first). The rows are the ones the
session writes, column for column: the models' defaults come from app/db/defaults.py,
and values are stored as SQLAlchemy stores them on SQLite (datetimes as text, JSON by
`json.dumps`); tests/db/test_embedded_rows.py compares rows written by both stores. The
transaction is the unit of work's: `BEGIN IMMEDIATE` (the one writer, waiting up to the
busy timeout for the lock), committed once at the end, rolled back on any error.

The methods are coroutines because the domain awaits its store, but they never suspend:
`write_embedded` runs a write to its end without an event loop (importing asyncio would
cost a tenth of the command).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

from app.db.defaults import FIRST_AGENT_REVISION, utcnow
from app.db.embedded import connection_pragmas, file_uri

T = TypeVar("T")

# SQLAlchemy's SQLite DATETIME storage format (the UTC time, without an offset).
STORED_DATETIME = "%Y-%m-%d %H:%M:%S.%f"


def stored_datetime(moment: datetime) -> str:
    return moment.strftime(STORED_DATETIME)


class EmbeddedRows:
    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    def _exists(self, query: str, key: str) -> bool:
        return self._connection.execute(query, (key,)).fetchone() is not None

    def _insert(self, query: str, *values: object) -> None:
        self._connection.execute(query, values)

    async def has_tenant(self, tenant_id: str) -> bool:
        return self._exists("SELECT 1 FROM tenants WHERE id = ?", tenant_id)

    async def has_caller(self, caller_id: str) -> bool:
        return self._exists("SELECT 1 FROM callers WHERE id = ?", caller_id)

    async def add_tenant(self, tenant_id: str, parent_id: str | None) -> None:
        self._insert(
            "INSERT INTO tenants (id, parent_id, created_at) VALUES (?, ?, ?)",
            tenant_id,
            parent_id,
            stored_datetime(utcnow()),
        )

    async def add_site(self, site_id: str, tenant_id: str, kind: str, region: str) -> None:
        self._insert(
            "INSERT INTO sites (id, tenant_id, kind, region, agent_revision, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            site_id,
            tenant_id,
            kind,
            region,
            FIRST_AGENT_REVISION,
            stored_datetime(utcnow()),
        )

    async def add_provider_account(self, account_id: str, tenant_id: str) -> None:
        self._insert(
            "INSERT INTO provider_accounts (id, tenant_id, created_at) VALUES (?, ?, ?)",
            account_id,
            tenant_id,
            stored_datetime(utcnow()),
        )

    async def add_caller(
        self, caller_id: str, tenant_id: str, role: str, conditions: dict[str, str]
    ) -> None:
        self._insert(
            "INSERT INTO callers (id, tenant_id, created_at) VALUES (?, ?, ?)",
            caller_id,
            tenant_id,
            stored_datetime(utcnow()),
        )
        self._insert(
            "INSERT INTO role_bindings (caller_id, role, conditions, updated_at) "
            "VALUES (?, ?, ?, ?)",
            caller_id,
            role,
            json.dumps(conditions),
            stored_datetime(utcnow()),
        )

    async def add_token(self, token_hash: str, caller_id: str) -> None:
        self._insert(
            "INSERT INTO api_tokens (token_hash, caller_id, created_at) VALUES (?, ?, ?)",
            token_hash,
            caller_id,
            stored_datetime(utcnow()),
        )


@contextmanager
def embedded_rows(path: str, busy_timeout: int) -> Iterator[EmbeddedRows]:
    """One write transaction on the file at `path`, which must exist."""
    connection = sqlite3.connect(
        file_uri(path, "rw"), uri=True, isolation_level=None, timeout=busy_timeout / 1000
    )
    try:
        for pragma in connection_pragmas(busy_timeout):
            connection.execute(pragma)
        connection.execute("BEGIN IMMEDIATE")
        try:
            yield EmbeddedRows(connection)
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")
    finally:
        connection.close()


def write_embedded(
    path: str, busy_timeout: int, write: Callable[[EmbeddedRows], Coroutine[Any, Any, T]]
) -> T:
    """`write` on the rows of the file at `path`, in one transaction."""
    with embedded_rows(path, busy_timeout) as rows:
        step = write(rows)
        try:
            step.send(None)
        except StopIteration as done:
            result: T = done.value
            return result
        step.close()
        raise RuntimeError("a write on the embedded rows awaited something that suspends")
