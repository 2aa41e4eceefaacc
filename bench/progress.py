"""An open campaign page's cost to the database while a campaign of millions sends.

    .venv/bin/python bench/progress.py [--sending 3000000] [--finished 1]
                                       [--finished-size 1000000] [--window 150]
                                       [--admin-url URL] [--database NAME] [--keep]

The campaign page's script asks ``progress.json`` for the campaign's progress, which
``portal.campaigns.views._progress`` reads in aggregate queries over all the campaign's
deliveries (the counts, the outcome by push service, the delivery funnel). This creates
its own database on the server --admin-url names, migrates it and fills ``delivery`` with
set-based SQL (``bench/claims.py``'s ``populate``: --finished answered campaigns of
--finished-size, one sending campaign of --sending, half of it marked sent). One reading
is timed part by part; then one open page is played for --window seconds of real time on
each side, in one run:

- **before**: as the page asked before commit ``68a29ea``: a question every 5 s, answered
  or not (``setInterval``), each read afresh;
- **after**: as it asks now: a question, then the answer's ``refreshAfter`` seconds
  (``portal.campaigns.views.POLL_SECONDS`` at least) after the answer, each answered
  through ``portal.campaigns.readings.CostlyReadings`` as ``progress.json`` answers it.

Reported for each: the readings taken, the readings at once at most, and the database
time they took (the sum of the readings' durations) per minute of the page being open.
Target: an open page costs at most a tenth of one database core (6 s a minute).

Never run by the test suite: it takes minutes and needs a PostgreSQL server.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
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
from bench.contract import Figure, add_arguments, write  # noqa: E402

POLL = 5.0  # the page's period before, and the least wait now
TARGET = 6.0  # database seconds a minute: a tenth of one core


@dataclass
class Side:
    name: str
    readings: int = 0
    busy: float = 0.0  # seconds spent in readings
    at_once: int = 0
    taken: list[float] = field(default_factory=list)  # each fresh reading's seconds
    _running: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def per_minute(self, window: float) -> float:
        return 60.0 * self.busy / window

    def counted(self, take: Callable[[], Any], *, kept: bool = True) -> Any:
        """``take()``, counted as one fresh reading (at once with others, its seconds;
        ``kept``: its seconds also in ``taken``)."""
        with self._lock:
            self._running += 1
            self.at_once = max(self.at_once, self._running)
        started = time.perf_counter()
        try:
            return take()
        finally:
            took = time.perf_counter() - started
            with self._lock:
                self._running -= 1
                self.readings += 1
                self.busy += took
                if kept:
                    self.taken.append(took)


def _in_request(app: Any, campaign_id: uuid.UUID, work: Callable[[Any], Any]) -> Any:
    """``work(campaign)`` in a request of its own to the campaign's page."""
    from portal.campaigns.models import Campaign
    from portal.db import db

    with app.test_request_context(f"/staff/campaigns/{campaign_id}"):
        campaign = db.session.get(Campaign, campaign_id)
        assert campaign is not None
        return work(campaign)


def _reading(app: Any, campaign_id: uuid.UUID) -> dict[str, Any]:
    """One reading, as ``progress.json`` takes it, in a request of its own."""
    from portal.campaigns import views

    return _in_request(app, campaign_id, lambda campaign: views._progress(campaign)["progress"])


@contextmanager
def _counted_readings(side: Side, *, kept: bool) -> Iterator[None]:
    """The views' readings afresh (a new ``_READINGS``), every fresh reading of
    ``views._progress`` counted into ``side``; put back as they were afterwards."""
    from portal.campaigns import views
    from portal.campaigns.readings import CostlyReadings

    fresh = views._progress
    views._READINGS = CostlyReadings()
    views._progress = lambda campaign: side.counted(lambda: fresh(campaign), kept=kept)
    try:
        yield
    finally:
        views._progress = fresh
        views._READINGS = CostlyReadings()


