"""The campaign page's delivery funnel at the size of a large campaign, on PostgreSQL.

    .venv/bin/python bench/funnel.py [--size 1000000] [--others 4] [--reads 5]
                                     [--admin-url URL] [--database NAME] [--keep]

The campaign page and its ``progress.json`` (polled every 5 s by each open page while a
campaign sends) read the funnel with ``portal.campaigns.funnel.read``. This creates its own
database on the server --admin-url names, migrates it and fills it with set-based SQL: one
campaign of --size deliveries (97 % accepted) with the receipts browsers send (40 % shown,
6 % clicked on the notification, 2 % on its first button, 1 % on its second), beside
--others finished campaigns of the same size and receipts, as the receipts' 13-month
retention keeps them. Then the project's own ``funnel.read`` is timed --reads times after
one untimed warm-up, with the statement's ``EXPLAIN (ANALYZE, BUFFERS)`` beside it.

Both sides in one run: ``read`` as it was at commit 493f9c4 (loaded from git: three
statements, each joining the deliveries to their receipts again, PostgreSQL's JIT
compilation left on) and as it is (one statement over the joined rows, computed once, and
``portal.db.without_jit``). Target: a read of a
1,000,000-delivery campaign's funnel takes under 5 s, the page's polling period (a read
that takes longer than the period piles up behind itself).

Never run by the test suite: it takes minutes and needs a PostgreSQL server.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import subprocess
import sys
import time
import types
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from bench.contract import Figure, add_arguments, write  # noqa: E402
from portal.campaigns import funnel  # noqa: E402
from portal.campaigns.models import Campaign  # noqa: E402
from portal.config import normalise_database_url  # noqa: E402
from portal.db import create_engine  # noqa: E402
from portal.migrate import upgrade  # noqa: E402

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
# The funnel before it was read in one statement without JIT compilation (and before it
# counted the buttons' clicks, which it did not do then: it did less).
BEFORE = "493f9c4"
TARGET_SECONDS = 5.0
CHUNK = 500_000

CAMPAIGN_SQL = """
INSERT INTO campaign (id, topic_id, title, body, urgency, ttl, send_at, status, created_by,
                      created_at, launched_at, finished_at, materialised_at, is_test, actions)
VALUES (CAST(:id AS uuid), :topic, :title, 'Five things this week', 'normal', 86400,
        now() - interval '2 hours', 'completed', 'bench', now() - interval '2 hours',
        now() - interval '2 hours', now() - interval '1 hour', now() - interval '2 hours',
        false, CAST(:actions AS json))
"""

# ``i`` numbers the campaign's deliveries; accepted over the first hour.
DELIVERY_SQL = """
INSERT INTO delivery (campaign_id, subscription_id, push_service, status, attempts,
                      next_attempt_at, last_status_code, consent_reason, updated_at)
SELECT CAST(:campaign AS uuid), md5(CAST(:campaign AS text) || i)::uuid, 'fcm',
       CASE WHEN i % 100 < 97 THEN 'accepted' ELSE 'failed' END, 1,
       now() - interval '2 hours',
       CASE WHEN i % 100 < 97 THEN 201 ELSE 400 END,
       'explicit_opt_in',
       now() - interval '2 hours' + (i % 3600) * interval '1 second'
FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) AS i
"""

# Receipts of the campaign's deliveries: (event, the hundredths of the deliveries that
# send it, seconds after the answer); every click is of a delivery that also reported it
# shown, the clicks on the notification and on each button apart.
RECEIPTS = (
    ("shown", (0, 40), 20),
    ("clicked", (0, 6), 300),
    ("action-1", (6, 8), 400),
    ("action-2", (8, 9), 500),
)
RECEIPT_SQL = """
INSERT INTO delivery_receipt (delivery_id, event, at)
SELECT CAST(d.id AS text), :event, d.updated_at + CAST(:after AS interval)
FROM delivery d
WHERE d.campaign_id = CAST(:campaign AS uuid) AND d.status = 'accepted'
  AND abs(hashtext(CAST(d.id AS text))) % 100 >= :start
  AND abs(hashtext(CAST(d.id AS text))) % 100 < :stop AND d.id BETWEEN :lo AND :hi
