"""An index on push_subscription.subscriber_id for every row not tombstoned.

The preference centre lists a person's devices, stale ones included; the existing
subscriber index covers only pending and active rows, so that list read the whole
subscription table on every page view.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_push_subscription_subscriber",
        "push_subscription",
        ["subscriber_id"],
        postgresql_where=sa.text("deleted_at IS NULL"),
        sqlite_where=sa.text("deleted_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_push_subscription_subscriber", table_name="push_subscription")
