"""pools.display_name and pools.labels (CONTRACT section 10 "Names and labels").

`labels` is a JSON map on the pool's row (jsonb on PostgreSQL), as `policy` is: one
label selector is compiled from it by the domain's builder on both dialects
(app/capacity/labels.py). Existing pools get no name and no labels.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 13:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

# revision identifiers, used by Alembic.
revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    json_type = sa.JSON().with_variant(JSONB(), "postgresql")
    with op.batch_alter_table("pools", schema=None) as batch_op:
        batch_op.add_column(sa.Column("display_name", sa.String(length=128), nullable=True))
        batch_op.add_column(
            sa.Column("labels", json_type, nullable=False, server_default=sa.text("'{}'"))
        )


def downgrade() -> None:
    with op.batch_alter_table("pools", schema=None) as batch_op:
        batch_op.drop_column("labels")
        batch_op.drop_column("display_name")
