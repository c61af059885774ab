"""The embedded store (app/db/embedded_rows.py, the stdlib's sqlite3) writes the rows the
session writes, column for column, so the server reads them alike; its transaction is the
unit of work's: all or nothing."""

from __future__ import annotations

import asyncio
import re
import sqlite3
from contextlib import closing
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.dialects import sqlite as sqlite_dialect

from app.capacity.inventory import add_provider_account, add_site, add_tenant
from app.db.embedded import sqlite_file
from app.db.embedded_rows import stored_datetime, write_embedded
from app.db.engine import Database
from app.db.inventory_rows import InventoryRows
from app.db.models import ApiToken, Caller, RoleBinding, Site, Tenant
from app.db.uow import UnitOfWork
from app.errors import InvalidInput
from app.iam.callers import authenticate
from app.iam.issuing import add_caller, add_token
from app.ids import token_hash

TABLES = ("tenants", "sites", "provider_accounts", "callers", "role_bindings", "api_tokens")
STORED = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}")
pytestmark = pytest.mark.parametrize("dialect", ["sqlite"])


async def _one_of_each(rows: InventoryRows, prefix: str) -> dict[str, str]:
    """Every write of the port; returns what was made, by a name common to both stores."""
    await add_tenant(rows, f"{prefix}-parent")
    await add_tenant(rows, prefix, f"{prefix}-parent")
    site = await add_site(rows, prefix, "custom", "eu-west")
    account = await add_provider_account(rows, prefix)
    caller, first = await add_caller(rows, prefix, "operator", {"region": "eu-west"})
    second = await add_token(rows, caller)
    return {
        f"{prefix}-parent": "<parent>",
        prefix: "<tenant>",
        site: "<site>",
        account: "<account>",
        caller: "<caller>",
        token_hash(first): "<first token>",
        token_hash(second): "<second token>",
        "token": first,
    }


def _rows_of(path: str, made: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """Each table's rows of one writer, as stored, its own ids and times made symbolic."""
    ours = set(made) - {"token"}
    found: dict[str, list[dict[str, Any]]] = {}
    with closing(sqlite3.connect(path)) as conn:
        for table in TABLES:
            columns = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
            selected = ", ".join(f"{c}, typeof({c})" for c in columns)
            rows = []
            for values in conn.execute(f"SELECT {selected} FROM {table}"):
                row = dict(zip(columns, zip(values[::2], values[1::2], strict=True), strict=True))
                if not ours & {value for value, _ in row.values()}:
                    continue  # the other writer's, or the built-in fleet tenant
                for column, (value, kind) in row.items():
                    if isinstance(value, str) and STORED.fullmatch(value):
                        value = "<stored datetime>"
                    row[column] = (made.get(value, value), kind)
                rows.append(row)
            found[table] = rows
    return found


async def test_both_stores_write_the_same_rows(database_url: str, db: Database) -> None:
    path = sqlite_file(database_url)
    assert path is not None
    async with UnitOfWork(db) as uow:
        by_session = await _one_of_each(uow.rows, "orm")
    by_stdlib = write_embedded(path, 1000, lambda rows: _one_of_each(rows, "raw"))

    session_rows, stdlib_rows = _rows_of(path, by_session), _rows_of(path, by_stdlib)
    assert all(session_rows[table] for table in TABLES)
    assert stdlib_rows == session_rows

    # The server reads them alike: an aware UTC time, the narrowing, a token it accepts.
    async with db.reader.connect() as conn:
        created = await conn.scalar(select(Tenant.created_at).where(Tenant.id == "raw"))
        revision = await conn.scalar(select(Site.agent_revision).where(Site.tenant_id == "raw"))
        caller_id = await conn.scalar(select(Caller.id).where(Caller.tenant_id == "raw"))
        binding = (
            await conn.execute(select(RoleBinding).where(RoleBinding.caller_id == caller_id))
        ).one()
        token = await conn.scalar(
            select(ApiToken.token_hash).where(ApiToken.caller_id == caller_id)
        )
    assert created is not None and created.tzinfo is not None
    assert abs((datetime.now(UTC) - created).total_seconds()) < 60
    assert revision == 1 and token is not None
    assert (binding.role, binding.conditions) == ("operator", {"region": "eu-west"})
    principal = await authenticate(db, f"Bearer {by_stdlib['token']}")
    assert (principal.caller_id, principal.tenant_id, principal.role) == (
        caller_id,
        "raw",
        "operator",
    )
    assert principal.conditions == {"region": "eu-west"}


def test_datetimes_are_stored_as_sqlalchemy_stores_them(dialect: str) -> None:
    bind = sqlite_dialect.DATETIME().bind_processor(sqlite_dialect.dialect())
    assert bind is not None
    for moment in (
        datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
        datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC),  # no microseconds
    ):
        assert stored_datetime(moment) == bind(moment)


def _tenants(path: str) -> list[str]:
    with closing(sqlite3.connect(path)) as conn:
        return [row[0] for row in conn.execute("SELECT id FROM tenants ORDER BY id")]


async def test_a_write_that_fails_anywhere_writes_nothing(database_url: str) -> None:
    path = sqlite_file(database_url)
    assert path is not None

    async def tenant_then_bad_caller(rows: InventoryRows) -> None:
        await add_tenant(rows, "acme")
        await add_caller(rows, "acme", "emperor")

    with pytest.raises(InvalidInput, match="unknown role emperor"):
        write_embedded(path, 1000, tenant_then_bad_caller)

    async def tenant_then_suspend(rows: InventoryRows) -> None:
        await add_tenant(rows, "acme")
        await asyncio.sleep(0)  # no event loop runs an embedded write

    with pytest.raises(RuntimeError, match="suspends"):
        write_embedded(path, 1000, tenant_then_suspend)
    assert _tenants(path) == ["fleet"]
