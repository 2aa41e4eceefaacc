"""Campaigns, deliveries and push-service circuits.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def _when() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "campaign",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("topic_id", sa.Integer(), nullable=False),
        sa.Column("title", sa.String(200), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("url", sa.String(2048), nullable=True),
        sa.Column("icon", sa.String(2048), nullable=True),
        sa.Column("urgency", sa.String(8), nullable=False),
        sa.Column("ttl", sa.Integer(), nullable=False),
        sa.Column("collapse_key", sa.String(32), nullable=True),
        sa.Column("send_at", _when(), nullable=False),
        sa.Column("deliver_until", _when(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_by", sa.String(255), nullable=False),
        sa.Column("created_at", _when(), nullable=False),
        sa.Column("launched_at", _when(), nullable=True),
        sa.Column("finished_at", _when(), nullable=True),
        sa.Column("materialised_through", sa.Uuid(), nullable=True),
        sa.Column("materialised_at", _when(), nullable=True),
        sa.Column("is_test", sa.Boolean(), nullable=False),
        sa.CheckConstraint(
            "status IN ('scheduled', 'sending', 'paused', 'completed', 'cancelled', 'expired')",
            name=op.f("ck_campaign_status"),
        ),
        sa.CheckConstraint(
            "urgency IN ('very-low', 'low', 'normal', 'high')", name=op.f("ck_campaign_urgency")
        ),
        sa.CheckConstraint("ttl >= 0", name=op.f("ck_campaign_ttl")),
        sa.ForeignKeyConstraint(
            ["topic_id"], ["topic.id"], name=op.f("fk_campaign_topic_id_topic")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_campaign")),
    )
    op.create_index("ix_campaign_status_send_at", "campaign", ["status", "send_at"])
    op.create_table(
        "delivery",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("campaign_id", sa.Uuid(), nullable=False),
        sa.Column("subscription_id", sa.Uuid(), nullable=False),
        sa.Column("push_service", sa.String(16), nullable=False),
        sa.Column("status", sa.String(10), nullable=False),
        sa.Column("attempts", sa.SmallInteger(), nullable=False),
        sa.Column("next_attempt_at", _when(), nullable=False),
        sa.Column("lease_expires_at", _when(), nullable=True),
        sa.Column("last_status_code", sa.SmallInteger(), nullable=True),
        sa.Column("reason", sa.String(64), nullable=True),
        sa.Column("consent_reason", sa.String(32), nullable=False),
        sa.Column("consent_event_seq", sa.BigInteger(), nullable=True),
        sa.Column("updated_at", _when(), nullable=False),
        sa.CheckConstraint(
            "status IN ('queued', 'sending', 'accepted', 'failed', 'revoked', 'skipped')",
            name=op.f("ck_delivery_status"),
        ),
        sa.ForeignKeyConstraint(
            ["campaign_id"], ["campaign.id"], name=op.f("fk_delivery_campaign_id_campaign")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_delivery")),
        sa.UniqueConstraint(
            "campaign_id", "subscription_id", name="uq_delivery_campaign_subscription"
        ),
    )
    op.create_index("ix_delivery_claim", "delivery", ["campaign_id", "status", "next_attempt_at"])
    op.create_index("ix_delivery_subscription_id", "delivery", ["subscription_id"])
    op.create_table(
        "push_circuit",
        sa.Column("push_service", sa.String(16), nullable=False),
        sa.Column("open_until", _when(), nullable=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("opened_at", _when(), nullable=False),
        sa.PrimaryKeyConstraint("push_service", name=op.f("pk_push_circuit")),
    )


def downgrade() -> None:
    op.drop_table("push_circuit")
    op.drop_index("ix_delivery_subscription_id", table_name="delivery")
    op.drop_index("ix_delivery_claim", table_name="delivery")
    op.drop_table("delivery")
    op.drop_index("ix_campaign_status_send_at", table_name="campaign")
    op.drop_table("campaign")
