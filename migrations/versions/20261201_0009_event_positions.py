"""Event positions (tx, seq) behind the transaction-id horizon, and the position retention
has pruned through (docs/decisions/0012-commit-ordered-positions.md).

`events.tx` is the writing transaction's id on PostgreSQL (or its pool's newest tx, if that
is larger: app/events/outbox.py), indexed with the pool; rows that exist at the upgrade
keep 0, so they sort below every later row and `ev1:` cursors resume exactly. The one row
of `events_pruned` starts just below the oldest event left (what the old rule, "expired when
the cursor's successor is gone", made of it), so expiry reads the same before and after.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 12:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("tx", sa.BigInteger(), server_default=sa.text("0"), nullable=False)
        )
        batch_op.create_index("ix_events_tx_seq", ["tx", "seq"], unique=False)
        # A writer reads its pool's newest tx under the pool's lock: (pool_id, tx) answers
        # it with one probe, and still serves reads by pool.
        batch_op.drop_index("ix_events_pool_id")
        batch_op.create_index("ix_events_pool_id_tx", ["pool_id", "tx"], unique=False)
    op.create_table(
        "events_pruned",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("tx", sa.BigInteger(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events_pruned")),
    )
    op.execute(
        "INSERT INTO events_pruned (id, tx, seq) "
        "SELECT 1, 0, COALESCE((SELECT MIN(seq) FROM events), 1) - 1"
    )


def downgrade() -> None:
    op.drop_table("events_pruned")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index("ix_events_pool_id_tx")
        batch_op.create_index("ix_events_pool_id", ["pool_id"], unique=False)
        batch_op.drop_index("ix_events_tx_seq")
        batch_op.drop_column("tx")
