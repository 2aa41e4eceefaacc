"""Rate limits on the JSON API: rate_limit_counter, one row per counted key.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rate_limit_counter",
        sa.Column("key", sa.LargeBinary(32), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("hits", sa.Integer(), nullable=False),
        sa.CheckConstraint("hits >= 1", name=op.f("ck_rate_limit_counter_hits_positive")),
        sa.CheckConstraint("length(key) = 32", name=op.f("ck_rate_limit_counter_key_len")),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_rate_limit_counter")),
    )
    op.create_index("ix_rate_limit_counter_window_start", "rate_limit_counter", ["window_start"])


def downgrade() -> None:
    op.drop_index("ix_rate_limit_counter_window_start", table_name="rate_limit_counter")
    op.drop_table("rate_limit_counter")
