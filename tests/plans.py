"""Planning a request's statements against tables that grow with the audience (PostgreSQL).

A statement that reads such a table from end to end costs every request more with every
subscriber. ``populate`` copies one real person's rows for ``PEOPLE`` others and takes the
statistics, as autovacuum would; ``deliveries`` sends them campaigns; ``whole_table_reads``
asks the planner for each captured statement's plan (never running it) and names the
growing tables it reads whole.
"""

from __future__ import annotations

import datetime as dt
import itertools
import re
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from portal.consent.models import ConsentEvent, TopicPreference
from portal.db import uuid7
from portal.delivery import partitions
from portal.subscriptions.models import PushSubscription

PEOPLE = 3000
# The tables whose rows grow with the audience (delivery: with every campaign too).
GROWING = {"subscriber", "push_subscription", "topic_preference", "consent_event", "delivery"}
# A partition of delivery (portal/delivery/partitions.py) is read as delivery.
_PARTITION = re.compile(r"^(delivery)_(?:\d{4}_\d{2}|default)$")

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


# A month no partition of delivery holds: campaigns made then are in the default partition.
NO_PARTITION_MONTH = dt.datetime(2000, 1, 15, tzinfo=dt.UTC)


def deliveries(engine: sa.Engine, *, at: dt.datetime, campaigns: int = 5) -> None:
    """``campaigns`` finished campaigns in every partition of ``delivery`` (each month's,
    the default one, and whichever holds a campaign made at ``at``, the app's clock: a
    test's other partitions, made ahead or left by earlier tests, differ), each sent to
    every subscription there is and each delivery allowed by its person's latest consent
    event, then the statistics taken: a ``delivery`` table of campaigns kept, many times
    the audience, with no partition so small that reading it whole is the cheaper plan."""
    with Session(engine) as session:
        made = [at, NO_PARTITION_MONTH] + [
            month.start + dt.timedelta(days=1) for month in partitions.months(session)
        ]
    with engine.begin() as conn:
        topic = conn.execute(sa.text("SELECT min(id) FROM topic")).scalar_one()
        for when, n in itertools.product(made, range(campaigns)):
            campaign = conn.execute(
                sa.text(
                    "INSERT INTO campaign (id, topic_id, title, body, urgency, ttl, send_at, "
                    "status, created_by, created_at, finished_at, is_test) VALUES "
                    "(:id, :topic, :title, 'Filler', 'normal', 86400, :at, "
                    "'completed', 'test', :at, :at, false) RETURNING id"
                ),
                {"id": uuid7(at=when), "topic": topic, "title": f"Campaign {n + 1}", "at": when},
            ).scalar_one()
            conn.execute(
                sa.text(
                    "INSERT INTO delivery (campaign_id, subscription_id, push_service, status, "
                    "attempts, next_attempt_at, consent_reason, consent_event_seq, updated_at) "
                    "SELECT :campaign, s.id, 'fcm', 'accepted', 1, :at, 'explicit_opt_in', "
                    "(SELECT max(e.seq) FROM consent_event e "
                    "WHERE e.subscriber_id = s.subscriber_id), :at "
                    "FROM push_subscription s"
                ),
                {"campaign": campaign, "at": when},
            )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("ANALYZE"))


def _growing(table: str) -> str | None:
    """The growing table ``table`` is, or a partition of; None for any other."""
    partition = _PARTITION.match(table)
    name = partition.group(1) if partition else table
    return name if name in GROWING else None


def _read_whole(plan: str) -> set[str]:
    """The growing tables a plan reads from end to end: by a sequential scan, or by an
    index scan with no index condition that tests every row it walks (a ``Filter``), as
    an ``ORDER BY id DESC LIMIT`` walks the primary key from its end when no index serves
    its ``WHERE``. An index scan with neither (the highest key, read from the index's end)
    reads a row or two; a scan the planner costs at nothing is of an empty partition."""
    found: set[str] = set()
    # Each plan node: its first line (the top node's, or one with "->"), then its details.
    nodes: list[list[str]] = []
    for number, line in enumerate(plan.splitlines()):
        if number == 0 or "->" in line:
            nodes.append([line])
        else:
            nodes[-1].append(line)
    for first, *details in nodes:
        if "cost=0.00..0.00 " in first:
            continue  # an empty partition (no pages): read whole, it reads nothing
        scan = re.search(r"Seq Scan on (\w+)", first)
        if scan and (table := _growing(scan.group(1))):
            found.add(table)
        indexed = re.search(r"Index (?:Only )?Scan (?:Backward )?using \w+ on (\w+)", first)
        conditions = " ".join(details)
        if (
            indexed
            and (table := _growing(indexed.group(1)))
            and "Filter:" in conditions
            and "Index Cond:" not in conditions
        ):
            found.add(table)
    return found


def plans(engine: sa.Engine, statements: list[tuple[str, Any]]) -> list[str]:
    """The plan of each statement (with its parameters), planned, never run."""
    found = []
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        for statement, parameters in statements:
            cursor.execute("EXPLAIN " + statement, parameters)
            found.append("\n".join(row[0] for row in cursor.fetchall()))
        raw.rollback()
    finally:
        raw.close()
    return found


def whole_table_reads(engine: sa.Engine, statements: list[tuple[str, Any]]) -> list[str]:
    """The growing tables each statement's plan reads from end to end."""
    found = []
    for (statement, _), plan in zip(statements, plans(engine, statements), strict=True):
        tables = _read_whole(plan)
        if tables:
            found.append(f"{sorted(tables)} read whole by:\n{statement}\n{plan}")
    return found
