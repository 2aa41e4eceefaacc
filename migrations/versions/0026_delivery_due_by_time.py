"""ix_delivery_due by due time: a claim reads only the rows already due.

Migration 0017's index held the rows still to send in id order, so a claim read past every
row not due yet before it found one that was. With local-time delivery most of a
campaign waits for hours (each zone for its own 09:00), and a claim would read all of
them on every tick. The same predicate (``status IN ('queued', 'sending')``), now on
(next_attempt_at, id): the claim asks for ``next_attempt_at <= now`` in that order, so it
reads about a batch of entries whatever was sent before and whatever waits for later. A
row out under a lease was due when it was claimed, so the range holds it too.

Built in the migration's transaction, not CONCURRENTLY, as 0017 explains.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
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
    _due_index("next_attempt_at", "id")


def downgrade() -> None:
    _due_index("id")
