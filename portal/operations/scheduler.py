"""The embedded scheduler and how its jobs are coordinated across processes.

Any number of processes may run the scheduler. A singleton job takes a lock for its run
— a PostgreSQL transaction-level advisory lock, held by a transaction kept open beside the
job's own short transactions (so it works through PgBouncer in transaction mode, see
``portal.db.held_transaction_lock``), or on SQLite an exclusive lock on a file beside the
database — and runs only when ``job_state.next_run_at`` says it is due, so each job
runs once per interval across all processes. Batch work inside jobs is claimed row by
row (SKIP LOCKED), so two runs never process the same batch either.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import fcntl
import logging
import os
import socket
import sys
import threading
import time
import traceback
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import sqlalchemy as sa
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger
from flask import Flask
from sqlalchemy.dialects import postgresql, sqlite

from portal import jobs
from portal.db import db, held_transaction_lock
from portal.jobreport import JobReport, NoProgress, Progress
from portal.operations.models import JobRun, JobState
from portal.seams import current_portal

log = logging.getLogger("portal.scheduler")
# The interpreter's switch interval in a web worker whose sender runs beside the pages.
SWITCH_INTERVAL_SECONDS = 0.001
_JOB_LOCK_SPACE = 0x6A6F62  # "job": the first key of the two-key advisory lock
_state = cast(sa.Table, JobState.__table__)
_run = cast(sa.Table, JobRun.__table__)


_thread_state = threading.local()


def lower_thread_priority(niceness: int) -> None:
    """Run the calling thread, and the threads it starts from now on, at ``niceness``
    (or nicer, if it already is). Linux gives each thread its own niceness, so a web
    worker's job threads yield the CPU to its request threads and to the other workers';
    raising one's own niceness needs no privilege. Elsewhere, or at 0, nothing changes."""
    if niceness <= 0 or sys.platform != "linux" or getattr(_thread_state, "lowered", False):
        return
    _thread_state.lowered = True
    thread = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, thread) < niceness:
            os.setpriority(os.PRIO_PROCESS, thread, niceness)
    except OSError as problem:  # a sandbox that forbids it: run as before
        log.warning("could not lower the job thread's priority (%s)", problem)


class JobBusy(RuntimeError):
    """Another process holds this job's lock right now."""


def interval_of(app: Flask, name: str) -> float:
    """The job's interval in seconds, from the setting its table entry names."""
    return jobs.find(name).interval_seconds(current_portal(app).settings)


@contextlib.contextmanager
def job_lock(app: Flask, name: str) -> Iterator[bool]:
    """Hold the job's cross-process lock for the block; yields whether it was acquired."""
    engine = app.extensions["portal.db"].engine
    if engine.dialect.name == "postgresql":
        key = zlib.crc32(name.encode()) & 0x7FFFFFFF
        with held_transaction_lock(engine, _JOB_LOCK_SPACE, key, wait=False) as acquired:
            yield acquired
        return
    database = engine.url.database or "portal"
    path = Path(f"{database}.{name}.lock")
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _due(app: Flask, name: str, now: dt.datetime) -> bool:
    with db.begin(app) as session:
        next_run = session.execute(
            sa.select(_state.c.next_run_at).where(_state.c.name == name)
        ).scalar_one_or_none()
    return next_run is None or next_run <= now


def _mark(app: Flask, name: str, *, started: dt.datetime, finished: dt.datetime | None) -> None:
    if jobs.find(name).by_hand:
        return  # never scheduled: no next run to keep (its runs are in job_run)
    values = {
        "name": name,
        "last_started_at": started,
        "last_finished_at": finished,
        "next_run_at": started + dt.timedelta(seconds=interval_of(app, name)),
    }
    with db.begin(app) as session:
        insert = (
            postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
        )(_state)
        statement = insert.values(**values)
        session.execute(
            statement.on_conflict_do_update(
                index_elements=[_state.c.name],
                set_={k: statement.excluded[k] for k in values if k != "name"},
            )
        )


def run_recorded(
    app: Flask,
    name: str,
    *,
    trigger: str,
    progress: Progress | None = None,
    only_if_due: bool = False,
) -> JobReport | None:
    """Run a job under its lock and record the run. None when it did not run (another
    process holds the lock, or it is not due yet)."""
    jobs.find(name)  # KeyError for a job not in the table, before anything is written
    clock = current_portal(app).clock
    with job_lock(app, name) as acquired:
        if not acquired:
            if only_if_due:
                return None
            raise JobBusy(name)
        started = clock.now()
        if only_if_due and not _due(app, name, started):
            return None
        with db.begin(app) as session:
            run_id = session.execute(
                sa.insert(_run)
                .values(
                    name=name,
                    trigger=trigger,
                    host=f"{socket.gethostname()}:{os.getpid()}",
                    started_at=started,
                    processed=0,
                    changed=0,
                )
                .returning(_run.c.id)
            ).scalar_one()
        _mark(app, name, started=started, finished=None)
        began = time.perf_counter()
        report: JobReport | None = None
        error: str | None = None
        try:
            report = jobs.run_job(app, name, progress or NoProgress())
        except Exception as problem:
            error = "".join(traceback.format_exception_only(problem)).strip()[:2000]
            log.exception("job %s failed", name)
            raise
        finally:
            with db.begin(app) as session:
                session.execute(
                    sa.update(_run)
                    .where(_run.c.id == run_id)
                    .values(
                        seconds=time.perf_counter() - began,
                        processed=report.processed if report else 0,
                        changed=report.changed if report else 0,
                        error=error
                        or (
                            "; ".join(report.problems)[:2000]
                            if report and report.problems
                            else None
                        ),
                    )
                )
            _mark(app, name, started=started, finished=clock.now())
        return report


