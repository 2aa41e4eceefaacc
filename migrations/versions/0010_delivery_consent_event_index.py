"""An index on delivery.consent_event_seq: the deliveries one person's consent allowed.

The compliance look-up joins a person's consent events to the deliveries they allowed;
without it that join reads the whole delivery table.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_delivery_consent_event_seq",
        "delivery",
        ["consent_event_seq"],
        postgresql_where=sa.text("consent_event_seq IS NOT NULL"),
        sqlite_where=sa.text("consent_event_seq IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_delivery_consent_event_seq", table_name="delivery")
