"""Frequency caps: a person's "at most one a day" choice, and an index to count sends.

``subscriber.one_a_day``: chosen in the preference centre, it caps that person's
marketing notifications at one per rolling day, whatever the portal-wide caps say
(portal/delivery/caps.py). The engine counts a person's recent marketing sends per
batch; ``ix_delivery_subscription_sent`` (subscription, updated_at) reads only the last
week's rows of each subscription instead of every delivery it ever had, and serves the
look-ups by subscription that ``ix_delivery_subscription_id`` served (its prefix).

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("subscriber") as batch:
        batch.add_column(
            sa.Column("one_a_day", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    op.create_index("ix_delivery_subscription_sent", "delivery", ["subscription_id", "updated_at"])
    op.drop_index("ix_delivery_subscription_id", table_name="delivery")


def downgrade() -> None:
    op.create_index("ix_delivery_subscription_id", "delivery", ["subscription_id"])
    op.drop_index("ix_delivery_subscription_sent", table_name="delivery")
    with op.batch_alter_table("subscriber") as batch:
        batch.drop_column("one_a_day")
