"""subscriber.time_zone: the zone the person's browser reported when subscribing.

``Intl.DateTimeFormat().resolvedOptions().timeZone``, sent by the subscribe page and
checked against the time-zone database (portal/campaigns/zones.py ``browser_zone``; an
old name is stored as its canonical zone). The person's local time for local-time
delivery and quiet hours; NULL where no browser said (the campaign's fallback zone).

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("subscriber") as batch:
        batch.add_column(sa.Column("time_zone", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("subscriber") as batch:
        batch.drop_column("time_zone")
