"""push_subscription.browser_told_at: when the browser was first told to drop an ended
subscription (the heartbeat's ``unsubscribe``).

An erasure ends in the browser, not in the database: until the device is told, it still
holds a subscription and could register again. The compliance dashboard counts erased
people's devices not told yet. A nullable column without a default: no table rewrite.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "push_subscription",
        sa.Column("browser_told_at", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("push_subscription", "browser_told_at")
