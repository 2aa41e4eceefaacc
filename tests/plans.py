"""Planning a request's statements against tables that grow with the audience (PostgreSQL).

A statement that reads such a table from end to end costs every request more with every
subscriber. ``populate`` copies one real person's rows for ``PEOPLE`` others and takes the
statistics, as autovacuum would; ``whole_table_reads`` asks the planner for each captured
statement's plan (never running it) and names the growing tables it reads whole.
"""

from __future__ import annotations

import re
from typing import Any

import sqlalchemy as sa

from portal.consent.models import ConsentEvent, TopicPreference
from portal.subscriptions.models import PushSubscription

PEOPLE = 3000
# The tables whose rows grow with the audience.
GROWING = {"subscriber", "push_subscription", "topic_preference", "consent_event"}

# Each table's rows of the one real person, copied for every other person (filler), with
# the columns that must differ between people replaced.
_COPIES: list[tuple[sa.Table, dict[str, str]]] = [
    (
        PushSubscription.__table__,  # type: ignore[list-item]
        {
            "id": "gen_random_uuid()",
            "endpoint": "t.endpoint || '/' || f.id",
            "endpoint_hash": "sha256(convert_to(t.endpoint || '/' || f.id, 'UTF8'))",
            "subscriber_id": "f.id",
        },
    ),
    (TopicPreference.__table__, {"subscriber_id": "f.id"}),  # type: ignore[list-item]
    (
        ConsentEvent.__table__,  # type: ignore[list-item]
        {
            "seq": "nextval('consent_event_seq')",
            "subscriber_id": "f.id",
            "subscription_id": "NULL",
            "prev_hash": "NULL",
            "hash": "NULL",
        },
    ),
]


def populate(engine: sa.Engine, person: Any, *, events_aged: str | None = None) -> None:
    """``PEOPLE`` more people, each with a copy of ``person``'s device, choices and
    events, then the statistics taken, as autovacuum would. ``events_aged`` (an
    interval, ``'1 year'``) dates the others' events that much earlier than the person's:
    a log with a history behind the weeks a page shows."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "CREATE TEMPORARY TABLE filler ON COMMIT DROP AS "
                "SELECT gen_random_uuid() AS id FROM generate_series(1, :n)"
            ),
            {"n": PEOPLE},
        )
        conn.execute(
            sa.text(
                "INSERT INTO subscriber (id, region_code, locale, created_at) "
                "SELECT f.id, s.region_code, s.locale, s.created_at FROM filler f "
                "JOIN subscriber s ON s.id = :person"
            ),
            {"person": person},
        )
        for table, copied in _COPIES:
            replaced = dict(copied)
            if events_aged is not None and table is ConsentEvent.__table__:
                for name in ("decided_at", "recorded_at"):
                    replaced[name] = f"t.{name} - CAST('{events_aged}' AS interval)"
            columns = [column.name for column in table.columns]
            values = ", ".join(replaced.get(name, f"t.{name}") for name in columns)
            conn.execute(
                sa.text(
                    f"INSERT INTO {table.name} ({', '.join(columns)}) "
                    f"SELECT {values} FROM {table.name} t CROSS JOIN filler f "
                    "WHERE t.subscriber_id = :person"
                ),
                {"person": person},
            )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("ANALYZE"))


# The statements a plan is asked of: queries and writes that read a table.
PLANNED = re.compile(r"\s*(WITH\b|SELECT\b|UPDATE\b|DELETE\b|INSERT\b.*\bSELECT\b)", re.S | re.I)


def whole_table_reads(engine: sa.Engine, statements: list[tuple[str, Any]]) -> list[str]:
    """The growing tables each statement's plan reads from end to end."""
    found = []
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        for statement, parameters in statements:
            cursor.execute("EXPLAIN " + statement, parameters)  # planned, never run
            plan = "\n".join(row[0] for row in cursor.fetchall())
            tables = set(re.findall(r"Seq Scan on (\w+)", plan)) & GROWING
            if tables:
                found.append(f"{sorted(tables)} read whole by:\n{statement}\n{plan}")
        raw.rollback()
    finally:
        raw.close()
    return found
