"""The built-in fleet tenant: created with the schema, and kept by the database.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 16:40:00.000000

CONTRACT 2: "The built-in fleet tenant is `fleet`". Before this revision only `demo`
made it, so `caller create --tenant fleet --role fleet-admin` failed on a database set
up with `db upgrade`. The row is inserted only if missing (`demo` may have made it),
and a fleet row that was given a parent becomes a root again.

Guards, on both dialects:
- CHECK `ck_tenants_fleet_has_no_parent` (also in app.db.models): fleet is a root;
- triggers refuse to DELETE the fleet row or change its id; on PostgreSQL also
  TRUNCATE of tenants, which fires no row triggers.
SQLite drops a table's triggers when `batch_alter_table` recreates it: a later revision
that alters `tenants` on SQLite must create `_SQLITE_TRIGGERS` again
(tests/db/test_fleet_tenant.py fails at head if it does not).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FLEET_HAS_NO_PARENT = "id <> 'fleet' OR parent_id IS NULL"


def _tenants(*constraints: sa.CheckConstraint) -> sa.Table:
    """`tenants` as revision 0001 made it, plus `constraints`: SQLite's batch recreates
    the table from this rather than by reflection, so `--sql` works offline too."""
    return sa.Table(
        "tenants",
        sa.MetaData(),
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("parent_id", sa.String(length=128), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["parent_id"], ["tenants.id"], name="fk_tenants_parent_id_tenants"),
        sa.PrimaryKeyConstraint("id", name="pk_tenants"),
        sa.Index("ix_tenants_parent_id", "parent_id"),
        *constraints,
    )


_REFUSAL = "tenant fleet is built in: it cannot be deleted or renamed"

_SQLITE_TRIGGERS = (
    f"""
    CREATE TRIGGER tenants_keep_fleet_delete BEFORE DELETE ON tenants
    FOR EACH ROW WHEN OLD.id = 'fleet'
    BEGIN SELECT RAISE(ABORT, '{_REFUSAL}'); END
    """,
    f"""
    CREATE TRIGGER tenants_keep_fleet_rename BEFORE UPDATE OF id ON tenants
    FOR EACH ROW WHEN OLD.id = 'fleet' AND NEW.id IS NOT 'fleet'
    BEGIN SELECT RAISE(ABORT, '{_REFUSAL}'); END
    """,
)

# restrict_violation (23001) is an integrity error, as SQLite's RAISE(ABORT) is.
_POSTGRESQL_FUNCTION = f"""
CREATE FUNCTION tenants_keep_fleet() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.id = OLD.id THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION '{_REFUSAL}' USING ERRCODE = 'restrict_violation';
END
$$
"""
_POSTGRESQL_TRIGGERS = (
    """
    CREATE TRIGGER tenants_keep_fleet BEFORE DELETE OR UPDATE OF id ON tenants
    FOR EACH ROW WHEN (OLD.id = 'fleet') EXECUTE FUNCTION tenants_keep_fleet()
    """,
    """
    CREATE TRIGGER tenants_keep_fleet_truncate BEFORE TRUNCATE ON tenants
    FOR EACH STATEMENT EXECUTE FUNCTION tenants_keep_fleet()
    """,
)


def upgrade() -> None:
    op.execute(
        "INSERT INTO tenants (id, parent_id, created_at) "
        "SELECT 'fleet', NULL, CURRENT_TIMESTAMP "
        "WHERE NOT EXISTS (SELECT 1 FROM tenants WHERE id = 'fleet')"
    )
    op.execute("UPDATE tenants SET parent_id = NULL WHERE id = 'fleet'")
    with op.batch_alter_table("tenants", schema=None, copy_from=_tenants()) as batch_op:
        batch_op.create_check_constraint(
            op.f("ck_tenants_fleet_has_no_parent"), _FLEET_HAS_NO_PARENT
        )
    if op.get_context().dialect.name == "postgresql":
        op.execute(_POSTGRESQL_FUNCTION)
        for statement in _POSTGRESQL_TRIGGERS:
            op.execute(statement)
    else:
        for statement in _SQLITE_TRIGGERS:
            op.execute(statement)


def downgrade() -> None:
    """Drops the guards; the fleet row stays (callers may refer to it)."""
    if op.get_context().dialect.name == "postgresql":
        op.execute("DROP TRIGGER tenants_keep_fleet_truncate ON tenants")
        op.execute("DROP TRIGGER tenants_keep_fleet ON tenants")
        op.execute("DROP FUNCTION tenants_keep_fleet()")
    else:
        op.execute("DROP TRIGGER tenants_keep_fleet_rename")
        op.execute("DROP TRIGGER tenants_keep_fleet_delete")
    check = sa.CheckConstraint(_FLEET_HAS_NO_PARENT, name="ck_tenants_fleet_has_no_parent")
    with op.batch_alter_table("tenants", schema=None, copy_from=_tenants(check)) as batch_op:
        batch_op.drop_constraint(op.f("ck_tenants_fleet_has_no_parent"), type_="check")
