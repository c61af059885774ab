"""Fleet names: the stable names a fleet file gives generated ids.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 17:00:00.000000

`bettercompute apply -f FILE` declares sites, provider accounts, callers and pools by a
name per tenant; this table maps (kind, tenant, name) to the id the domain generated,
so applying the same file again finds them (docs/decisions/0005-fleet-files.md).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "fleet_names",
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("resource_id", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_fleet_names_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("kind", "tenant_id", "name", name=op.f("pk_fleet_names")),
        sa.UniqueConstraint("resource_id", name=op.f("uq_fleet_names_resource_id")),
    )


def downgrade() -> None:
    op.drop_table("fleet_names")
