"""campaign.time_zone: the IANA zone a campaign's send time was chosen in.

The times stay in UTC; the zone is kept so the campaign pages can show the send time as
it was chosen ("09:00 Europe/Paris (UTC+01:00) — 08:00 UTC"). Campaigns launched before
keep NULL, which the pages show as UTC only (the zone they were chosen in is not known).
A nullable column without a default: no table rewrite.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("campaign", sa.Column("time_zone", sa.String(64), nullable=True))


def downgrade() -> None:
    op.drop_column("campaign", "time_zone")
