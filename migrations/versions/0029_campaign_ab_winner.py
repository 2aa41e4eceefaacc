"""A/B tests that send the winner to the rest: campaign.test_share, winner_after, winner.

A campaign with variants may test them on a share of its audience (``test_share``, a
percentage) and, ``winner_after`` seconds after its send time, send the variant with the
best click-through rate (``winner``, 0 = A, set then with ``winner_chosen_at``) to
everyone else, whose deliveries wait until then (portal/campaigns/variants.py).

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("campaign", sa.Column("test_share", sa.SmallInteger(), nullable=True))
    op.add_column("campaign", sa.Column("winner_after", sa.Integer(), nullable=True))
    op.add_column("campaign", sa.Column("winner", sa.SmallInteger(), nullable=True))
    op.add_column("campaign", sa.Column("winner_chosen_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    with op.batch_alter_table("campaign") as batch:
        for column in ("winner_chosen_at", "winner", "winner_after", "test_share"):
            batch.drop_column(column)
