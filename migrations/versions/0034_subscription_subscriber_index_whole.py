"""ix_push_subscription_subscriber over every row, tombstones included.

Whether a preference link still manages an anonymous identity asks whether any
subscription, ended or not, is still that identity's (account linking moves them all to
the account). The index of migration 0012 left tombstones out, so no index served the
question and every preference centre request read the whole subscription table: 20–100
ms at 116,000 subscriptions, the page cut from 513 to 62 requests a second. The same
index without its predicate serves that question and the device list (which adds
``deleted_at IS NULL`` as a filter) alike.

Built in the migration's transaction, not CONCURRENTLY, as 0017 explains.

Revision ID: 0034
Revises: 0033
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_push_subscription_subscriber", table_name="push_subscription")
    op.create_index("ix_push_subscription_subscriber", "push_subscription", ["subscriber_id"])


def downgrade() -> None:
    op.drop_index("ix_push_subscription_subscriber", table_name="push_subscription")
    op.create_index(
        "ix_push_subscription_subscriber",
        "push_subscription",
        ["subscriber_id"],
        postgresql_where=sa.text("deleted_at IS NULL"),
        sqlite_where=sa.text("deleted_at IS NULL"),
    )
