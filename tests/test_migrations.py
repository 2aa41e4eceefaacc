"""The migrations are the schema: they run both ways, and the models agree with them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.exc import IntegrityError

import portal.models  # noqa: F401
from portal.db import Base, create_engine
from portal.delivery import partitions
from portal.migrate import alembic_config, downgrade, upgrade


@pytest.fixture
def empty_engine(fresh_database, pg_server):
    url = fresh_database()
    engine = create_engine(url)
    yield engine
    engine.dispose()
    if pg_server is not None:
        pg_server.drop(url)


def _tables(engine) -> set[str]:
    return set(sa.inspect(engine).get_table_names())


def test_upgrade_downgrade_upgrade(empty_engine, backend):
    upgrade(empty_engine)
    assert {"subscriber", "push_subscription", "alembic_version"} <= _tables(empty_engine)
    downgrade(empty_engine, "base")
    assert _tables(empty_engine) <= {"alembic_version"}
    if backend == "postgresql":
        with empty_engine.connect() as conn:
            types = conn.execute(
                sa.text("SELECT typname FROM pg_type WHERE typname = 'push_subscription_state'")
            ).all()
        assert types == []
    upgrade(empty_engine)
    assert "push_subscription" in _tables(empty_engine)


def _not_a_partition(obj, name, type_, reflected, compare_to) -> bool:
    # delivery's partitions (PostgreSQL, migration 0031) are made at run time, not models.
    table = obj if type_ == "table" else getattr(obj, "table", None)
    return not (reflected and table is not None and partitions.is_partition(table.name))


def test_models_match_the_migrations(engine):
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"include_object": _not_a_partition})
        diff = compare_metadata(context, Base.metadata)
    assert diff == []


def test_constraints_follow_the_naming_convention(engine):
    inspector = sa.inspect(engine)
    uniques = {u["name"] for u in inspector.get_unique_constraints("push_subscription")}
    assert "uq_push_subscription_endpoint_hash" in uniques
    indexes = {i["name"] for i in inspector.get_indexes("push_subscription")}
    assert {
        "ix_push_subscription_subscriber_live",
        "ix_push_subscription_sweep",
        "ix_push_subscription_service",
    } <= indexes
    fks = {f["name"] for f in inspector.get_foreign_keys("push_subscription")}
    assert fks == {"fk_push_subscription_subscriber_id_subscriber"}
    checks = {c["name"] for c in inspector.get_check_constraints("push_subscription")}
    assert {
        "ck_push_subscription_endpoint_hash_len",
        "ck_push_subscription_p256dh_len",
        "ck_push_subscription_live_has_credentials",
    } <= checks
    assert inspector.get_pk_constraint("push_subscription")["name"] == "pk_push_subscription"


def test_indexes_are_partial(engine, backend):
    with engine.connect() as conn:
        if backend == "postgresql":
            defs = dict(
                conn.execute(
                    sa.text(
                        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'push_subscription'"
                    )
                ).all()
            )
        else:
            defs = dict(
                conn.execute(
                    sa.text(
                        "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'push_subscription'"
                    )
                ).all()
            )
    assert "deleted_at IS NULL" in defs["ix_push_subscription_sweep"]
    assert "deleted_at IS NULL" in defs["ix_push_subscription_service"]
    # Tombstones stay out of every working-set index; only the UNIQUE endpoint hash (the
    # identity a tombstone keeps, to recognise an erased browser) and the subscriber index
    # cover them. The subscriber's must: whether an identity still holds a subscription,
    # ended ones included (a preference link to it), and the move of all of them to an
    # account read the whole table without it (migration 0034).
    assert "WHERE" not in defs["ix_push_subscription_subscriber"].upper()
    working_set = {
        name: sql
        for name, sql in defs.items()
        if name.startswith("ix_") and name != "ix_push_subscription_subscriber"
    }
    assert len(working_set) >= 3
    for name, sql in working_set.items():
        assert "deleted_at IS NULL" in sql, name
    live = defs["ix_push_subscription_subscriber_live"]
    assert "deleted_at IS NULL" in live and "pending" in live and "active" in live


def test_state_is_an_enum_on_postgres_and_a_check_on_sqlite(engine, backend):
    with engine.connect() as conn:
        if backend == "postgresql":
            labels = (
                conn.execute(
                    sa.text(
                        "SELECT e.enumlabel FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid WHERE t.typname = 'push_subscription_state' ORDER BY e.enumsortorder"
                    )
                )
                .scalars()
                .all()
            )
            assert labels == ["pending", "active", "stale", "expired", "revoked"]
        else:
            ddl = conn.execute(
                sa.text("SELECT sql FROM sqlite_master WHERE name = 'push_subscription'")
            ).scalar_one()
            assert "CHECK (state IN ('pending', 'active', 'stale', 'expired', 'revoked'))" in ddl


def _insert(conn, **overrides):
    values = {
        "id": "0" * 31 + str(len(overrides)),
        "endpoint": "https://fcm.googleapis.com/x",
        "endpoint_hash": b"h" * 32,
        "push_service": "fcm",
        "p256dh": "B" * 87,
        "auth_sealed": b"s" * 44,
        "auth_key_version": 1,
        "origin": "https://portal.example",
        "state": "pending",
        "created_at": "2026-01-01 00:00:00",
        "last_seen_at": "2026-01-01 00:00:00",
    }
    values.update(overrides)
    if conn.dialect.name == "postgresql":
        values["id"] = "00000000-0000-0000-0000-0000000000" + str(10 + len(overrides))
    columns = ", ".join(values)
    params = ", ".join(f":{k}" for k in values)
    conn.execute(sa.text(f"INSERT INTO push_subscription ({columns}) VALUES ({params})"), values)


@pytest.mark.parametrize(
    "overrides",
    [
        {"endpoint_hash": b"h" * 31},
        {"p256dh": "B" * 40},
        {"p256dh": "B" * 97},
        {"endpoint": None},
        {"auth_sealed": None},
        {"push_service": "carrier-pigeon"},
        {"state": "lost"},
        {"consecutive_failures": -1},
    ],
    ids=[
        "hash-31-bytes",
        "short-p256dh",
        "long-p256dh",
        "live-without-endpoint",
        "live-without-auth",
        "unknown-service",
        "unknown-state",
        "negative-failures",
    ],
)
def test_database_refuses_rows_the_rules_forbid(engine, overrides):
    with (
        pytest.raises((IntegrityError, sa.exc.DataError, sa.exc.StatementError)),
        engine.begin() as conn,
    ):
        _insert(conn, **overrides)


def test_database_accepts_a_tombstone_without_credentials(engine):
    with engine.begin() as conn:
        _insert(
            conn,
            endpoint=None,
            p256dh=None,
            auth_sealed=None,
            deleted_at="2026-02-01 00:00:00",
            state="revoked",
        )
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM push_subscription")).scalar_one() == 1


def test_endpoint_hash_is_unique(engine):
    with engine.begin() as conn:
        _insert(conn)
    with pytest.raises(IntegrityError), engine.begin() as conn:
        _insert(conn, endpoint="https://fcm.googleapis.com/other")


# migrations/README.md's recipes for a large, live table, as two revisions on top of the
# real ones: a nullable column and a NOT VALID constraint; then, in a migration of its
# own, VALIDATE and an index built CONCURRENTLY outside the migration's transaction.
ONLINE_ADD = """
import sqlalchemy as sa
from alembic import op

