"""staff_user.must_replace_password, and who acted on the command line in staff_audit.

``must_replace_password``: an account whose password someone else chose (an admin in the
console, or whoever ran ``portal create-staff``) is asked for a new one at first sign-in
and can use no other staff page until then. Existing accounts are not flagged.

``staff_audit.actor_via`` / ``actor_os_user``: ``cli`` and the operating-system user for
what a ``portal …`` command did. Nullable columns without a default: no table rewrite,
and the append-only triggers stay as they are (no existing row is touched).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "staff_user",
        sa.Column("must_replace_password", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.add_column("staff_audit", sa.Column("actor_via", sa.String(16), nullable=True))
    op.add_column("staff_audit", sa.Column("actor_os_user", sa.String(64), nullable=True))


def downgrade() -> None:
    op.drop_column("staff_audit", "actor_os_user")
    op.drop_column("staff_audit", "actor_via")
    op.drop_column("staff_user", "must_replace_password")
