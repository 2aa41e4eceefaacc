"""Cancelling a campaign with millions of deliveries queued: the request, then the marking.

    .venv/bin/python bench/cancel.py [--queued 10000000] [--sent 0.01] [--repeat 5]
                                     [--admin-url URL] [--database NAME] [--keep]

Creates its own database on the server --admin-url names, migrates it and fills
``delivery`` with set-based SQL (``bench/claims.py``'s ``populate``): one sending campaign
of --queued deliveries, the first --sent of them answered. In one run:

- **before**: the cancel as it was (commit 4cf2b72 and earlier): the campaign row and, in
  the same transaction, one UPDATE marking every queued delivery skipped; timed, then
  rolled back (and the table vacuumed) so the other side starts from the same rows;
- **after**: ``portal.campaigns.services.control(..., "cancel")`` as the staff page calls
  it, timed --repeat times (each rolled back but the last); then the campaign page's
  counts (``outcome.read``), checked to say every delivery not sent is skipped;
- **the marking**: the dispatcher's ``skip_unsent`` tick after tick (its default 5,000 rows
  a transaction, 2 s a tick) until the campaign is done, each tick's rows and seconds
  recorded: the cost of a chunk at the last tenth of the queue against the first, and the
  campaign's counts kept at the end.

Never run by the test suite: it takes minutes and needs a PostgreSQL server.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402

from bench.claims import (  # noqa: E402
    _admin,
    _NoTransport,
    add_database_arguments,
    mark_sent,
    own_database,
    populate,
)
from bench.consent_log import _app  # noqa: E402
from bench.contract import Figure, add_arguments, write  # noqa: E402

# The request may cost at most this, whatever the queue (seconds).
REQUEST_TARGET = 0.1
# A chunk at the last tenth of the queue costs at most this many times one at the first.
FLAT_RATIO = 1.5

OLD_CANCEL = """
UPDATE delivery SET status = 'skipped', reason = 'cancelled', updated_at = :now
WHERE campaign_id = CAST(:c AS uuid) AND status = 'queued'
"""


def _old_cancel(app: Any, campaign_id: Any) -> tuple[float, int]:
    """The cancel before this benchmark's commit, rolled back: seconds, rows it marked."""
    from portal.campaigns.models import Campaign
    from portal.db import db

    now = dt.datetime.now(dt.UTC)
    started = time.perf_counter()
    with app.test_request_context("/staff/campaigns"):
        campaign = db.session.get(Campaign, campaign_id, with_for_update=True)
        assert campaign is not None
        campaign.status, campaign.finished_at = "cancelled", now
        marked = cast(
            sa.CursorResult[Any],
            db.session.execute(sa.text(OLD_CANCEL), {"now": now, "c": str(campaign_id)}),
        )
        db.session.flush()
        seconds = time.perf_counter() - started
        db.session.rollback()
    return seconds, int(marked.rowcount)


def _cancel(app: Any, campaign_id: Any, *, keep: bool) -> float:
    from portal.campaigns import services
    from portal.db import db

    started = time.perf_counter()
    with app.test_request_context("/staff/campaigns"):
        services.control(db.session, campaign_id, "cancel", now=dt.datetime.now(dt.UTC))
        if keep:
            db.session.commit()
        else:
            db.session.flush()
        seconds = time.perf_counter() - started
        if not keep:
            db.session.rollback()
    return seconds


def _page_counts(app: Any, campaign_id: Any) -> tuple[float, dict[str, int]]:
    from portal.campaigns import outcome
    from portal.campaigns.models import Campaign
    from portal.db import db

    with app.test_request_context("/staff/campaigns"):
        campaign = db.session.get(Campaign, campaign_id)
        assert campaign is not None
        started = time.perf_counter()
        facts = outcome.read(db.session, campaign, now=dt.datetime.now(dt.UTC)).facts
        return time.perf_counter() - started, {k: v for k, v in facts.counts.items() if v}


