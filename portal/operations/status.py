"""What the jobs page says about each job: what it does (the table of jobs), how often it
runs, its last run (the run history, ``job_run``) and its next run (the last run plus the
interval, or the shared due time the scheduler itself goes by)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from portal import jobs
from portal.config import Settings
from portal.operations.models import JobRun, JobState

_UNITS = ((86400, "day"), (3600, "hour"), (60, "minute"), (1, "second"))


def every(seconds: float) -> str:
    """An interval in words, in the largest unit that divides it: "every 10 minutes",
    "every hour", "every 90 seconds"."""
    whole = max(round(seconds), 1)
    for size, unit in _UNITS:
        if whole % size == 0:
            count = whole // size
            return f"every {unit}" if count == 1 else f"every {count} {unit}s"
    raise AssertionError("one second divides every whole number")  # pragma: no cover


def describe_interval(job: jobs.Job, settings: Settings) -> str:
    if job.by_hand:
        return "not scheduled: run by hand only"
    if not job.singleton:
        return f"{every(job.tick_seconds(settings))}, in every process"
    return every(job.interval_seconds(settings))


@dataclass(frozen=True)
class NextRun:
    """When a job runs next: at a time, now (at the scheduler's next check), or never on
    its own (a job run by hand only)."""

    at: dt.datetime | None = None
    by_hand: bool = False

    @property
    def due_now(self) -> bool:
        return not self.by_hand and self.at is None

    def describe(self) -> str:
        if self.by_hand:
            return "not scheduled: run by hand only"
        if self.at is None:
            return "due now"
        return f"{self.at.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC"


def next_run(
    job: jobs.Job,
    settings: Settings,
    *,
    last_started: dt.datetime | None,
    due_at: dt.datetime | None,
    now: dt.datetime,
) -> NextRun:
    """The next run of ``job``, from its last run's start and its interval.

    A singleton runs when the shared ``job_state.next_run_at`` (``due_at``) says so: that
    is the last start plus the interval when the run began, or earlier when a run was
    asked for (the compliance dashboard's *check now*), and it is what every scheduler
    goes by. A job that is not a singleton (dispatch) runs at every tick of every
    process's scheduler. Never run and never due: due now.
    """
    if job.by_hand:
        return NextRun(by_hand=True)
    if job.singleton and due_at is not None:
        due: dt.datetime | None = due_at
    elif last_started is not None:
        interval = job.interval_seconds(settings) if job.singleton else job.tick_seconds(settings)
        due = last_started + dt.timedelta(seconds=interval)
    else:
        due = None
    if due is None or due <= now:
        return NextRun()
    return NextRun(at=due)


@dataclass(frozen=True)
class JobStatus:
    job: jobs.Job
    interval: str
    last_run: JobRun | None
    next_run: NextRun


def last_runs(session: Session, names: list[str]) -> dict[str, JobRun]:
    """Each job's latest run in the history (by start), for the jobs that have one."""
    found: dict[str, JobRun] = {}
    for name in names:
        run = session.scalars(
            sa.select(JobRun)
            .where(JobRun.name == name)
            .order_by(JobRun.started_at.desc(), JobRun.id.desc())
            .limit(1)
        ).first()
        if run is not None:
            found[name] = run
    return found


def statuses(session: Session, settings: Settings, now: dt.datetime) -> list[JobStatus]:
    """Every job in the table, the scheduled ones first (by name), then those run by hand."""
    table = sorted(jobs.JOBS, key=lambda entry: (entry.by_hand, entry.name))
    runs = last_runs(session, [entry.name for entry in table])
    due = {state.name: state.next_run_at for state in session.scalars(sa.select(JobState))}
    result = []
    for entry in table:
        last = runs.get(entry.name)
        result.append(
            JobStatus(
                job=entry,
                interval=describe_interval(entry, settings),
                last_run=last,
                next_run=next_run(
                    entry,
                    settings,
                    last_started=last.started_at if last else None,
                    due_at=due.get(entry.name),
                    now=now,
                ),
            )
        )
    return result
