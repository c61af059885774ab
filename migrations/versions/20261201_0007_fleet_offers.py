"""Fleet offers: the offers a fleet file declared when it was last applied.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 09:00:00.000000

`bettercompute apply` withdraws an offer the file declared before and no longer lists,
and leaves alone one that no file declared (made through the API), as `kubectl apply`
drops only what it applied (docs/decisions/0010-apply-prunes-what-it-declared.md). The
row goes with its offer, whichever surface withdraws it.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "fleet_offers",
        sa.Column("pool_id", sa.String(length=57), nullable=False),
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(
            ["pool_id", "tenant_id"],
            ["offers.pool_id", "offers.tenant_id"],
            name=op.f("fk_fleet_offers_pool_id_offers"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("pool_id", "tenant_id", name=op.f("pk_fleet_offers")),
    )


def downgrade() -> None:
    op.drop_table("fleet_offers")
