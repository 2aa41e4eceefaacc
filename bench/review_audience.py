"""The campaign review's audience count among a million subscribers: review, test, launch.

    .venv/bin/python bench/review_audience.py [--subscribers 1000000] [--topic weekly-digest]
                                              [--repeat 3] [--keep]

A topic's audience count reads every subscription there is, whatever the topic's size. A
member of staff launching a local-time campaign opens the review page, sends a test from it
(the page again) and launches: each counted the audience by reason, and the review page by
time zone too (a second reading of everyone). In one run, on a database of --subscribers
made by ``bench/audience.py``'s ``populate`` (kept with --keep, reused when it is there):

- **before**: the three steps as they were (commit 5988de4): the counts by reason and by
  zone as two queries at each review, by reason at the launch;
- **after**: ``portal.campaigns.views.audience_count`` at each step, in a request of its
  own, as the pages call it: one reading by reason and zone together, kept by the
  process's ``CostlyReadings`` for ten times its cost.

Each side is timed --repeat times (the kept count forgotten between repeats), medians
reported. Never run by the test suite: it takes minutes and needs a PostgreSQL server.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402

from bench.audience import (  # noqa: E402
    DEFAULT_ADMIN_URL,
    create_database,
    database_exists,
    database_urls,
    drop_database,
    populate,
    populated_with,
)
from bench.consent_log import _app  # noqa: E402
from bench.contract import Figure, add_arguments, write  # noqa: E402

STEPS = ("review", "review again after a test send", "launch")


def _old_counts(session: Any, topic_id: int, *, zones: bool) -> None:
    """The counts as the pages took them before: by reason, and by zone in a query of
    its own."""
    from portal.consent.recipients import recipient_query

    query = recipient_query(topic_id).subquery()
    session.execute(sa.select(query.c.reason, sa.func.count()).group_by(query.c.reason)).all()
    if zones:
        session.execute(
            sa.select(query.c.time_zone, sa.func.count()).group_by(query.c.time_zone)
        ).all()


def _steps(app: Any, slug: str, *, before: bool) -> list[float]:
    from portal.campaigns import views
    from portal.campaigns.readings import CostlyReadings
    from portal.consent.catalogue import topic_by_slug
    from portal.db import db

    views._AUDIENCES = CostlyReadings()  # nothing kept from a run before
    times = []
    for step in STEPS:
        with app.test_request_context("/staff/campaigns/new"):
            topic = topic_by_slug(db.session, slug)
            started = time.perf_counter()
            if before:
                _old_counts(db.session, topic.id, zones=step != "launch")
            else:
                views.audience_count(topic)
            times.append(time.perf_counter() - started)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", type=int, default=1_000_000)
    parser.add_argument("--topic", default="weekly-digest")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--admin-url", default=DEFAULT_ADMIN_URL)
    parser.add_argument("--database", default="portal_bench_review_audience")
    parser.add_argument("--keep", action="store_true", help="keep the database for a rerun")
    add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.subscribers = min(args.subscribers, 20_000)
        args.repeat = 1
        args.database += "_quick"

    load_before = os.getloadavg()
    started = time.perf_counter()
    pg_url, sa_url = database_urls(args.admin_url, args.database)
    if not (
        database_exists(args.admin_url, args.database)
        and populated_with(pg_url) == args.subscribers
    ):
        create_database(args.admin_url, args.database)
        populate(sa_url, args.subscribers)
    try:
        with tempfile.TemporaryDirectory() as instance:
            app = _app(sa_url, instance)
            from portal.consent.catalogue import topic_by_slug
            from portal.consent.recipients import audience_counts
            from portal.db import db

            with app.app_context():
                topic = topic_by_slug(db.session, args.topic)
                audience = sum(audience_counts(db.session, topic.id).values())
                postgres = db.session.execute(sa.text("SHOW server_version")).scalar_one()
            sides: dict[bool, list[list[float]]] = {True: [], False: []}
            for _ in range(args.repeat):  # interleaved
                for before in (True, False):
                    sides[before].append(_steps(app, args.topic, before=before))
            app.extensions["portal.db"].engine.dispose()
    finally:
        if not args.keep:
            drop_database(args.admin_url, args.database)
    seconds = time.perf_counter() - started
    load_after = os.getloadavg()

    def median(before: bool, step: int) -> float:
        return statistics.median(run[step] for run in sides[before])

    totals = {b: statistics.median(sum(run) for run in sides[b]) for b in (True, False)}
    lines = [
        f"PostgreSQL {postgres}; {args.subscribers:,} subscribers made by "
        f"`bench/audience.py`'s `populate`; topic `{args.topic}`, {audience:,} of them "
        f"allowed; a local-time campaign. Medians of {args.repeat} interleaved runs; load "
        f"average {load_before[0]:.2f} before, {load_after[0]:.2f} after ({seconds:.0f} s "
        "in all, population included).",
        "",
        "| step | before, s | after, s |",
        "|---|---:|---:|",
        *(
            f"| {name} | {median(True, i):.3f} | {median(False, i):.3f} |"
            for i, name in enumerate(STEPS)
        ),
        f"| the three | {totals[True]:.3f} | {totals[False]:.3f} |",
        "",
        "Before: the counts by reason and by zone as two queries at each review, by reason "
        "at the launch. After: one reading by reason and zone together, kept for ten times "
        "its cost; the pages say when it was counted.",
    ]
    details = "\n".join(lines)
    print(details)
    figures = [
        Figure(
            figure=f"review, test and launch of a campaign among {args.subscribers:,} "
            "subscribers: the audience counts",
            value=totals[False],
            unit="s",
            baseline=totals[True],
            baseline_name="counted at every step",
            ratio=totals[True] / totals[False] if totals[False] else None,
            target="the three steps ≤ one count of everyone (the first step's before)",
            passed=totals[False] <= median(True, 2) * 1.2,
        )
    ]
    write(
        args.json,
        benchmark="review_audience",
        title="The review page's audience among a million subscribers",
        figures=figures,
        details_markdown=details,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
