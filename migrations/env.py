"""Alembic environment: runs against the connection the portal hands it, or a URL."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

import portal.models  # noqa: F401 - registers every table on the metadata
from portal.db import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: sa.Connection) -> None:
    sqlite = connection.dialect.name == "sqlite"
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=sqlite,
        compare_type=True,
        # PostgreSQL: each migration in a transaction of its own, so a migration can
        # leave it for CREATE INDEX CONCURRENTLY (autocommit_block) and VALIDATE runs
        # apart from the NOT VALID that preceded it (migrations/README.md).
        transaction_per_migration=not sqlite,
        # SQLite: the whole run in one transaction (the portal's SQLite transactions
        # begin IMMEDIATE), so processes starting together take turns.
        transactional_ddl=True if sqlite else None,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = sa.create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.connect() as connection:
        _run(connection)
    engine.dispose()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
