"""An index on api_tokens.revoked_at: each serve process looks for tokens revoked in
the last minute every few seconds, to close their websockets (app/iam/revocations.py).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 16:40:00
"""

from collections.abc import Sequence

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_tokens_revoked_at"), ["revoked_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_tokens_revoked_at"))
