"""role_bindings.updated_at, indexed: each serve process looks for bindings changed in the
last minute, so that open subscriptions follow a rebinding (app/iam/bindings.py).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("role_bindings", schema=None) as batch_op:
        batch_op.add_column(sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index(
            batch_op.f("ix_role_bindings_updated_at"), ["updated_at"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("role_bindings", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_role_bindings_updated_at"))
        batch_op.drop_column("updated_at")
