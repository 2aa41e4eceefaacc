"""A partial index on the deliveries still to send: the claim's cost stays flat.

The engine claims a batch as "the lowest ids of the sending campaigns' deliveries that
are queued and due, or being sent under a lease that ran out". ``ix_delivery_claim``
(campaign_id, status, next_attempt_at) cannot serve that: the status OR leaves the
planner only its campaign_id prefix, so every claim read the campaign's rows already
sent (a 500-row claim took close to a second with 3,000,000 of them). This index holds
only the rows still queued or out (``status IN ('queued', 'sending')``), in id order:
a row leaves it when it is answered, so a claim reads about a batch of entries whatever
this campaign or earlier ones already sent. ``ix_delivery_claim`` stays: the progress
counts and the "anything left?" checks use its (campaign_id, status) prefix.

Built in the migration's transaction, not CONCURRENTLY: a concurrent build waits for
every transaction that started before it, among them the processes queued on the
migration lock, which wait for it in turn (see 0015).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_DUE = "status IN ('queued', 'sending')"


def upgrade() -> None:
    op.create_index(
        "ix_delivery_due",
        "delivery",
        ["id"],
        postgresql_where=sa.text(_DUE),
        sqlite_where=sa.text(_DUE),
    )


def downgrade() -> None:
    op.drop_index("ix_delivery_due", table_name="delivery")
