"""ix_delivery_due by campaign, then due time: a claim reads its own campaign's batch.

Migration 0026's index held the rows still to send by (next_attempt_at, id) across every
campaign. A claim walked it in that order and dropped the rows of campaigns not sending,
so a large campaign paused with its deliveries due (earlier than another's) was read
through on every claim of every other campaign: 6,000 paused rows read to take 500. The
same predicate, now on (campaign_id, next_attempt_at, id): the claim asks the sending
campaigns one at a time for their next deliveries in due order, each from its own part
of the index, so it reads about a batch whatever is paused, sent or waiting for later.

Built in the migration's transaction, not CONCURRENTLY, as 0017 explains.

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None

_DUE = "status IN ('queued', 'sending')"


def _due_index(*columns: str) -> None:
    op.drop_index("ix_delivery_due", table_name="delivery")
    op.create_index(
        "ix_delivery_due",
        "delivery",
        list(columns),
        postgresql_where=sa.text(_DUE),
        sqlite_where=sa.text(_DUE),
    )


def upgrade() -> None:
    _due_index("campaign_id", "next_attempt_at", "id")


def downgrade() -> None:
    _due_index("next_attempt_at", "id")
