"""The consent log becomes a Merkle tree: a sequence for appends, the tree's nodes, the
sequencer's state and the signed tree heads.

Appends no longer chain: each event takes its ``seq`` from the sequence
``consent_event_seq`` (PostgreSQL; on SQLite writes are serialised and the writer takes
``max(seq) + 1``) and commits on its own, with no global lock. The sequencer
(``portal.consent.tree``) integrates committed events into the tree in ``seq`` order.

``hash`` and ``prev_hash`` stay, readable and verified, for the events written before this
migration (the hash chain's history); events written after it leave them NULL. Every
event, old or new, is one leaf of the tree: leaf ``seq - 1`` is the RFC 9162 leaf hash of
the event's canonical bytes. The existing events become the tree's first leaves at the
sequencer's first run, as any committed event does.

- ``consent_log_node``: every complete subtree (level, index, hash); level 0 is the
  leaves, indexed by hash for inclusion proofs by leaf hash.
- ``consent_log_state``: one row: the tree's size, its frontier (``merkle.Frontier``
  bytes), and the first open gap the sequencer is waiting on. Its row lock is what keeps
  two sequencers from integrating the same leaf.
- ``consent_tree_head``: every signed tree head, one per size.

The new tables are append-only like the log, except the state row, which the sequencer
updates.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_GUARDED = {
    "consent_log_node": "the consent log tree is append-only",
    "consent_tree_head": "a signed tree head is immutable",
}
_EVENT_GUARD = "the consent log is append-only"


def _when() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def _sqlite_guard(table: str, why: str) -> None:
    for operation in ("UPDATE", "DELETE"):
        op.execute(
            f"CREATE TRIGGER {table}_no_{operation.lower()} BEFORE {operation} ON {table} "
            f"BEGIN SELECT RAISE(ABORT, '{why}: {operation} refused on {table}'); END"
        )


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute("ALTER TABLE consent_event ALTER COLUMN hash DROP NOT NULL")
        op.execute("ALTER TABLE consent_event ALTER COLUMN prev_hash DROP NOT NULL")
        op.execute("CREATE SEQUENCE consent_event_seq OWNED BY consent_event.seq")
        op.execute(
            "SELECT setval('consent_event_seq', COALESCE((SELECT max(seq) FROM consent_event), 0)"
            " + 1, false)"
        )
        op.execute(
            "ALTER TABLE consent_event ALTER COLUMN seq SET DEFAULT nextval('consent_event_seq')"
        )
    else:
        # SQLite cannot drop NOT NULL in place: the table is rebuilt, and its guards with it.
        op.execute("DROP TRIGGER IF EXISTS consent_event_no_update")
        op.execute("DROP TRIGGER IF EXISTS consent_event_no_delete")
        with op.batch_alter_table("consent_event", recreate="always") as batch:
            batch.alter_column("hash", existing_type=sa.LargeBinary(32), nullable=True)
            batch.alter_column("prev_hash", existing_type=sa.LargeBinary(32), nullable=True)
        _sqlite_guard("consent_event", _EVENT_GUARD)

    op.create_table(
        "consent_log_node",
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("idx", sa.BigInteger(), nullable=False),
        sa.Column("hash", sa.LargeBinary(32), nullable=False),
        sa.CheckConstraint("length(hash) = 32", name=op.f("ck_consent_log_node_hash_len")),
        sa.PrimaryKeyConstraint("level", "idx", name=op.f("pk_consent_log_node")),
    )
    op.create_index(
        "ix_consent_log_node_leaf_hash",
        "consent_log_node",
        ["hash"],
        postgresql_where=sa.text("level = 0"),
        sqlite_where=sa.text("level = 0"),
    )
    op.create_table(
        "consent_log_state",
        sa.Column("id", sa.SmallInteger(), nullable=False),
        sa.Column("tree_size", sa.BigInteger(), nullable=False),
        sa.Column("frontier", sa.LargeBinary(), nullable=False),
        sa.Column("gap_seq", sa.BigInteger(), nullable=True),
        sa.Column("gap_seen_at", _when(), nullable=True),
        sa.Column("updated_at", _when(), nullable=True),
        sa.CheckConstraint("id = 1", name=op.f("ck_consent_log_state_one_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_consent_log_state")),
    )
    # Frontier() of the empty tree: version 1, size 0, no hashes.
    op.execute(
        sa.text(
            "INSERT INTO consent_log_state (id, tree_size, frontier) VALUES (1, 0, :frontier)"
        ).bindparams(sa.bindparam("frontier", b"\x01" + bytes(8), type_=sa.LargeBinary()))
    )
    op.create_table(
        "consent_tree_head",
        sa.Column("tree_size", sa.BigInteger(), nullable=False),
        sa.Column("timestamp_ms", sa.BigInteger(), nullable=False),
        sa.Column("root_hash", sa.LargeBinary(32), nullable=False),
        sa.Column("signature", sa.LargeBinary(64), nullable=False),
        sa.Column("public_key", sa.LargeBinary(32), nullable=False),
        sa.PrimaryKeyConstraint("tree_size", name=op.f("pk_consent_tree_head")),
    )
    for table, why in _GUARDED.items():
        if dialect == "postgresql":
            op.execute(
                f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                f"FOR EACH ROW EXECUTE FUNCTION consent_refuse_change('{why}')"
            )
        else:
            _sqlite_guard(table, why)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    for table in ("consent_tree_head", "consent_log_node"):
        if dialect == "postgresql":
            op.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
        else:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_no_update")
            op.execute(f"DROP TRIGGER IF EXISTS {table}_no_delete")
    op.drop_table("consent_tree_head")
    op.drop_table("consent_log_state")
    op.drop_index("ix_consent_log_node_leaf_hash", table_name="consent_log_node")
    op.drop_table("consent_log_node")
    # Events written since cannot be chained again: a downgrade keeps them unchained.
    if dialect == "postgresql":
        op.execute("ALTER TABLE consent_event ALTER COLUMN seq DROP DEFAULT")
        op.execute("DROP SEQUENCE IF EXISTS consent_event_seq")
