"""Topics, policy versions, preferences and the append-only consent log.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# Tables whose rows the application may add but never change or remove.
GUARDED = {
    "consent_event": "the consent log is append-only",
    "policy_version": "a published policy text is immutable",
}


def _when() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def _guard(dialect: str) -> None:
    if dialect == "postgresql":
        op.execute(
            """
            CREATE FUNCTION consent_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION '%: % refused on %', TG_ARGV[0], TG_OP, TG_TABLE_NAME
                    USING ERRCODE = 'insufficient_privilege';
            END
            $$
            """
        )
        for table, why in GUARDED.items():
            op.execute(
                f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                f"FOR EACH ROW EXECUTE FUNCTION consent_refuse_change('{why}')"
            )
            op.execute(
                f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
                f"FOR EACH STATEMENT EXECUTE FUNCTION consent_refuse_change('{why}')"
            )
    else:
        for table, why in GUARDED.items():
            for operation in ("UPDATE", "DELETE"):
                op.execute(
                    f"CREATE TRIGGER {table}_no_{operation.lower()} BEFORE {operation} ON {table} "
                    f"BEGIN SELECT RAISE(ABORT, '{why}: {operation} refused on {table}'); END"
                )


def upgrade() -> None:
    op.create_table(
        "topic",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("slug", sa.String(64), nullable=False),
        sa.Column("category", sa.String(64), nullable=False),
        sa.Column("label", sa.String(120), nullable=False),
        sa.Column("description", sa.Text(), server_default="", nullable=False),
        sa.Column("is_transactional", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("default_state", sa.String(8), server_default="opt_out", nullable=False),
        sa.Column("position", sa.Integer(), server_default="0", nullable=False),
        sa.Column("created_at", _when(), nullable=False),
        sa.Column("retired_at", _when(), nullable=True),
        sa.CheckConstraint(
            "default_state IN ('opt_in', 'opt_out')", name=op.f("ck_topic_default_state")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_topic")),
        sa.UniqueConstraint("slug", name=op.f("uq_topic_slug")),
    )
    op.create_table(
        "policy_version",
        sa.Column("version", sa.String(32), nullable=False),
        sa.Column("published_at", _when(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("text_sha256", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("version", name=op.f("pk_policy_version")),
    )
    op.create_table(
        "topic_preference",
        sa.Column("subscriber_id", sa.Uuid(), nullable=False),
        sa.Column("topic_id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(8), nullable=False),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("policy_version", sa.String(32), nullable=True),
        sa.Column("decided_at", _when(), nullable=False),
        sa.Column("recorded_at", _when(), nullable=False),
        sa.Column("event_seq", sa.BigInteger(), nullable=False),
        sa.CheckConstraint(
            "state IN ('opt_in', 'opt_out', 'unset')", name=op.f("ck_topic_preference_state")
        ),
        sa.ForeignKeyConstraint(
            ["policy_version"],
            ["policy_version.version"],
            name=op.f("fk_topic_preference_policy_version_policy_version"),
        ),
        sa.ForeignKeyConstraint(
            ["subscriber_id"],
            ["subscriber.id"],
            name=op.f("fk_topic_preference_subscriber_id_subscriber"),
        ),
        sa.ForeignKeyConstraint(
            ["topic_id"], ["topic.id"], name=op.f("fk_topic_preference_topic_id_topic")
        ),
        sa.PrimaryKeyConstraint("subscriber_id", "topic_id", name=op.f("pk_topic_preference")),
    )
    op.create_index(
        "ix_topic_preference_opt_in",
        "topic_preference",
        ["topic_id", "subscriber_id"],
        postgresql_where=sa.text("state = 'opt_in'"),
        sqlite_where=sa.text("state = 'opt_in'"),
    )
    op.create_table(
        "consent_event",
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("subscriber_id", sa.Uuid(), nullable=False),
        sa.Column("subscription_id", sa.Uuid(), nullable=True),
        sa.Column("topic_id", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("previous_state", sa.String(16), nullable=True),
        sa.Column("new_state", sa.String(16), nullable=True),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("policy_version", sa.String(32), nullable=True),
        sa.Column("decided_at", _when(), nullable=False),
        sa.Column("recorded_at", _when(), nullable=False),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("context", sa.Text(), nullable=False),
        sa.Column("prev_hash", sa.LargeBinary(32), nullable=False),
        sa.Column("hash", sa.LargeBinary(32), nullable=False),
        sa.CheckConstraint(
            "length(hash) = 32 AND length(prev_hash) = 32", name=op.f("ck_consent_event_hash_len")
        ),
        sa.ForeignKeyConstraint(
            ["topic_id"], ["topic.id"], name=op.f("fk_consent_event_topic_id_topic")
        ),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_consent_event")),
        sa.UniqueConstraint("hash", name=op.f("uq_consent_event_hash")),
        sa.UniqueConstraint("prev_hash", name=op.f("uq_consent_event_prev_hash")),
    )
    op.create_index("ix_consent_event_subscriber_id", "consent_event", ["subscriber_id"])
    op.create_index("ix_consent_event_recorded_at", "consent_event", ["recorded_at"])
    # Nullable, no default: an online change on a large table.
    op.add_column("push_subscription", sa.Column("grant_event_seq", sa.BigInteger(), nullable=True))
    _guard(op.get_bind().dialect.name)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        for table in GUARDED:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
            op.execute(f"DROP TRIGGER IF EXISTS {table}_no_truncate ON {table}")
        op.execute("DROP FUNCTION IF EXISTS consent_refuse_change()")
    op.drop_column("push_subscription", "grant_event_seq")  # SQLite 3.35+ drops in place
    op.drop_index("ix_consent_event_recorded_at", table_name="consent_event")
    op.drop_index("ix_consent_event_subscriber_id", table_name="consent_event")
    op.drop_table("consent_event")
    op.drop_index("ix_topic_preference_opt_in", table_name="topic_preference")
    op.drop_table("topic_preference")
    op.drop_table("policy_version")
    op.drop_table("topic")
