"""The compliance dashboard's past weeks of decisions, counted once.

``decision_week``: the dashboard's chart counted every opt-in and opt-out of its twelve
weeks at each view, a grouped count over all the consent log's preference changes of
those weeks (millions at scale). A week's counts are final once no event recorded in it
can still commit, so each past week is counted once and kept here
(``portal.compliance.services.weekly_decisions``); only the current week is counted at
each view. Empty when this migration runs: the first view counts the past weeks once.

Revision ID: 0037
Revises: 0036
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0037"
down_revision = "0036"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "decision_week",
        sa.Column("week", sa.Date(), nullable=False),
        sa.Column("counts", sa.JSON(), nullable=False),
        sa.Column("counted_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("week", name=op.f("pk_decision_week")),
    )


def downgrade() -> None:
    op.drop_table("decision_week")
