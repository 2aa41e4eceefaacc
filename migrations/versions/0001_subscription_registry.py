"""Subscribers and the push subscription registry.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

STATES = ("pending", "active", "stale", "expired", "revoked")
LIVE = "state IN ('pending', 'active') AND deleted_at IS NULL"


def _when() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "subscriber",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("external_user_id", sa.String(255), nullable=True),
        sa.Column("region_code", sa.String(8), nullable=True),
        sa.Column("locale", sa.String(35), nullable=True),
        sa.Column("created_at", _when(), nullable=False),
        sa.Column("erased_at", _when(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_subscriber")),
        sa.UniqueConstraint("external_user_id", name=op.f("uq_subscriber_external_user_id")),
    )
    op.create_table(
        "push_subscription",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("endpoint", sa.Text(), nullable=True),
        sa.Column("endpoint_hash", sa.LargeBinary(32), nullable=False),
        sa.Column("push_service", sa.String(16), nullable=False),
        sa.Column("p256dh", sa.String(96), nullable=True),
        sa.Column("auth_sealed", sa.LargeBinary(64), nullable=True),
        sa.Column("auth_key_version", sa.SmallInteger(), nullable=False),
        sa.Column("content_encoding", sa.String(16), server_default="aes128gcm", nullable=False),
        sa.Column("expiration_time", _when(), nullable=True),
        sa.Column("subscriber_id", sa.Uuid(), nullable=True),
        sa.Column("user_agent", sa.String(400), nullable=True),
        sa.Column("locale", sa.String(35), nullable=True),
        sa.Column("origin", sa.String(255), nullable=False),
        sa.Column(
            "state",
            sa.Enum(*STATES, name="push_subscription_state", create_constraint=True),
            nullable=False,
        ),
        sa.Column("created_at", _when(), nullable=False),
        sa.Column("last_seen_at", _when(), nullable=False),
        sa.Column("last_success_at", _when(), nullable=True),
        sa.Column("last_failure_at", _when(), nullable=True),
        sa.Column("last_status_code", sa.SmallInteger(), nullable=True),
        sa.Column("consecutive_failures", sa.SmallInteger(), server_default="0", nullable=False),
        sa.Column("revoked_at", _when(), nullable=True),
        sa.Column("end_reason", sa.String(32), nullable=True),
        sa.Column("deleted_at", _when(), nullable=True),
        sa.CheckConstraint(
            "length(endpoint_hash) = 32", name=op.f("ck_push_subscription_endpoint_hash_len")
        ),
        sa.CheckConstraint(
            "length(p256dh) BETWEEN 80 AND 96", name=op.f("ck_push_subscription_p256dh_len")
        ),
        sa.CheckConstraint(
            "deleted_at IS NOT NULL OR "
            "(endpoint IS NOT NULL AND p256dh IS NOT NULL AND auth_sealed IS NOT NULL)",
            name=op.f("ck_push_subscription_live_has_credentials"),
        ),
        sa.CheckConstraint(
            "push_service IN ('fcm', 'autopush', 'apple', 'wns', 'other')",
            name=op.f("ck_push_subscription_push_service"),
        ),
        sa.CheckConstraint(
            "consecutive_failures >= 0", name=op.f("ck_push_subscription_failures_not_negative")
        ),
        sa.ForeignKeyConstraint(
            ["subscriber_id"],
            ["subscriber.id"],
            name=op.f("fk_push_subscription_subscriber_id_subscriber"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_push_subscription")),
        sa.UniqueConstraint("endpoint_hash", name=op.f("uq_push_subscription_endpoint_hash")),
    )
    op.create_index(
        "ix_push_subscription_subscriber_live",
        "push_subscription",
        ["subscriber_id"],
        postgresql_where=sa.text(LIVE),
        sqlite_where=sa.text(LIVE),
    )
    op.create_index(
        "ix_push_subscription_sweep",
        "push_subscription",
        ["state", "last_seen_at"],
        postgresql_where=sa.text("deleted_at IS NULL"),
        sqlite_where=sa.text("deleted_at IS NULL"),
    )
    op.create_index(
        "ix_push_subscription_service",
        "push_subscription",
        ["push_service", "state"],
        postgresql_where=sa.text("deleted_at IS NULL"),
        sqlite_where=sa.text("deleted_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_push_subscription_service", table_name="push_subscription")
    op.drop_index("ix_push_subscription_sweep", table_name="push_subscription")
    op.drop_index("ix_push_subscription_subscriber_live", table_name="push_subscription")
    op.drop_table("push_subscription")
    op.drop_table("subscriber")
    sa.Enum(name="push_subscription_state").drop(op.get_bind(), checkfirst=True)
