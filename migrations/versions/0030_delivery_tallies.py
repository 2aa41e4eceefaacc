"""Delivery retention: delivery_tally and funnel_tally.

Deliveries of a campaign that finished more than DELIVERY_RETENTION_MONTHS ago are
folded into these per-campaign counters and deleted (portal/campaigns/tally.py), so the
campaign's pages show the same figures without them.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def _id() -> sa.Column[int]:
    return sa.Column(
        "id",
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
        autoincrement=True,
        nullable=False,
    )


def upgrade() -> None:
    op.create_table(
        "delivery_tally",
        _id(),
        sa.Column("campaign_id", sa.Uuid(), nullable=False),
        sa.Column("status", sa.String(10), nullable=False),
        sa.Column("reason", sa.String(64), nullable=True),
        sa.Column("last_status_code", sa.SmallInteger(), nullable=True),
        sa.Column("push_service", sa.String(16), nullable=False),
        sa.Column("variant", sa.SmallInteger(), nullable=True),
        sa.Column("deliveries", sa.BigInteger(), nullable=False),
        sa.Column("most_attempts", sa.SmallInteger(), nullable=False),
        sa.Column("retried", sa.BigInteger(), nullable=False),
        sa.Column("shown", sa.BigInteger(), nullable=False),
        sa.Column("clicked", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["campaign_id"], ["campaign.id"], name=op.f("fk_delivery_tally_campaign_id_campaign")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_delivery_tally")),
    )
    op.create_index(op.f("ix_delivery_tally_campaign_id"), "delivery_tally", ["campaign_id"])
    op.create_table(
        "funnel_tally",
        _id(),
        sa.Column("campaign_id", sa.Uuid(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("at", sa.BigInteger(), nullable=True),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["campaign_id"], ["campaign.id"], name=op.f("fk_funnel_tally_campaign_id_campaign")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_funnel_tally")),
    )
    op.create_index(op.f("ix_funnel_tally_campaign_id"), "funnel_tally", ["campaign_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_funnel_tally_campaign_id"), table_name="funnel_tally")
    op.drop_table("funnel_tally")
    op.drop_index(op.f("ix_delivery_tally_campaign_id"), table_name="delivery_tally")
    op.drop_table("delivery_tally")