"""


def _psycopg(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def populate(engine: sa.Engine, size: int, campaigns: int) -> tuple[list[uuid.UUID], float]:
    started = time.perf_counter()
    with engine.begin() as conn:
        topic = conn.execute(
            sa.text(
                "INSERT INTO topic (slug, category, label, created_at) "
                "VALUES ('weekly-digest', 'News', 'Weekly digest', now()) RETURNING id"
            )
        ).scalar_one()
    made = []
    for number in range(campaigns):
        campaign = uuid.uuid4()
        made.append(campaign)
        with engine.begin() as conn:
            conn.execute(
                sa.text(CAMPAIGN_SQL),
                {
                    "id": str(campaign),
                    "topic": topic,
                    "title": f"Campaign {number + 1}",
                    "actions": '[{"title": "Shop now", "url": "/shop"},'
                    ' {"title": "Later", "url": "/later"}]',
                },
            )
        for lo in range(0, size, CHUNK):
            with engine.begin() as conn:
                conn.execute(sa.text("SET LOCAL session_replication_role = replica"))
                conn.execute(
                    sa.text(DELIVERY_SQL),
                    {"campaign": str(campaign), "lo": lo, "hi": min(lo + CHUNK, size) - 1},
                )
        with engine.begin() as conn:
            lo, hi = conn.execute(
                sa.text("SELECT min(id), max(id) FROM delivery WHERE campaign_id = :c"),
                {"c": campaign},
            ).one()
            for event, (start, stop), after in RECEIPTS:
                conn.execute(
                    sa.text(RECEIPT_SQL),
                    {
                        "event": event,
                        "start": start,
                        "stop": stop,
                        "after": f"{after} seconds",
                        "campaign": str(campaign),
                        "lo": lo,
                        "hi": hi,
                    },
                )
        print(f"  campaign {number + 1} of {campaigns}: {size:,} deliveries", flush=True)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE delivery"))
        conn.execute(sa.text("VACUUM ANALYZE delivery_receipt"))
    return made, time.perf_counter() - started


def explain(engine: sa.Engine, campaign: Campaign) -> str:
    """The funnel's statement, as ``read`` sends it, explained (rolled back)."""
    captured: list[tuple[str, object]] = []

    def capture(_c: object, _cur: object, statement: str, params: object, *_: object) -> None:
        captured.append((statement, params))

    sa.event.listen(engine, "before_cursor_execute", capture)
    try:
        with Session(engine) as session:
            funnel.read(session, campaign, now=dt.datetime.now(dt.UTC))
    finally:
        sa.event.remove(engine, "before_cursor_execute", capture)
    statement, params = next((s, p) for s, p in captured if not s.startswith("SET"))
    with engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        cursor = raw.cursor()
        cursor.execute("SET LOCAL jit = off")  # as read() does
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {statement}", params)  # type: ignore[arg-type]
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.close()
        conn.rollback()
    return plan


