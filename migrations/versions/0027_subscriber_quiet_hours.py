"""subscriber.quiet_from and subscriber.quiet_until: a person's own quiet hours.

"Do not send between …" in the preference centre: local times in the person's zone
during which their marketing notifications wait (portal/delivery/quiet.py); both or
neither. A change is a ``quiet_hours_chosen`` consent event.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

_BOTH_OR_NEITHER = "(quiet_from IS NULL) = (quiet_until IS NULL)"


def upgrade() -> None:
    with op.batch_alter_table("subscriber") as batch:
        batch.add_column(sa.Column("quiet_from", sa.Time(), nullable=True))
        batch.add_column(sa.Column("quiet_until", sa.Time(), nullable=True))
        batch.create_check_constraint(op.f("ck_subscriber_quiet_hours"), _BOTH_OR_NEITHER)


def downgrade() -> None:
    with op.batch_alter_table("subscriber") as batch:
        batch.drop_constraint(op.f("ck_subscriber_quiet_hours"), type_="check")
        batch.drop_column("quiet_until")
        batch.drop_column("quiet_from")
