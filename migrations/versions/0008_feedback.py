"""Delivery feedback: digests received and the markers of applied cleanups.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def _when() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "feedback_digest",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("received_at", _when(), nullable=False),
        sa.Column("organization", sa.String(128), nullable=True),
        sa.Column("result", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(64), nullable=True),
        sa.Column("secret_index", sa.SmallInteger(), nullable=True),
        sa.Column("signed_at", _when(), nullable=True),
        sa.Column("events", sa.Integer(), server_default="0", nullable=False),
        sa.Column("applied", sa.Integer(), server_default="0", nullable=False),
        sa.Column("revoked", sa.Integer(), server_default="0", nullable=False),
        sa.Column("duplicates", sa.Integer(), server_default="0", nullable=False),
        sa.Column("ignored", sa.Integer(), server_default="0", nullable=False),
        sa.Column("truncated", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("events_omitted", sa.Integer(), nullable=True),
        sa.CheckConstraint(
            "result IN ('accepted', 'rejected')", name=op.f("ck_feedback_digest_result")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_feedback_digest")),
    )
    op.create_index(op.f("ix_feedback_digest_received_at"), "feedback_digest", ["received_at"])
    op.create_table(
        "feedback_applied",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("organization", sa.String(128), nullable=False),
        sa.Column("event_key_hash", sa.LargeBinary(32), nullable=False),
        sa.Column("key_kind", sa.String(16), nullable=False),
        sa.Column("delivery_id", sa.String(128), nullable=True),
        sa.Column("provider", sa.String(64), nullable=False),
        sa.Column("target_hash", sa.LargeBinary(32), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("subscription_id", sa.Uuid(), nullable=True),
        sa.Column("digest_id", sa.Uuid(), nullable=True),
        sa.Column("applied_at", _when(), nullable=False),
        sa.CheckConstraint(
            "length(event_key_hash) = 32 AND length(target_hash) = 32",
            name=op.f("ck_feedback_applied_hash_len"),
        ),
        sa.CheckConstraint(
            "key_kind IN ('delivery', 'classic')", name=op.f("ck_feedback_applied_key_kind")
        ),
        sa.CheckConstraint(
            "outcome IN ('revoked', 'unmatched', 'already_ended')",
            name=op.f("ck_feedback_applied_outcome"),
        ),
        sa.ForeignKeyConstraint(
            ["digest_id"],
            ["feedback_digest.id"],
            name=op.f("fk_feedback_applied_digest_id_feedback_digest"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["subscription_id"],
            ["push_subscription.id"],
            name=op.f("fk_feedback_applied_subscription_id_push_subscription"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_feedback_applied")),
        # One marker per event key and organization: concurrent duplicates apply once.
        sa.UniqueConstraint(
            "organization", "event_key_hash", name=op.f("uq_feedback_applied_organization")
        ),
    )
    op.create_index(
        op.f("ix_feedback_applied_subscription_id"), "feedback_applied", ["subscription_id"]
    )
    op.create_index(op.f("ix_feedback_applied_digest_id"), "feedback_applied", ["digest_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_feedback_applied_digest_id"), table_name="feedback_applied")
    op.drop_index(op.f("ix_feedback_applied_subscription_id"), table_name="feedback_applied")
    op.drop_table("feedback_applied")
    op.drop_index(op.f("ix_feedback_digest_received_at"), table_name="feedback_digest")
    op.drop_table("feedback_digest")