def parts(app: Any, campaign_id: uuid.UUID) -> dict[str, float]:
    """One reading's parts, each timed once."""
    from portal.campaigns import funnel, outcome, services
    from portal.campaigns.models import Campaign
    from portal.db import db
    from portal.seams import current_portal

    timed: dict[str, float] = {}
    with app.test_request_context("/"):
        portal = current_portal()
        now = portal.clock.now()
        campaign = db.session.get(Campaign, campaign_id)
        assert campaign is not None
        steps = {
            "counts and headline (outcome.read)": lambda: outcome.read(
                db.session,
                campaign,
                now=now,
                dispatch_every=portal.settings.schedule.dispatch,
                max_attempts=portal.settings.retry.max_attempts,
            ),
            "outcome by push service": lambda: services.outcome_by_service(db.session, campaign),
            "delivery funnel (funnel.read)": lambda: funnel.read(db.session, campaign, now=now),
        }
        for name, step in steps.items():
            started = time.perf_counter()
            step()
            timed[name] = time.perf_counter() - started
            db.session.rollback()
    return timed


def before(app: Any, campaign_id: uuid.UUID, window: float) -> Side:
    """A question every POLL seconds, answered or not, each read afresh."""
    side = Side("before: every 5 s, answered or not, read afresh")
    threads: list[threading.Thread] = []
    begin = time.perf_counter()
    tick = begin + POLL
    while tick < begin + window:
        time.sleep(max(0.0, tick - time.perf_counter()))
        thread = threading.Thread(target=side.counted, args=(lambda: _reading(app, campaign_id),))
        thread.start()
        threads.append(thread)
        tick += POLL
    for thread in threads:
        thread.join()
    return side


def after(app: Any, campaign_id: uuid.UUID, window: float) -> Side:
    """A question, then the answer's wait after the answer, answered as ``progress.json``
    answers it (``views._progress_reading``, ``views._refresh_after``)."""
    from portal.campaigns import views

    side = Side("after: the answer's wait after each answer, costly readings kept")
    with _counted_readings(side, kept=True):
        begin = time.perf_counter()
        time.sleep(POLL)
        while time.perf_counter() < begin + window:
            reading = _in_request(app, campaign_id, views._progress_reading)
            with app.app_context():
                wait = views._refresh_after(reading)
            time.sleep(wait)
    return side


OPEN_EVERY = 15.0  # seconds between page openings in ``opened``


def opened(app: Any, campaign_id: uuid.UUID, window: float, *, shared: bool) -> Side:
    """The page opened, its script asking as it does now, and the page opened again
    (another member of staff, a reload) every ``OPEN_EVERY`` seconds: each opening read
    afresh and the script's first question 5 s after the page (before
    ``_progress_reading``: the page read ``_progress`` itself), or each opening through
    the readings the script's answers come from and the script's first question when
    the page's reading may be renewed (``shared``). Every fresh reading of either is
    counted; ``taken`` holds the openings' own waits."""
    from portal.campaigns import views

    side = Side(
        "the page opened every 15 s beside its script: "
        + ("each opening through the script's readings" if shared else "each opening read afresh")
    )
    stop = threading.Event()

    def script(first_wait: float) -> None:
        stop.wait(first_wait)
        while not stop.is_set():
            reading = _in_request(app, campaign_id, views._progress_reading)
            with app.app_context():
                stop.wait(views._refresh_after(reading))

    poller = None
    with _counted_readings(side, kept=False):
        try:
            begin = time.perf_counter()
            at = begin
            while at < begin + window:
                time.sleep(max(0.0, at - time.perf_counter()))
                started = time.perf_counter()
                reading = _in_request(
                    app, campaign_id, views._progress_reading if shared else views._progress
                )
                side.taken.append(time.perf_counter() - started)
                if poller is None:  # the first opening's script: its first question
                    with app.app_context():
                        first = views._refresh_after(reading) if shared else POLL
                    poller = threading.Thread(target=script, args=(first,))
                    poller.start()
                at += OPEN_EVERY
            time.sleep(max(0.0, begin + window - time.perf_counter()))
        finally:
            stop.set()
            if poller is not None:
                poller.join()
    return side