revision = "online_add"
down_revision = "{head}"


def upgrade() -> None:
    op.add_column("push_subscription", sa.Column("topic_hint", sa.Text(), nullable=True))
    if op.get_context().dialect.name == "postgresql":
        op.execute(
            "ALTER TABLE push_subscription ADD CONSTRAINT ck_push_subscription_topic_hint_len "
            "CHECK (length(topic_hint) <= 64) NOT VALID"
        )


def downgrade() -> None:
    op.drop_column("push_subscription", "topic_hint")
"""
ONLINE_VALIDATE = """
import sqlalchemy as sa
from alembic import op

revision = "online_validate"
down_revision = "online_add"


def upgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute(
            "ALTER TABLE push_subscription VALIDATE CONSTRAINT ck_push_subscription_topic_hint_len"
        )
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_push_subscription_topic_hint",
            "push_subscription",
            ["topic_hint"],
            postgresql_concurrently=True,
            postgresql_where=sa.text("deleted_at IS NULL"),
        )


def downgrade() -> None:
    op.drop_index("ix_push_subscription_topic_hint", table_name="push_subscription")
"""


def test_the_readme_recipes_for_online_changes_run(empty_engine, backend, tmp_path, monkeypatch):
    from portal import migrate

    head = ScriptDirectory.from_config(migrate.alembic_config()).get_current_head()
    scripts = tmp_path / "migrations"
    shutil.copytree(migrate.MIGRATIONS, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    (scripts / "versions" / "9001_online_add.py").write_text(ONLINE_ADD.format(head=head))
    (scripts / "versions" / "9002_online_validate.py").write_text(ONLINE_VALIDATE)
    monkeypatch.setattr(migrate, "MIGRATIONS", scripts)

    upgrade(empty_engine)  # CREATE INDEX CONCURRENTLY fails inside a transaction block

    inspector = sa.inspect(empty_engine)
    assert "topic_hint" in {c["name"] for c in inspector.get_columns("push_subscription")}
    assert "ix_push_subscription_topic_hint" in {
        i["name"] for i in inspector.get_indexes("push_subscription")
    }
    with empty_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one() == (
            "online_validate"
        )
        if backend == "postgresql":
            valid = conn.execute(
                sa.text(
                    "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                    "WHERE c.relname = 'ix_push_subscription_topic_hint'"
                )
            ).scalar_one()
            validated = conn.execute(
                sa.text(
                    "SELECT convalidated FROM pg_constraint "
                    "WHERE conname = 'ck_push_subscription_topic_hint_len'"
                )
            ).scalar_one()
            assert (valid, validated) == (True, True)
    downgrade(empty_engine, head)
    assert "topic_hint" not in {
        c["name"] for c in sa.inspect(empty_engine).get_columns("push_subscription")
    }


MIGRATE = """
import sys
from portal.db import create_engine
from portal.migrate import upgrade
engine = create_engine(sys.argv[1])
upgrade(engine)
engine.dispose()
"""


@pytest.mark.pgbouncer
def test_processes_migrating_at_once_take_turns(empty_engine, tmp_path):
    """Several processes starting together (auto-migrate, or an operator's upgrade beside
    them) all end well, on one schema."""
    root = Path(__file__).resolve().parent.parent
    url = empty_engine.url.render_as_string(hide_password=False)
    environ = {**os.environ, "PYTHONPATH": str(root)}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", MIGRATE, url],
            cwd=root,
            env=environ,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for _ in range(3)
    ]
    outputs = [process.communicate(timeout=120)[0].decode() for process in processes]
    assert [process.returncode for process in processes] == [0, 0, 0], outputs
    with empty_engine.connect() as conn:
        versions = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all()
        head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert versions == [head]
