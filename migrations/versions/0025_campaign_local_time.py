"""campaign.local_time and campaign.fallback_zone: local-time delivery.

A campaign sent "at 09:00 in each person's time zone" keeps the time of day and the zone
for people whose browser reported none (portal/campaigns/local_time.py); both or neither.
Existing campaigns have neither: everyone at the send time, as before.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

_BOTH_OR_NEITHER = "(local_time IS NULL) = (fallback_zone IS NULL)"


def upgrade() -> None:
    with op.batch_alter_table("campaign") as batch:
        batch.add_column(sa.Column("local_time", sa.Time(), nullable=True))
        batch.add_column(sa.Column("fallback_zone", sa.String(64), nullable=True))
        batch.create_check_constraint(op.f("ck_campaign_local_time_fallback"), _BOTH_OR_NEITHER)


def downgrade() -> None:
    with op.batch_alter_table("campaign") as batch:
        batch.drop_constraint(op.f("ck_campaign_local_time_fallback"), type_="check")
        batch.drop_column("fallback_zone")
        batch.drop_column("local_time")
