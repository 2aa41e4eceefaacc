"""Running the Alembic migrations: the only source of the schema."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from portal.db import held_transaction_lock

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
# A transaction-level advisory lock of our own (``held_transaction_lock``: it works
# through PgBouncer in transaction mode): processes migrating one PostgreSQL database at
# once take turns, and the later ones find the schema already at head.
MIGRATION_LOCK = 0x706F7274616C6D67


def alembic_config(connection: sa.Connection | None = None, url: str | None = None) -> Config:
    config = Config(stdout=sys.stdout)  # the current stdout, so click can capture it
    config.set_main_option("script_location", str(MIGRATIONS))
    if url:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@contextmanager
def migration_connection(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A connection outside any transaction, so that Alembic owns the transactions
    (``migrations/env.py``): one per migration on PostgreSQL, where a migration may step
    out of it to build an index CONCURRENTLY and a constraint is validated in a migration
    of its own; one for the whole run on SQLite."""
    with engine.connect() as connection:
        if connection.dialect.name != "postgresql":
            yield connection
            return
        # The lock is held on a connection of its own, by a transaction that stays open
        # while the migrations commit theirs on this one; the others wait for it.
        with held_transaction_lock(engine, MIGRATION_LOCK, wait=True):
            try:
                yield connection
            finally:
                try:
                    connection.rollback()
                except sa.exc.DBAPIError:
                    # The session is gone or unusable: it must not go back to the pool.
                    connection.invalidate()


def upgrade(engine: sa.Engine, revision: str = "head") -> None:
    with migration_connection(engine) as connection:
        command.upgrade(alembic_config(connection), revision)


def downgrade(engine: sa.Engine, revision: str) -> None:
    with migration_connection(engine) as connection:
        command.downgrade(alembic_config(connection), revision)
