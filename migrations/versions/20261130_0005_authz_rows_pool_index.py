"""An index on authz_rows.pool_id: who holds an offer of one pool is asked on every pool
read (app/capacity/reads.py load_grants, the compiled reads' grant lookup); the primary
key (tenant_id, pool_id) only serves a tenant's rows.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 20:20:00
"""

from collections.abc import Sequence

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("authz_rows", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_authz_rows_pool_id"), ["pool_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("authz_rows", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_authz_rows_pool_id"))
