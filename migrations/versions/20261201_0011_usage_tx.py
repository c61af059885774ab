"""quota_rows.usage_tx and capacity_rows.usage_tx: the stamp behind `pool.usage` events
(CONTRACT section 10 "Usage events"; docs/decisions/0012, section "`pool.usage`").

The guarded UPDATE a booking or a release makes of a row also sets its `usage_tx`: the
writing transaction's id on PostgreSQL, one more than the largest stamp on SQLite. Each
relay finds the pools whose usage moved between two horizons by an index range scan on it.
Existing rows start at 0, below every stamp a booking writes.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 16:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("quota_rows", "capacity_rows")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(
                sa.Column("usage_tx", sa.BigInteger(), server_default=sa.text("0"), nullable=False)
            )
            batch_op.create_index(f"ix_{table}_usage_tx", ["usage_tx"], unique=False)


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_index(f"ix_{table}_usage_tx")
            batch_op.drop_column("usage_tx")
