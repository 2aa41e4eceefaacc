"""A finished campaign's deliveries by status, kept once nothing can change them.

``campaign.settled_counts``: the campaign list counted every delivery of every campaign it
lists at each view (deliveries are kept for the audit window), so its cost grew with every
campaign sent. A campaign finished with nothing queued or out keeps its counts here
(``portal/campaigns/settled.py``); NULL until then, and for every campaign when this
migration runs: the ``table-retention`` job settles those finished before it, a campaign
at a time, instead of this migration counting every delivery kept.

Revision ID: 0036
Revises: 0035
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0036"
down_revision = "0035"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("campaign", sa.Column("settled_counts", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("campaign", "settled_counts")
