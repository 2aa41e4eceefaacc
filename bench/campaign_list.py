"""The campaign list's cost as finished campaigns of a million deliveries pile up.

    .venv/bin/python bench/campaign_list.py [--finished 10] [--finished-size 1000000]
                                            [--sending 1000000] [--repeat 3]
                                            [--admin-url URL] [--database NAME] [--keep]

The campaign list (``GET /staff/campaigns``, ``portal campaign list``) shows each listed
campaign's deliveries by status. This creates its own database on the server --admin-url
names, migrates it and fills ``delivery`` with set-based SQL (``bench/claims.py``'s
``populate``: --finished completed campaigns of --finished-size, one sending campaign of
--sending, half of it sent). Deliveries are kept for the audit window (13 months), so a
list of fifty campaigns lists every delivery of fifty campaigns. In one run:

- **before**: ``portal.campaigns.services.list_campaigns`` while no campaign's counts are
  kept (``campaign.settled_counts`` NULL, as every campaign was before they were kept):
  each listed campaign counted from its rows, the list's query before commit this
  benchmark came with;
- then the ``table-retention`` job's ``settle_campaigns`` keeps the finished campaigns'
  counts (timed: a one-time cost per campaign);
- **after**: the same ``list_campaigns``, now reading the kept counts and counting the
  sending campaign alone.

Each is timed --repeat times after one untimed call (the table's pages in memory), with
1, 2, 5 … --finished finished campaigns listed beside the sending one (the list's own
counting function, ``portal.campaigns.settled.counts``, over that many), so the shape of
the cost as campaigns pile up shows, and the whole list as the page asks it.

Never run by the test suite: it takes minutes and needs a PostgreSQL server.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402

from bench.claims import (  # noqa: E402
    add_database_arguments,
    mark_sent,
    own_database,
    populate,
)
from bench.consent_log import _app  # noqa: E402
from bench.contract import Figure, add_arguments, median_time, write  # noqa: E402

# Flat: the list with every finished campaign in it costs at most this many times the
# list with one (as bench/claims.py asks of a claim at 99% sent against 0%).
TARGET_RATIO = 1.5


def _listing(app: Any, listed: int | None) -> Callable[[], Any]:
    """The list's counts in a request of its own: ``list_campaigns`` (``listed`` None),
    or ``settled.counts`` over the sending campaign and the ``listed`` newest finished."""
    from portal.campaigns import services, settled
    from portal.campaigns.models import Campaign
    from portal.db import db

    def work() -> Any:
        with app.test_request_context("/staff/campaigns"):
            if listed is None:
                return services.list_campaigns(db.session)
            campaigns = db.session.scalars(
                sa.select(Campaign)
                .order_by(Campaign.created_at.desc(), Campaign.id.desc())
                .limit(listed + 1)
            ).all()
            return settled.counts(db.session, campaigns)

    return work


def _steps(finished: int) -> list[int]:
    steps = [n for n in (1, 2, 5, 10, 20, 50) if n < finished]
    return [*steps, finished]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--finished", type=int, default=10)
    parser.add_argument("--finished-size", type=int, default=1_000_000)
    parser.add_argument("--sending", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    add_database_arguments(parser, "portal_bench_campaign_list")
    add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.finished = min(args.finished, 3)
        args.finished_size = min(args.finished_size, 50_000)
        args.sending = min(args.sending, 50_000)

    load_before = os.getloadavg()
    started = time.perf_counter()
    steps = _steps(args.finished)
    with own_database(args) as (url, engine):
        print(f"populating {args.database}")
        population = populate(engine, args.sending, args.finished, args.finished_size)
        sent = mark_sent(engine, population, 0.5)
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT count(*) FROM delivery")).scalar_one()
            postgres = conn.execute(sa.text("SHOW server_version")).scalar_one()
        engine.dispose()
        with tempfile.TemporaryDirectory() as instance:
            app = _app(url, instance)
            from portal.retention.tables import settle_campaigns

            before = {n: median_time(_listing(app, n), args.repeat)[0] for n in steps}
            before_page = median_time(_listing(app, None), args.repeat)[0]
            print(f"before: {before}, whole list {before_page:.3f} s", flush=True)
            settling = time.perf_counter()
            kept = settle_campaigns(app)
            settling = time.perf_counter() - settling
            after = {n: median_time(_listing(app, n), args.repeat)[0] for n in steps}
            after_page = median_time(_listing(app, None), args.repeat)[0]
            print(f"after: {after}, whole list {after_page:.3f} s", flush=True)
            app.extensions["portal.db"].engine.dispose()
    load_after = os.getloadavg()
    seconds = time.perf_counter() - started
    if kept != args.finished:
        raise SystemExit(f"kept the counts of {kept} campaigns, not {args.finished}")

    lines = [
        f"PostgreSQL {postgres}; {rows:,} deliveries: {args.finished} completed campaigns "
        f"of {args.finished_size:,} and one sending campaign of {population.size:,}, "
        f"{sent:,} of it sent, made by SQL (`bench/claims.py`'s `populate`). Each figure "
        f"the median of {args.repeat} calls after one untimed call; load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after ({seconds:.0f} s in all).",
        "",
        f"`settle_campaigns` (the `table-retention` job) kept the counts of the "
        f"{kept} finished campaigns in {settling:.1f} s: once per campaign.",
        "",
        "| finished campaigns listed (and the sending one) | deliveries they hold | "
        "before, seconds | after, seconds |",
        "|---:|---:|---:|---:|",
    ]
    for n in steps:
        held = n * args.finished_size + population.size
        lines.append(f"| {n} | {held:,} | {before[n]:.3f} | {after[n]:.3f} |")
    lines.append(
        f"| the whole list (`list_campaigns`) | {rows:,} | {before_page:.3f} | {after_page:.3f} |"
    )
    details = "\n".join(lines)
    print(details)
    figures = [
        Figure(
            figure=f"the campaign list's counts, {args.finished} finished campaigns of "
            f"{args.finished_size:,} and one of {population.size:,} sending",
            value=after_page,
            unit="s",
            baseline=before_page,
            baseline_name="every listed campaign counted from its rows",
            ratio=before_page / after_page if after_page else None,
            target=f"with {steps[-1]} finished listed ≤ {TARGET_RATIO}× with {steps[0]}: "
            f"{after[steps[-1]]:.3f} s against {after[steps[0]]:.3f} s",
            passed=after[steps[-1]] <= TARGET_RATIO * after[steps[0]],
        )
    ]
    write(
        args.json,
        benchmark="campaign_list",
        title="The campaign list at millions of deliveries",
        figures=figures,
        details_markdown=details,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