def _tenth(ticks: list[tuple[int, float]], first: bool, chunk: int) -> float:
    """Seconds per chunk over the ticks that marked the first (or last) tenth of rows."""
    total = sum(rows for rows, _ in ticks)
    done, chosen = 0, []
    for rows, seconds in ticks:
        start = done
        done += rows
        if (first and start < total / 10) or (not first and done > total * 9 / 10):
            chosen.append((rows, seconds))
    rows = sum(r for r, _ in chosen)
    return sum(s for _, s in chosen) / (rows / chunk)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queued", type=int, default=10_000_000)
    parser.add_argument("--sent", type=float, default=0.01)
    parser.add_argument("--repeat", type=int, default=5)
    add_database_arguments(parser, "portal_bench_cancel")
    add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.queued = min(args.queued, 200_000)

    load_before = os.getloadavg()
    started = time.perf_counter()
    with own_database(args) as (url, engine):
        print(f"populating {args.database}")
        population = populate(engine, args.queued, 0, 0)
        sent = mark_sent(engine, population, args.sent)
        with engine.connect() as conn:
            postgres = conn.execute(sa.text("SHOW server_version")).scalar_one()
        queued = population.size - sent
        campaign_id = population.sending
        with tempfile.TemporaryDirectory() as instance:
            app = _app(url, instance)
            before, marked_before = _old_cancel(app, campaign_id)
            print(f"before: {before:.1f} s marking {marked_before:,}", flush=True)
            vacuum = time.perf_counter()
            with _admin(engine) as conn:
                conn.execute(sa.text("VACUUM (ANALYZE) delivery"))
                conn.execute(sa.text("CHECKPOINT"))
            vacuum = time.perf_counter() - vacuum
            requests = [_cancel(app, campaign_id, keep=False) for _ in range(args.repeat - 1)]
            requests.append(_cancel(app, campaign_id, keep=True))
            after = statistics.median(requests)
            print(f"after: {after * 1000:.1f} ms (median of {args.repeat})", flush=True)
            page_seconds, shown = _page_counts(app, campaign_id)
            if shown != {"accepted": sent, "skipped": queued}:
                raise SystemExit(f"the page counts {shown} after the cancel")

            from portal.campaigns.models import Campaign
            from portal.db import db
            from portal.delivery.engine import Dispatcher

            dispatcher = Dispatcher(app, _NoTransport())  # type: ignore[arg-type]
            chunk = dispatcher.settings.unsent_chunk
            ticks: list[tuple[int, float]] = []
            marking = time.perf_counter()
            while True:
                tick = time.perf_counter()
                rows = dispatcher.skip_unsent()
                seconds = time.perf_counter() - tick
                if rows:
                    ticks.append((rows, seconds))
                    done = sum(r for r, _ in ticks)
                    if len(ticks) % 10 == 0:
                        print(f"  marked {done:,} of {queued:,}", flush=True)
                else:
                    break
            marking = time.perf_counter() - marking
            with db.begin(app) as session:
                campaign = session.get(Campaign, campaign_id)
                assert campaign is not None
                kept = campaign.settled_counts
                left = session.execute(
                    sa.select(sa.func.count())
                    .where(sa.text("campaign_id = :c AND status = 'queued'"))
                    .select_from(sa.table("delivery")),
                    {"c": campaign_id},
                ).scalar_one()
            page_after, shown_after = _page_counts(app, campaign_id)
            app.extensions["portal.db"].engine.dispose()
    load_after = os.getloadavg()
    seconds = time.perf_counter() - started
    marked = sum(rows for rows, _ in ticks)
    if marked != queued or left or kept != {"accepted": sent, "skipped": queued}:
        raise SystemExit(f"marked {marked:,} of {queued:,}; {left} left queued; kept {kept}")
    if shown_after != shown:
        raise SystemExit(f"the page said {shown} before the marking and {shown_after} after")
    first, last = _tenth(ticks, True, chunk), _tenth(ticks, False, chunk)

    lines = [
        f"PostgreSQL {postgres}; one sending campaign of {population.size:,} deliveries "
        f"made by SQL (`bench/claims.py`'s `populate`), {sent:,} of them answered, "
        f"{queued:,} queued. Load average {load_before[0]:.2f} before, "
        f"{load_after[0]:.2f} after ({seconds:.0f} s in all).",
        "",
        "| the cancel | seconds | deliveries it marks |",
        "|---|---:|---:|",
        f"| before: the campaign row and one UPDATE of its queue, in the request | "
        f"{before:.2f} | {marked_before:,} |",
        f"| after: the campaign row alone (`services.control`; median of {args.repeat}) | "
        f"{after:.4f} | 0 |",
        "",
        f"The table was vacuumed between the two sides ({vacuum:.0f} s, not counted). Right "
        f"after the cancel, the campaign page's counts (`outcome.read`, {page_seconds:.2f} s) "
        f"say {queued:,} skipped and {sent:,} delivered, as they do once the dispatcher has "
        f"marked them ({page_after:.2f} s).",
        "",
        f"The dispatcher's marking (`Dispatcher.skip_unsent`, {chunk:,} rows a transaction, "
        f"{dispatcher.settings.unsent_seconds:g} s a tick): {marked:,} deliveries in "
        f"{len(ticks)} ticks, {marking:.0f} s of marking ({marked / marking:,.0f} rows/s); "
        f"a chunk cost {first * 1000:.0f} ms over the first tenth of the queue and "
        f"{last * 1000:.0f} ms over the last ({last / first:.2f}×). The campaign's counts "
        "were kept when it was done.",
    ]
    details = "\n".join(lines)
    print(details)
    figures = [
        Figure(
            figure=f"cancelling a campaign with {queued:,} deliveries queued: the request",
            value=after,
            unit="s",
            baseline=before,
            baseline_name="the queue marked skipped in the request",
            ratio=before / after if after else None,
            target=f"≤ {REQUEST_TARGET} s, whatever the queue",
            passed=after <= REQUEST_TARGET,
        ),
        Figure(
            figure=f"marking the {queued:,} left queued: a {chunk:,}-row chunk, last tenth",
            value=last,
            unit="s",
            baseline=first,
            baseline_name="a chunk over the first tenth",
            ratio=last / first,
            target=f"≤ {FLAT_RATIO}× the first tenth",
            passed=last <= FLAT_RATIO * first,
        ),
    ]
    write(
        args.json,
        benchmark="cancel",
        title="Cancelling a campaign with millions queued",
        figures=figures,
        details_markdown=details,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