def record_run(app: Flask, report: JobReport, *, trigger: str) -> None:
    """Record a run that happened outside :func:`run_recorded` (the dispatch ticks)."""
    now = current_portal(app).clock.now()
    with db.begin(app) as session:
        session.execute(
            sa.insert(_run).values(
                name=report.name,
                trigger=trigger,
                host=f"{socket.gethostname()}:{os.getpid()}",
                started_at=now - dt.timedelta(seconds=report.seconds),
                seconds=report.seconds,
                processed=report.processed,
                changed=report.changed,
                error="; ".join(report.problems)[:2000] or None,
            )
        )


SINGLETON_JOBS = jobs.singleton_jobs()


class PortalScheduler:
    """APScheduler in the background of this process, ticking every job's check."""

    def __init__(self, app: Flask, *, beside_pages: bool = False) -> None:
        self.app = app
        # In a web worker (``install``) the sender keeps to DISPATCH_WEB_CPU_SHARE of a
        # CPU so the pages keep theirs; a ``portal scheduler`` process sends at full speed.
        self.beside_pages = beside_pages
        self.stop = threading.Event()
        app.extensions["portal.stop"] = self.stop
        self.scheduler = BackgroundScheduler(timezone=dt.UTC, daemon=True)
        self.started = False
        self.niceness = 0
        self._lock = threading.Lock()

    def _tick(self, name: str) -> None:
        if self.stop.is_set():
            return
        if self.beside_pages:
            # The job threads' first tick in a web worker: below the pages from now on.
            lower_thread_priority(self.niceness)
        try:
            if not jobs.find(name).singleton:
                # Every process runs it (dispatch: each sends, claiming batches with SKIP
                # LOCKED). A run is recorded only when it did something, not every tick.
                report = jobs.run_job(self.app, name)
                if report.processed:
                    record_run(self.app, report, trigger="scheduler")
                return
            run_recorded(self.app, name, trigger="scheduler", only_if_due=True)
        except Exception as problem:
            # Never let a failure (the database down or restarting, most often) end the
            # tick loop: the job is tried again at its next tick, on fresh connections.
            cause = getattr(problem, "orig", None) or problem
            log.warning(
                "job %s failed (%s); it will be retried at its next tick",
                name,
                type(cause).__name__,
            )

    def start(self) -> None:
        with self._lock:
            if self.started:
                return
            jobs.check_table()
            settings = current_portal(self.app).settings
            # What the dispatch job's ticks keep to (portal/delivery/jobs.py).
            self.app.extensions["portal.dispatch_cpu_share"] = (
                settings.dispatch_web_cpu_share if self.beside_pages else 1.0
            )
            if self.beside_pages:
                self.niceness = settings.dispatch_web_nice
                # A request thread that wants the interpreter's lock back (after each
                # database round trip) waits for the sender to yield it: at most 1 ms
                # here, not Python's 5.
                sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_SECONDS))
            for entry in jobs.scheduled_jobs():
                name = entry.name
                # Tick often; the shared next_run_at decides whether anything runs.
                every = entry.tick_seconds(settings)
                self.scheduler.add_job(
                    self._tick,
                    IntervalTrigger(seconds=every),
                    args=[name],
                    id=name,
                    max_instances=1,
                    coalesce=True,
                    next_run_time=dt.datetime.now(dt.UTC),
                )
            self.scheduler.start()
            self.started = True
            atexit.register(self.shutdown)

    def shutdown(self) -> None:
        """Let the current batch finish (jobs check the stop flag between batches)."""
        if not self.started:
            return
        self.stop.set()
        self.scheduler.shutdown(wait=True)
        self.started = False


def install(app: Flask) -> PortalScheduler:
    """Start the scheduler with this process's first request: web workers run it; a
    command-line invocation of the app (migrations, run-job) never does."""
    scheduler = PortalScheduler(app, beside_pages=True)
    app.extensions["portal.scheduler"] = scheduler

    @app.before_request
    def _start_scheduler() -> None:
        if not scheduler.started:
            scheduler.start()

    return scheduler
