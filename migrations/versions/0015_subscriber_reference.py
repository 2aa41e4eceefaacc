"""subscriber.reference: the short reference a person reads on their preference centre
and quotes to staff, who find them by it.

Nullable without a default (no table rewrite): a person is given one the first time their
preference centre shows it. Every row is NULL when the unique index is built, so it cannot
fail on existing data. Not built CONCURRENTLY: that waits for every other open
transaction, among them those of processes queued on the migration lock, which wait in
turn for this one.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("subscriber", sa.Column("reference", sa.String(8), nullable=True))
    op.create_index("ix_subscriber_reference", "subscriber", ["reference"], unique=True)


def downgrade() -> None:
    op.drop_index("ix_subscriber_reference", table_name="subscriber")
    op.drop_column("subscriber", "reference")