def _previous_read() -> Callable[..., object]:
    """``read`` as it was at BEFORE: its module's source from git, loaded beside this one."""
    source = subprocess.run(
        ["git", "show", f"{BEFORE}:portal/campaigns/funnel.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    module = types.ModuleType("funnel_before")
    sys.modules[module.__name__] = module  # its dataclasses look themselves up there
    exec(compile(source, f"{BEFORE}:portal/campaigns/funnel.py", "exec"), module.__dict__)
    return module.read  # type: ignore[no-any-return]


def _reads(
    read: Callable[..., object], engine: sa.Engine, campaign: Campaign, reads: int
) -> list[float]:
    """``reads`` timed funnel reads after an untimed one."""
    times = []
    for attempt in range(reads + 1):
        with Session(engine) as session:
            started = time.perf_counter()
            read(session, campaign, now=dt.datetime.now(dt.UTC))
            if attempt:  # the first warms the cache
                times.append(time.perf_counter() - started)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--others", type=int, default=4)
    parser.add_argument("--reads", type=int, default=5)
    parser.add_argument("--admin-url", default=ADMIN_URL)
    parser.add_argument("--database", default="portal_bench_funnel")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.size, args.others, args.reads = 20_000, 1, 2
        args.database += "_quick"
    admin = _psycopg(normalise_database_url(args.admin_url))
    base = _psycopg(normalise_database_url(args.admin_url)).rpartition("/")[0]
    url = normalise_database_url(f"{base}/{args.database}")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{args.database}"')
    engine = create_engine(url)
    try:
        upgrade(engine)
        total = args.size * (args.others + 1)
        print(f"populating {args.database}: {args.others + 1} campaigns, {total:,} deliveries")
        campaigns, seconds = populate(engine, args.size, args.others + 1)
        with engine.connect() as conn:
            receipts = conn.execute(sa.text("SELECT count(*) FROM delivery_receipt")).scalar_one()
        print(f"populated in {seconds:.0f} s: {receipts:,} receipts in all")
        with Session(engine) as session:
            campaign = session.get(Campaign, campaigns[-1])
            assert campaign is not None
            session.expunge(campaign)
        # Both sides in one run, the same campaign, warm both times: the read as it was
        # at BEFORE, then as it is.
        before = _reads(_previous_read(), engine, campaign, args.reads)
        times = _reads(funnel.read, engine, campaign, args.reads)
        with Session(engine) as session:
            read = funnel.read(session, campaign, now=dt.datetime.now(dt.UTC))
        plan = explain(engine, campaign)
    finally:
        engine.dispose()
        if not args.keep:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
    median = statistics.median(times)
    before_median = statistics.median(before)
    print(
        f"funnel of {args.size:,} deliveries: accepted {read.accepted:,}, shown {read.shown:,},"
        f" clicked {read.clicked:,} (outside the buttons {read.clicked_body:,}, buttons"
        f" {read.clicked_buttons[0]:,} and {read.clicked_buttons[1]:,})"
    )
    print(f"at {BEFORE}, reads (s): " + ", ".join(f"{t:.2f}" for t in before))
    print("now, reads (s): " + ", ".join(f"{t:.2f}" for t in times))
    print(f"median {before_median:.2f} s before, {median:.2f} s now")
    print(plan)
    figure = Figure(
        figure=f"funnel.read of a {args.size:,}-delivery campaign (median of {args.reads})",
        value=round(median, 3),
        unit="s",
        baseline=round(before_median, 3),
        baseline_name=f"the read at {BEFORE}",
        ratio=round(before_median / median, 2),
        target=f"< {TARGET_SECONDS:.0f} s (the page's polling period)",
        passed=median < TARGET_SECONDS,
    )
    details = f"""
One campaign of {args.size:,} deliveries (97 % accepted) beside {args.others} more of the
same size, {receipts:,} receipts in all ({", ".join(f"{e} {b - a} %" for e, (a, b), _ in RECEIPTS)}
of each campaign's deliveries). `portal.campaigns.funnel.read`, {args.reads} reads after a
warm-up each way, in one run: as it was at `{BEFORE}` (three statements, each joining the
deliveries to their receipts again, JIT compilation on) {", ".join(f"{t:.2f}" for t in before)} s
(median {before_median:.2f} s); as it is (one statement, `without_jit`),
{", ".join(f"{t:.2f}" for t in times)} s (median {median:.2f} s). The funnel it
read: accepted {read.accepted:,}, shown {read.shown:,}, clicked {read.clicked:,} (outside
the buttons {read.clicked_body:,}, on the buttons {read.clicked_buttons[0]:,} and
{read.clicked_buttons[1]:,}).

The statement's plan:

```
{plan}
```
"""
    write(
        args.json,
        benchmark="funnel",
        title="Delivery funnel at campaign scale",
        figures=[figure],
        details_markdown=details,
    )
    return 0 if figure.passed else 1


if __name__ == "__main__":
    sys.exit(main())
