"""The built-in fleet tenant (CONTRACT 2) is part of the schema: every migrated database
has it, and the database itself refuses to delete, rename or re-parent it, whatever
path the SQL comes from."""

from __future__ import annotations

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError, IntegrityError

from app.db.engine import Database
from app.db.models import Tenant
from app.iam.roles import FLEET_TENANT
from tests.support import Fleet


async def _fleet_row(db: Database) -> tuple[str, str | None] | None:
    async with db.reader.connect() as conn:
        row = (
            await conn.execute(select(Tenant.id, Tenant.parent_id).where(Tenant.id == FLEET_TENANT))
        ).one_or_none()
    return None if row is None else (row.id, row.parent_id)


async def test_every_migrated_database_has_the_fleet_tenant(db: Database) -> None:
    """Also after the fixtures empty every table before a test."""
    assert await _fleet_row(db) == (FLEET_TENANT, None)


@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM tenants WHERE id = 'fleet'",
        "DELETE FROM tenants",
        "UPDATE tenants SET id = 'fleet-old' WHERE id = 'fleet'",
        "UPDATE tenants SET parent_id = 'acme' WHERE id = 'fleet'",
        "UPDATE tenants SET parent_id = 'acme'",
    ],
    ids=["delete", "delete-all", "rename", "re-parent", "re-parent-all"],
)
async def test_sql_cannot_delete_rename_or_reparent_fleet(
    db: Database, fleet: Fleet, statement: str
) -> None:
    await fleet.tenant("acme")
    with pytest.raises(IntegrityError, match="fleet"):
        async with db.writer.begin() as conn:
            await conn.execute(text(statement))
    assert await _fleet_row(db) == (FLEET_TENANT, None)


async def test_other_tenants_are_still_deleted_and_reparented(db: Database, fleet: Fleet) -> None:
    """The guard is on the fleet row only; it may also be a parent."""
    await fleet.tenant("acme")
    await fleet.tenant("ops")
    async with db.writer.begin() as conn:
        await conn.execute(text("UPDATE tenants SET parent_id = 'fleet' WHERE id = 'ops'"))
        await conn.execute(text("DELETE FROM tenants WHERE id = 'acme'"))
    async with db.reader.connect() as conn:
        rows = (await conn.execute(select(Tenant.id, Tenant.parent_id).order_by(Tenant.id))).all()
    assert [tuple(r) for r in rows] == [("fleet", None), ("ops", "fleet")]


async def test_a_second_fleet_row_with_a_parent_is_refused(db: Database, fleet: Fleet) -> None:
    """An upsert that replaces the row must keep it a root (SQLite's INSERT OR REPLACE
    deletes without firing delete triggers; the CHECK still holds)."""
    await fleet.tenant("acme")
    replace = (
        "INSERT OR REPLACE INTO tenants (id, parent_id, created_at) "
        "VALUES ('fleet', 'acme', CURRENT_TIMESTAMP)"
        if db.dialect == "sqlite"
        else "INSERT INTO tenants (id, parent_id, created_at) "
        "VALUES ('fleet', 'acme', CURRENT_TIMESTAMP) "
        "ON CONFLICT (id) DO UPDATE SET parent_id = excluded.parent_id"
    )
    with pytest.raises(IntegrityError):
        async with db.writer.begin() as conn:
            await conn.execute(text(replace))
    assert await _fleet_row(db) == (FLEET_TENANT, None)


@pytest.mark.parametrize("dialect", ["postgresql"])  # SQLite has no TRUNCATE
async def test_postgresql_refuses_to_truncate_tenants(db: Database) -> None:
    """TRUNCATE fires no row triggers, so it has its own guard."""
    with pytest.raises(DBAPIError, match="fleet"):
        async with db.writer.begin() as conn:
            await conn.execute(text("TRUNCATE tenants CASCADE"))
    assert await _fleet_row(db) == (FLEET_TENANT, None)
