"""Job coordination and history; retention counters.

Revision ID: 0006
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0003"
branch_labels = None
depends_on = None


def _when() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    # Nullable, no default: online on a large table.
    op.add_column("push_subscription", sa.Column("stale_at", _when(), nullable=True))
    op.add_column("push_subscription", sa.Column("ended_at", _when(), nullable=True))
    op.create_table(
        "job_state",
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("next_run_at", _when(), nullable=False),
        sa.Column("last_started_at", _when(), nullable=True),
        sa.Column("last_finished_at", _when(), nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_job_state")),
    )
    op.create_table(
        "job_run",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("trigger", sa.String(16), nullable=False),
        sa.Column("host", sa.String(128), nullable=False),
        sa.Column("started_at", _when(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=True),
        sa.Column("processed", sa.Integer(), nullable=False),
        sa.Column("changed", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_run")),
    )
    op.create_index("ix_job_run_name_started_at", "job_run", ["name", "started_at"])
    op.create_table(
        "retention_counter",
        sa.Column("month", sa.String(7), nullable=False),
        sa.Column("push_service", sa.String(16), nullable=False),
        sa.Column("end_reason", sa.String(32), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "month", "push_service", "end_reason", name=op.f("pk_retention_counter")
        ),
    )


def downgrade() -> None:
    op.drop_table("retention_counter")
    op.drop_index("ix_job_run_name_started_at", table_name="job_run")
    op.drop_table("job_run")
    op.drop_table("job_state")
    op.drop_column("push_subscription", "ended_at")
    op.drop_column("push_subscription", "stale_at")
