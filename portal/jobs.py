"""Every background job in one table: what the scheduler runs, how often, whether one
process at a time, and what ``portal run-job NAME`` finds.

The job functions live with their packages and import nothing from here; this module
imports them. The table is checked when the application is created: a scheduled job
must name its interval among the ``ScheduleSettings`` fields.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields

from flask import Flask

from portal.compliance.jobs import verify_log
from portal.config import ScheduleSettings, Settings
from portal.consent.jobs import sequencer_job
from portal.delivery.jobs import dispatch_job
from portal.jobreport import JobFunction, JobReport, NoProgress, Progress
from portal.ratelimit import prune_job
from portal.retention.jobs import purge_job, sweep_job, tombstone_job
from portal.retention.tables import table_retention_job
from portal.subscriptions.jobs import (
    CANONICALISE_JOB,
    backfill_hash_job,
    canonicalise_job,
    reseal_job,
)

# The longest a scheduler waits between two checks of a job.
MAX_TICK_SECONDS = 30.0

__all__ = ["JOBS", "Job", "JobReport", "JobTableError", "NoProgress", "Progress", "run_job"]


class JobTableError(RuntimeError):
    """The table of jobs is wrong (a job without its interval, a name twice)."""


@dataclass(frozen=True)
class Job:
    name: str
    function: JobFunction
    # The ScheduleSettings field holding its interval in seconds; None for a job that
    # is never scheduled (``by_hand``).
    interval: str | None
    # One process at a time across all of them, under a lock and only when due; a job
    # that is not (dispatch) runs in every process, its work claimed row by row.
    singleton: bool = True
    # A one-off backfill: run with ``portal run-job`` after a release, never scheduled
    # and not offered to run from the jobs page.
    by_hand: bool = False
    # What it does, in a sentence: the jobs page shows it beside the job's runs.
    description: str = ""

    def interval_seconds(self, settings: Settings) -> float:
        if self.interval is None:
            raise JobTableError(f"job {self.name!r} is run by hand only: it has no interval")
        return float(getattr(settings.schedule, self.interval))

    def tick_seconds(self, settings: Settings) -> float:
        """How often each scheduler checks it: its interval, but at least every
        ``MAX_TICK_SECONDS`` (a job that is not a singleton runs at every tick)."""
        return min(self.interval_seconds(settings), MAX_TICK_SECONDS)


JOBS: tuple[Job, ...] = (
    Job(
        "dispatch",
        dispatch_job,
        interval="dispatch",
        singleton=False,
        description="Starts due campaigns, materialises their deliveries and sends what is "
        "due. Every process runs it at each tick; a run is recorded only when it sent "
        "something.",
    ),
    Job(
        "sweep",
        sweep_job,
        interval="sweep",
        description="Marks subscriptions with no sign of life as stale, and those stale for "
        "long enough or past their expiry time as expired.",
    ),
    Job(
        "tombstone",
        tombstone_job,
        interval="tombstone",
        description="Removes the endpoint and keys of subscriptions expired or revoked for "
        "the grace period, keeping a tombstone.",
    ),
    Job(
        "purge",
        purge_job,
        interval="purge",
        description="Deletes tombstones older than the audit window, counting them first.",
    ),
    Job(
        "reseal",
        reseal_job,
        interval="reseal",
        description="Moves sealed auth secrets to the current data key.",
    ),
    Job(
        "verify-log",
        verify_log,
        interval="verify_log",
        description="Walks the whole consent log, recomputes every leaf and the root of "
        "the latest signed tree head, and records the verdict for the compliance dashboard.",
    ),
    Job(
        "rate-limit-prune",
        prune_job,
        interval="rate_limit_prune",
        description="Deletes API rate-limit counters whose window has ended.",
    ),
    Job(
        "table-retention",
        table_retention_job,
        interval="table_retention",
        description="Deletes feedback digests and markers, ended staff sessions and display "
        "receipts past their retention, in batches, and keeps the counts of finished "
        "campaigns whose last delivery has come back.",
    ),
    Job(
        "consent-log-sequencer",
        sequencer_job,
        interval="consent_log_sequencer",
        description="Integrates committed consent events into the consent log's Merkle "
        "tree in sequence order, closes sequence numbers left by rolled-back writes with a "
        "gap event after the grace period, and signs the new tree head.",
    ),
    Job(
        "backfill-hash",
        backfill_hash_job,
        interval=None,
        by_hand=True,
        description="Sets every live subscription's endpoint hash from its canonical "
        "endpoint (online hash migrations).",
    ),
    Job(
        CANONICALISE_JOB,
        canonicalise_job,
        interval=None,
        by_hand=True,
        description="Rewrites endpoints stored before endpoints were canonical, merging "
        "spellings of one push resource; run once after upgrading.",
    ),
)


def check_table(jobs: tuple[Job, ...] | None = None) -> None:
    """Refuse a table a scheduler could not run: a scheduled job without an interval
    (or naming a setting that does not exist), a by-hand job with one, a name twice, a
    job that does not say what it does."""
    jobs = JOBS if jobs is None else jobs
    intervals = {item.name for item in fields(ScheduleSettings)}
    seen: set[str] = set()
    for entry in jobs:
        if entry.name in seen:
            raise JobTableError(f"job {entry.name!r} is in the table of jobs twice")
        seen.add(entry.name)
        if entry.by_hand and entry.interval is not None:
            raise JobTableError(
                f"job {entry.name!r} is run by hand only but names an interval "
                f"({entry.interval!r}): drop one or the other"
            )
        if not entry.by_hand and entry.interval is None:
            raise JobTableError(
                f"job {entry.name!r} has no interval: name the ScheduleSettings field "
                "that holds it, or mark the job by_hand"
            )
        if entry.interval is not None and entry.interval not in intervals:
            raise JobTableError(
                f"job {entry.name!r} names the interval {entry.interval!r}, which is not a "
                f"ScheduleSettings field (those are: {', '.join(sorted(intervals))})"
            )
        if not entry.description.strip():
            raise JobTableError(
                f"job {entry.name!r} has no description: say in a sentence what it does "
                "(the jobs page shows it)"
            )


def find(name: str) -> Job:
    """The job called ``name``; KeyError when there is none."""
    for entry in JOBS:
        if entry.name == name:
            return entry
    raise KeyError(name)


def job_names() -> list[str]:
    return sorted(entry.name for entry in JOBS)


def scheduled_jobs() -> list[Job]:
    return [entry for entry in JOBS if not entry.by_hand]


def singleton_jobs() -> tuple[str, ...]:
    """The scheduled jobs that run in one process at a time."""
    return tuple(entry.name for entry in scheduled_jobs() if entry.singleton)


def run_job(app: Flask, name: str, progress: Progress | None = None) -> JobReport:
    entry = find(name)
    started = time.perf_counter()
    report = entry.function(app, progress or NoProgress())
    report.seconds = time.perf_counter() - started
    return report
