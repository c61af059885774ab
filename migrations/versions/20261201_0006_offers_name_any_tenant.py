"""An offer names a tenant id, not a tenant row: offers, quota rows and authz rows lose their
foreign key to tenants, so an offer to a tenant id that does not exist (yet) is stored as
one to a real tenant is, and no tenant's admin can tell the two apart (issue 19, item 11;
docs/decisions/0001). Such an offer is inert: no caller can act for a missing tenant.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 09:00:00
"""

from collections.abc import Sequence

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = ("offers", "quota_rows", "authz_rows")


def upgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_constraint(f"fk_{table}_tenant_id_tenants", type_="foreignkey")


def downgrade() -> None:
    # Fails while an offer names a missing tenant: withdraw such offers first.
    for table in _TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.create_foreign_key(
                f"fk_{table}_tenant_id_tenants", "tenants", ["tenant_id"], ["id"]
            )