def _figure(name: str, new: Side, old: Side, baseline_name: str, window: float) -> Figure:
    """One side's database seconds a minute against the other's, with the target."""
    return Figure(
        figure=name,
        value=round(new.per_minute(window), 1),
        unit="s a minute",
        baseline=round(old.per_minute(window), 1),
        baseline_name=baseline_name,
        ratio=round(new.per_minute(window) / old.per_minute(window), 3) if old.busy else None,
        target=f"≤ {TARGET:.0f} s a minute (a tenth of one core)",
        passed=new.per_minute(window) <= TARGET,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sending", type=int, default=3_000_000)
    parser.add_argument("--finished", type=int, default=1)
    parser.add_argument("--finished-size", type=int, default=1_000_000)
    parser.add_argument("--window", type=float, default=150.0, help="seconds a side")
    add_database_arguments(parser, "portal_bench_progress")
    add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.sending = min(args.sending, 200_000)
        args.finished_size = min(args.finished_size, 20_000)
        args.window = min(args.window, 20.0)

    load_before = os.getloadavg()
    started = time.perf_counter()
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
            _reading(app, population.sending)  # warm: the table's pages in memory
            split = parts(app, population.sending)
            sides = [
                before(app, population.sending, args.window),
                after(app, population.sending, args.window),
            ]
            openings = [
                opened(app, population.sending, args.window, shared=False),
                opened(app, population.sending, args.window, shared=True),
            ]
            app.extensions["portal.db"].engine.dispose()
    load_after = os.getloadavg()
    seconds = time.perf_counter() - started

    old, new = sides
    lines = [
        f"PostgreSQL {postgres}; {rows:,} deliveries: {args.finished} finished campaign(s) of "
        f"{args.finished_size:,} and one sending campaign of {population.size:,}, "
        f"{sent:,} of it sent, made by SQL (`bench/claims.py`'s `populate`). One open page "
        f"played for {args.window:.0f} s of real time on each side; load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after ({seconds:.0f} s in all).",
        "",
        "One reading, part by part (after one untimed reading):",
        "",
        "| part | seconds |",
        "|---|---:|",
        *(f"| {name} | {value:.2f} |" for name, value in split.items()),
        "",
        "| side | readings | at once, at most | each, seconds | database seconds a minute |",
        "|---|---:|---:|---|---:|",
    ]
    for side in sides:
        each = ", ".join(f"{t:.1f}" for t in side.taken)
        lines.append(
            f"| {side.name} | {side.readings} | {side.at_once} | {each} | "
            f"{side.per_minute(args.window):.1f} |"
        )
    lines += [
        "",
        f"The page opened every {OPEN_EVERY:.0f} s (another member of staff, a reload) "
        "while its script asks as above, for the same window: before `3317517` each "
        "opening read the campaign afresh (and its script first asked 5 s after it); now "
        "it is answered from the readings the script's answers come from. Every fresh "
        "reading of either is counted:",
        "",
        "| side | openings | each opening's wait, seconds | fresh readings | "
        "database seconds a minute |",
        "|---|---:|---|---:|---:|",
    ]
    for side in openings:
        each = ", ".join(f"{t:.2f}" for t in side.taken)
        lines.append(
            f"| {side.name} | {len(side.taken)} | {each} | {side.readings} | "
            f"{side.per_minute(args.window):.1f} |"
        )
    details = "\n".join(lines)
    print(details)
    alone, together = openings
    now_median = sorted(together.taken)[len(together.taken) // 2]
    was_median = sorted(alone.taken)[len(alone.taken) // 2]
    figures = [
        _figure(
            f"database time of one open campaign page, a campaign of {population.size:,} "
            "deliveries sending",
            new,
            old,
            "a question every 5 s, read afresh",
            args.window,
        ),
        _figure(
            f"database time of a campaign page of {population.size:,} deliveries opened "
            f"every {OPEN_EVERY:.0f} s beside its script (median opening "
            f"{now_median:.2f} s, was {was_median:.1f} s)",
            together,
            alone,
            "each opening read afresh",
            args.window,
        ),
    ]
    write(
        args.json,
        benchmark="progress",
        title="An open campaign page at scale",
        figures=figures,
        details_markdown=details,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
