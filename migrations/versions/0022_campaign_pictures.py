"""campaign_picture: pictures staff upload for a campaign's icon, image or badge.

Named by the SHA-256 of their bytes and served at /media/<sha256>.<extension>
(portal/campaigns/media.py): PNG, JPEG, GIF or WebP, checked before they are stored.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "campaign_picture",
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("content_type", sa.String(16), nullable=False),
        sa.Column("width", sa.Integer(), nullable=False),
        sa.Column("height", sa.Integer(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("uploaded_by", sa.Uuid(), nullable=True),
        sa.Column("uploaded_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "content_type IN ('image/png', 'image/jpeg', 'image/gif', 'image/webp')",
            name=op.f("ck_campaign_picture_content_type"),
        ),
        sa.CheckConstraint("length(sha256) = 64", name=op.f("ck_campaign_picture_sha256_len")),
        sa.ForeignKeyConstraint(
            ["uploaded_by"],
            ["staff_user.id"],
            name=op.f("fk_campaign_picture_uploaded_by_staff_user"),
        ),
        sa.PrimaryKeyConstraint("sha256", name=op.f("pk_campaign_picture")),
    )


def downgrade() -> None:
    op.drop_table("campaign_picture")
