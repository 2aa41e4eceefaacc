"""Indexes for the compliance officer's pages among millions: an account ID's start, the erased.

``ix_subscriber_external_user_id_prefix``: the look-up finds everyone whose account ID
is the text typed or starts with it (``external_user_id LIKE 'text%'``). PostgreSQL
reads a b-tree for a LIKE prefix only when the index orders strings byte by byte; the
unique constraint's index follows the database's collation (``en_US.UTF-8``,
``C.UTF-8``: not byte order to the planner), so every search read the whole subscriber
table, the exact match included, the two being one OR. This index uses
``text_pattern_ops`` (byte order whatever the collation). On SQLite it is a plain index,
kept so that the schema is the same on both.

``ix_subscriber_erased``: the dashboard counts the erased people's devices not yet
tombstoned or told; erased people are few among everyone, and no index named them, so
each view of the dashboard read the whole subscriber table.

Built in the migration's transaction, not CONCURRENTLY, as 0017 explains.

Revision ID: 0035
Revises: 0034
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_subscriber_external_user_id_prefix",
        "subscriber",
        ["external_user_id"],
        postgresql_ops={"external_user_id": "text_pattern_ops"},
    )
    op.create_index(
        "ix_subscriber_erased",
        "subscriber",
        ["erased_at"],
        postgresql_where=sa.text("erased_at IS NOT NULL"),
        sqlite_where=sa.text("erased_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_subscriber_erased", table_name="subscriber")
    op.drop_index("ix_subscriber_external_user_id_prefix", table_name="subscriber")
