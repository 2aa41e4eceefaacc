"""Display receipts from the service worker: delivery_receipt.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "delivery_receipt",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("delivery_id", sa.String(64), nullable=False),
        sa.Column("event", sa.String(16), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("endpoint_hash", sa.LargeBinary(32), nullable=True),
        sa.CheckConstraint("event IN ('shown', 'clicked')", name=op.f("ck_delivery_receipt_event")),
        sa.CheckConstraint(
            "endpoint_hash IS NULL OR length(endpoint_hash) = 32",
            name=op.f("ck_delivery_receipt_endpoint_hash_len"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_delivery_receipt")),
        sa.UniqueConstraint(
            "delivery_id", "event", name=op.f("uq_delivery_receipt_delivery_event")
        ),
    )


def downgrade() -> None:
    op.drop_table("delivery_receipt")
