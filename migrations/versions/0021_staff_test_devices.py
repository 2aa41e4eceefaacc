"""staff_test_device and staff_test_send: browsers staff registered for campaign tests.

Two new tables (portal/campaigns/testdevices.py). A test device belongs to a member of
staff, not to a subscriber: nothing about consent, audiences or deliveries refers to it.
Its credentials are kept as ``push_subscription`` keeps them (canonical endpoint, its
SHA-256, p256dh, the auth secret sealed with the subscription key ring). A test send
keeps the form as it was sent and each device's answer; it is what the per-person rate
limit counts.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def _when() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "staff_test_device",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("staff_user_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(60), nullable=False),
        sa.Column("name_key", sa.String(180), nullable=False),
        sa.Column("endpoint", sa.Text(), nullable=False),
        sa.Column("endpoint_hash", sa.LargeBinary(32), nullable=False),
        sa.Column("push_service", sa.String(16), nullable=False),
        sa.Column("p256dh", sa.String(96), nullable=False),
        sa.Column("auth_sealed", sa.LargeBinary(64), nullable=False),
        sa.Column("auth_key_version", sa.SmallInteger(), nullable=False),
        sa.Column("user_agent", sa.String(400), nullable=True),
        sa.Column("created_at", _when(), nullable=False),
        sa.Column("last_tested_at", _when(), nullable=True),
        sa.Column("last_result", sa.String(16), nullable=True),
        sa.Column("last_status", sa.SmallInteger(), nullable=True),
        sa.Column("gone_at", _when(), nullable=True),
        sa.CheckConstraint(
            "length(endpoint_hash) = 32", name=op.f("ck_staff_test_device_endpoint_hash_len")
        ),
        sa.CheckConstraint(
            "last_result IN ('sent', 'gone', 'error')",
            name=op.f("ck_staff_test_device_last_result"),
        ),
        sa.ForeignKeyConstraint(
            ["staff_user_id"],
            ["staff_user.id"],
            name=op.f("fk_staff_test_device_staff_user_id_staff_user"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_staff_test_device")),
    )
    op.create_index(
        "ix_staff_test_device_name",
        "staff_test_device",
        ["staff_user_id", "name_key"],
        unique=True,
    )
    op.create_index(
        "ix_staff_test_device_endpoint",
        "staff_test_device",
        ["staff_user_id", "endpoint_hash"],
        unique=True,
    )
    op.create_table(
        "staff_test_send",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("staff_user_id", sa.Uuid(), nullable=False),
        sa.Column("sent_at", _when(), nullable=False),
        sa.Column("fields", sa.JSON(), nullable=False),
        sa.Column("outcomes", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["staff_user_id"],
            ["staff_user.id"],
            name=op.f("fk_staff_test_send_staff_user_id_staff_user"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_staff_test_send")),
    )
    op.create_index(
        "ix_staff_test_send_staff_sent_at", "staff_test_send", ["staff_user_id", "sent_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_staff_test_send_staff_sent_at", table_name="staff_test_send")
    op.drop_table("staff_test_send")
    op.drop_index("ix_staff_test_device_endpoint", table_name="staff_test_device")
    op.drop_index("ix_staff_test_device_name", table_name="staff_test_device")
    op.drop_table("staff_test_device")
