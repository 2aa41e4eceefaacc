"""Indexes for the retention of the bounded tables (portal/retention/tables.py).

The ``table-retention`` job deletes feedback markers by ``applied_at`` and display
receipts by ``at``; without an index each run would read the whole table to find the few
rows past their window. New, empty indexes on tables the app only appends to: plain
CREATE INDEX, as the other index migrations.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_feedback_applied_applied_at", "feedback_applied", ["applied_at"])
    op.create_index("ix_delivery_receipt_at", "delivery_receipt", ["at"])


def downgrade() -> None:
    op.drop_index("ix_delivery_receipt_at", table_name="delivery_receipt")
    op.drop_index("ix_feedback_applied_applied_at", table_name="feedback_applied")
