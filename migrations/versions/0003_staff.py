"""Staff accounts, roles, sessions, sign-in throttles and the append-only audit trail.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

ROLE_CHECK = "role IN ('admin', 'compliance', 'campaigns')"

# staff_audit is append-only: the database itself refuses changes, whoever asks.
PG_APPEND_ONLY = """
CREATE FUNCTION staff_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'staff_audit is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$
"""
PG_TRIGGERS = (
    "CREATE TRIGGER staff_audit_no_update_delete BEFORE UPDATE OR DELETE ON staff_audit "
    "FOR EACH ROW EXECUTE FUNCTION staff_audit_append_only()",
    "CREATE TRIGGER staff_audit_no_truncate BEFORE TRUNCATE ON staff_audit "
    "FOR EACH STATEMENT EXECUTE FUNCTION staff_audit_append_only()",
)
SQLITE_TRIGGERS = (
    "CREATE TRIGGER staff_audit_no_update BEFORE UPDATE ON staff_audit "
    "BEGIN SELECT RAISE(ABORT, 'staff_audit is append-only: UPDATE refused'); END",
    "CREATE TRIGGER staff_audit_no_delete BEFORE DELETE ON staff_audit "
    "BEGIN SELECT RAISE(ABORT, 'staff_audit is append-only: DELETE refused'); END",
)


def _when() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "staff_user",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("email", sa.String(254), nullable=False),
        sa.Column("password_hash", sa.String(255), nullable=False),
        sa.Column("created_at", _when(), nullable=False),
        sa.Column("disabled_at", _when(), nullable=True),
        sa.Column("failed_logins", sa.SmallInteger(), server_default="0", nullable=False),
        sa.Column("locked_until", _when(), nullable=True),
        sa.Column("last_login_at", _when(), nullable=True),
        sa.CheckConstraint("email = lower(email)", name=op.f("ck_staff_user_email_lowercase")),
        sa.CheckConstraint(
            "failed_logins >= 0", name=op.f("ck_staff_user_failed_logins_not_negative")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_staff_user")),
        sa.UniqueConstraint("email", name=op.f("uq_staff_user_email")),
    )
    op.create_table(
        "staff_role",
        sa.Column("staff_user_id", sa.Uuid(), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.CheckConstraint(ROLE_CHECK, name=op.f("ck_staff_role_role")),
        sa.ForeignKeyConstraint(
            ["staff_user_id"],
            ["staff_user.id"],
            name=op.f("fk_staff_role_staff_user_id_staff_user"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("staff_user_id", "role", name=op.f("pk_staff_role")),
    )
    op.create_index("ix_staff_role_role", "staff_role", ["role"])
    op.create_table(
        "staff_session",
        sa.Column("id", sa.LargeBinary(32), nullable=False),
        sa.Column("staff_user_id", sa.Uuid(), nullable=False),
        sa.Column("created_at", _when(), nullable=False),
        sa.Column("last_seen_at", _when(), nullable=False),
        sa.Column("expires_at", _when(), nullable=False),
        sa.CheckConstraint("length(id) = 32", name=op.f("ck_staff_session_id_len")),
        sa.ForeignKeyConstraint(
            ["staff_user_id"],
            ["staff_user.id"],
            name=op.f("fk_staff_session_staff_user_id_staff_user"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_staff_session")),
    )
    op.create_index("ix_staff_session_staff_user_id", "staff_session", ["staff_user_id"])
    op.create_index("ix_staff_session_expires_at", "staff_session", ["expires_at"])
    op.create_table(
        "staff_login_throttle",
        sa.Column("key", sa.LargeBinary(32), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("window_started_at", _when(), nullable=False),
        sa.Column("locked_until", _when(), nullable=True),
        sa.CheckConstraint(
            "kind IN ('address', 'email')", name=op.f("ck_staff_login_throttle_kind")
        ),
        sa.CheckConstraint(
            "attempts >= 0", name=op.f("ck_staff_login_throttle_attempts_not_negative")
        ),
        sa.CheckConstraint("length(key) = 32", name=op.f("ck_staff_login_throttle_key_len")),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_staff_login_throttle")),
    )
    op.create_table(
        "staff_audit",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("at", _when(), nullable=False),
        sa.Column("actor_id", sa.Uuid(), nullable=True),
        sa.Column("actor_email", sa.String(254), nullable=True),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(255), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["actor_id"], ["staff_user.id"], name=op.f("fk_staff_audit_actor_id_staff_user")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_staff_audit")),
    )
    op.create_index("ix_staff_audit_at", "staff_audit", ["at"])
    op.create_index("ix_staff_audit_action", "staff_audit", ["action", "id"])
    op.create_index("ix_staff_audit_actor_email", "staff_audit", ["actor_email", "id"])

    if op.get_bind().dialect.name == "postgresql":
        op.execute(PG_APPEND_ONLY)
        for statement in PG_TRIGGERS:
            op.execute(statement)
    else:
        for statement in SQLITE_TRIGGERS:
            op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS staff_audit_no_truncate ON staff_audit")
        op.execute("DROP TRIGGER IF EXISTS staff_audit_no_update_delete ON staff_audit")
        op.execute("DROP FUNCTION IF EXISTS staff_audit_append_only()")
    else:
        op.execute("DROP TRIGGER IF EXISTS staff_audit_no_delete")
        op.execute("DROP TRIGGER IF EXISTS staff_audit_no_update")
    op.drop_index("ix_staff_audit_actor_email", table_name="staff_audit")
    op.drop_index("ix_staff_audit_action", table_name="staff_audit")
    op.drop_index("ix_staff_audit_at", table_name="staff_audit")
    op.drop_table("staff_audit")
    op.drop_table("staff_login_throttle")
    op.drop_index("ix_staff_session_expires_at", table_name="staff_session")
    op.drop_index("ix_staff_session_staff_user_id", table_name="staff_session")
    op.drop_table("staff_session")
    op.drop_index("ix_staff_role_role", table_name="staff_role")
    op.drop_table("staff_role")
    op.drop_table("staff_user")
