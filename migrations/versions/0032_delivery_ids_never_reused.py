"""Delivery ids never reused on SQLite.

A delivery's id is the ``deliveryId`` its notification carries: the browser reports
"shown" and "clicked" with it, and the service worker shows each id once. On SQLite
``delivery.id`` was a plain ``INTEGER PRIMARY KEY``, whose next value is the largest id
present plus one: once retention deleted the newest deliveries, the next campaign's got
their ids again, and a late click on an old notification counted for the new campaign
(and the worker took the new one for a repeat). ``AUTOINCREMENT`` never hands out an id
twice. The table is rebuilt with it (SQLite cannot add it in place), its rows, indexes
and constraints as they were; the counter starts past every id still known: the
deliveries' and the ones their receipts name. On PostgreSQL ids come from a sequence,
which never goes back: nothing changes there.

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-04
"""

from __future__ import annotations

import re

import sqlalchemy as sa
from alembic import op

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None

_PLAIN = "id INTEGER NOT NULL, "
_AUTOINCREMENT = "id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, "
_PRIMARY_KEY = "CONSTRAINT pk_delivery PRIMARY KEY (id), "


def _rebuild(table_sql: str) -> None:
    """``delivery`` again as ``table_sql`` says, with its rows and its indexes."""
    bind = op.get_bind()
    indexes = [
        row[0]
        for row in bind.execute(
            sa.text(
                "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'delivery'"
                " AND sql IS NOT NULL"
            )
        )
    ]
    columns = ", ".join(row[1] for row in bind.execute(sa.text("PRAGMA table_info('delivery')")))
    # SQLite keeps the statement as written; after a rename, with the name quoted.
    op.execute(
        re.sub(r'^CREATE TABLE "?delivery"? \(', "CREATE TABLE delivery_rebuilt (", table_sql)
    )
    # The names are the table's own columns, read from SQLite above.
    op.execute(f"INSERT INTO delivery_rebuilt ({columns}) SELECT {columns} FROM delivery")  # noqa: S608
    op.execute("DROP TABLE delivery")
    op.execute("ALTER TABLE delivery_rebuilt RENAME TO delivery")
    for index in indexes:
        op.execute(index)


def _table_sql() -> str:
    return str(
        op.get_bind()
        .execute(
            sa.text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'delivery'")
        )
        .scalar_one()
    )


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    table_sql = _table_sql()
    if _AUTOINCREMENT in table_sql:
        return
    if _PLAIN not in table_sql or _PRIMARY_KEY not in table_sql:
        raise RuntimeError(f"delivery is not as migration 0031 left it: {table_sql}")
    _rebuild(table_sql.replace(_PLAIN, _AUTOINCREMENT, 1).replace(_PRIMARY_KEY, "", 1))
    # Past every id still known: the deliveries', and the ones receipts name (a receipt
    # may outlive the newest deliveries, whose ids were the ones handed out again).
    known = (
        op.get_bind()
        .execute(
            sa.text(
                """
            SELECT max(
                coalesce((SELECT max(id) FROM delivery), 0),
                coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'delivery'), 0),
                coalesce((SELECT max(CAST(delivery_id AS INTEGER)) FROM delivery_receipt
                          WHERE delivery_id NOT GLOB '*[^0-9]*' AND delivery_id <> ''
                            AND length(delivery_id) <= 18), 0)
            )
            """
            )
        )
        .scalar_one()
    )
    op.execute("DELETE FROM sqlite_sequence WHERE name = 'delivery'")
    op.get_bind().execute(
        sa.text("INSERT INTO sqlite_sequence (name, seq) VALUES ('delivery', :seq)"),
        {"seq": known},
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    table_sql = _table_sql()
    if _AUTOINCREMENT not in table_sql:
        return
    rebuilt = table_sql.replace(_AUTOINCREMENT, _PLAIN, 1)
    rebuilt = rebuilt.replace(
        "CONSTRAINT ck_delivery_status", _PRIMARY_KEY + "CONSTRAINT ck_delivery_status", 1
    )
    _rebuild(rebuilt)
    op.execute("DELETE FROM sqlite_sequence WHERE name = 'delivery'")
