"""Job coordination: locks, due times, run records, and several processes at once."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import os
import runpy
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from collections import defaultdict
from pathlib import Path

import pytest
import sqlalchemy as sa

from portal import create_app, jobs
from portal.config import ScheduleSettings
from portal.jobs import Job, JobReport
from portal.operations.scheduler import SINGLETON_JOBS, JobBusy, job_lock, run_recorded
from tests.helpers import all_rows
from tests.support import ROOT, portal_process_environ

# Run again through PgBouncer in transaction mode by CI (.ci/pgbouncer).
pytestmark = pytest.mark.pgbouncer


def test_a_job_lock_is_exclusive(app):
    inside = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with job_lock(app, "sweep") as acquired:
            assert acquired
            inside.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    inside.wait(10)
    with job_lock(app, "sweep") as second:
        assert second is False
    with pytest.raises(JobBusy):
        run_recorded(app, "sweep", trigger="command")
    assert run_recorded(app, "sweep", trigger="scheduler", only_if_due=True) is None
    release.set()
    holder.join()
    with job_lock(app, "sweep") as again:
        assert again is True


def test_due_times_gate_scheduled_runs_and_every_run_is_recorded(app, engine, clock):
    assert run_recorded(app, "tombstone", trigger="scheduler", only_if_due=True) is not None
    assert run_recorded(app, "tombstone", trigger="scheduler", only_if_due=True) is None
    clock.advance(seconds=3599)
    assert run_recorded(app, "tombstone", trigger="scheduler", only_if_due=True) is None
    clock.advance(seconds=2)
    assert run_recorded(app, "tombstone", trigger="scheduler", only_if_due=True) is not None
    assert run_recorded(app, "tombstone", trigger="command") is not None  # by hand: always
    runs = all_rows(engine, "job_run")
    assert [(r["name"], r["trigger"]) for r in runs] == [("tombstone", "scheduler")] * 2 + [
        ("tombstone", "command")
    ]
    assert all(r["seconds"] is not None and r["error"] is None for r in runs)
    (state,) = all_rows(engine, "job_state")
    assert state["name"] == "tombstone"


def test_a_failing_job_is_recorded_with_its_error(app, engine, monkeypatch):
    def _explodes(app, progress) -> JobReport:
        raise RuntimeError("disk on fire")

    with monkeypatch.context() as patch:
        patch.setattr(jobs, "JOBS", (*jobs.JOBS, Job("explodes", _explodes, interval="sweep")))
        with pytest.raises(RuntimeError):
            run_recorded(app, "explodes", trigger="command")
    (run,) = all_rows(engine, "job_run")
    assert "disk on fire" in run["error"]


def test_the_embedded_scheduler_starts_with_the_first_request_and_stops_cleanly(settings, clock):
    app = create_app(settings.with_overrides(scheduler=True), clock=clock)
    scheduler = app.extensions["portal.scheduler"]
    assert scheduler.started is False  # commands and imports never start it
    app.test_client().get("/healthz")
    assert scheduler.started is True
    engine = app.extensions["portal.db"].engine
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        names = {r["name"] for r in all_rows(engine, "job_run")}
        if {"sweep", "tombstone", "purge", "reseal"} <= names:
            break
        time.sleep(0.2)
    assert {"sweep", "tombstone", "purge", "reseal"} <= names
    scheduler.shutdown()
    assert scheduler.stop.is_set()
    assert scheduler.started is False
    engine.dispose()


def _gunicorn_hooks(monkeypatch, tmp_path: Path) -> dict:
    """gunicorn.conf.py's settings and hooks, read without touching this process's
    metrics folder."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "metrics"))
    return runpy.run_path(str(ROOT / "gunicorn.conf.py"))


@pytest.mark.parametrize("by", ["shutdown", "gunicorn worker exit"])
def test_shutdown_waits_for_the_batch_in_hand_and_the_job_stops_after_it(
    settings, clock, monkeypatch, tmp_path, by
):
    """Graceful shutdown: the running job finishes its batch, sees the stop flag, returns
    before the next one, and its run is recorded as a clean run. A gunicorn worker does
    this in its exit hook: left to the interpreter's exit, the job would first run to its
    end (the interpreter joins the job's thread before it runs atexit functions)."""
    in_batch, release = threading.Event(), threading.Event()
    batches: list[int] = []

    def batched(app, progress) -> JobReport:
        stop = app.extensions["portal.stop"]
        report = JobReport("sweep")
        for number in range(1, 6):
            if stop.is_set():
                break
            in_batch.set()
            release.wait(20)  # the batch is being worked on
            batches.append(number)
            report.processed += 10
            report.changed += 10
        return report

    # The scheduler runs only this sweep (and dispatch, as always).
    table = (
        Job("sweep", batched, interval="sweep", description="Five batches."),
        jobs.find("dispatch"),
    )
    monkeypatch.setattr(jobs, "JOBS", table)
    app = create_app(settings.with_overrides(scheduler=True), clock=clock)
    engine = app.extensions["portal.db"].engine
    scheduler = app.extensions["portal.scheduler"]
    scheduler.start()
    try:
        assert in_batch.wait(20)
        if by == "shutdown":
            stopping = threading.Thread(target=scheduler.shutdown)
        else:
            worker_exit = _gunicorn_hooks(monkeypatch, tmp_path)["worker_exit"]
            worker = types.SimpleNamespace(wsgi=app)
            stopping = threading.Thread(target=worker_exit, args=(None, worker))
        stopping.start()
        deadline = time.monotonic() + 10
        while not scheduler.stop.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert scheduler.stop.is_set()
        time.sleep(0.2)
        assert stopping.is_alive()  # shutdown waits for the batch in hand...
        release.set()
        stopping.join(20)
        assert not stopping.is_alive()
        assert batches == [1]  # ...which finishes, and no other batch starts
        (run,) = all_rows(engine, "job_run")
        assert (run["name"], run["processed"], run["changed"], run["error"]) == (
            "sweep",
            10,
            10,
            None,
        )
        assert run["seconds"] is not None
    finally:
        release.set()
        scheduler.shutdown()
        engine.dispose()


class SchedulerProcess:
    """``flask --app app portal scheduler``, its output in a file."""

    def __init__(self, environ: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "flask", "--app", "app", "portal", "scheduler"],
                cwd=ROOT,
                env=environ,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while "scheduler running" not in self.output():
            assert self.process.poll() is None, self.output()[-3000:]
            assert time.monotonic() < deadline, self.output()[-3000:]
            time.sleep(0.1)

    def terminate(self) -> int:
        """SIGTERM, as a service manager stops it; its exit status."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


@pytest.fixture
def scheduler_processes():
    started: list[SchedulerProcess] = []

    def start(environ: dict[str, str], log: Path) -> SchedulerProcess:
        started.append(SchedulerProcess(environ, log))
        return started[-1]

    yield start
    for each in started:  # before the database is emptied: a live one holds locks
        if each.process.poll() is None:
            each.process.kill()
            each.process.wait()


def test_the_scheduler_command_runs_the_jobs_and_stops_cleanly_on_sigterm(
    settings, engine, tmp_path, scheduler_processes
):
    process = scheduler_processes(
        portal_process_environ(settings, tmp_path), tmp_path / "scheduler.log"
    )
    process.wait_ready()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        names = {r["name"] for r in all_rows(engine, "job_run")}
        if set(SINGLETON_JOBS) <= names:
            break
        time.sleep(0.2)
    assert set(SINGLETON_JOBS) <= names
    assert process.terminate() == 0
    assert "finishing the current batch" in process.output()
    assert "Traceback" not in process.output()
    runs = all_rows(engine, "job_run")
    assert all(r["error"] is None and r["seconds"] is not None for r in runs)
    assert {r["host"].rpartition(":")[2] for r in runs} == {str(process.process.pid)}


INTERVAL = 2


def _interval_variables() -> list[str]:
    """The environment variable of each singleton job's interval, from the job table."""
    variables = {
        item.name: item.metadata["env"].name for item in dataclasses.fields(ScheduleSettings)
    }
    by_name = {entry.name: entry for entry in jobs.scheduled_jobs()}
    found = []
    for name in SINGLETON_JOBS:
        interval = by_name[name].interval
        assert interval is not None, name
        found.append(variables[interval])
    return found


def test_every_singleton_job_has_an_interval_variable():
    assert "CONSENT_LOG_MAX_MERGE_DELAY_SECONDS" in _interval_variables()
    assert len(set(_interval_variables())) == len(SINGLETON_JOBS)


def test_three_scheduler_processes_run_each_singleton_job_once_per_interval(
    settings, engine, tmp_path, scheduler_processes
):
    """Three ``portal scheduler`` processes on one database, every singleton job due
    every 2 s: each job runs once per interval across all three, whichever runs it.

    Each job's interval is set through the variable its ``ScheduleSettings`` field reads
    (the job table names the field), so a job whose variable is not spelled after its
    name (the sequencer's CONSENT_LOG_MAX_MERGE_DELAY_SECONDS, default 1 s) is slowed to
    2 s too, and a second run inside one interval is still a double run."""
    environ = portal_process_environ(
        settings, tmp_path, **{variable: str(INTERVAL) for variable in _interval_variables()}
    )
    processes = [scheduler_processes(environ, tmp_path / f"scheduler-{n}.log") for n in range(3)]
    for process in processes:
        process.wait_ready()
    time.sleep(5 * INTERVAL)
    for process in processes:
        assert process.terminate() == 0, process.output()[-3000:]

    runs = all_rows(engine, "job_run")
    assert all(r["error"] is None for r in runs)
    starts: defaultdict[str, list[dt.datetime]] = defaultdict(list)
    for run in runs:
        started = run["started_at"]  # SQLite answers text
        starts[run["name"]].append(
            dt.datetime.fromisoformat(started) if isinstance(started, str) else started
        )
    assert set(starts) == set(SINGLETON_JOBS)
    for name, times in starts.items():
        times.sort()
        assert len(times) >= 3, name  # the job kept running over 10 s...
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
        assert min(gaps) >= INTERVAL, (name, gaps)  # ...never twice in one interval
    # More than one process took its turn: the database, not one process, decides.
    assert len({r["host"] for r in runs}) >= 2


WORKER = textwrap.dedent(
    """
    import sys, time, datetime as dt
    from portal import create_app
    from portal.operations.scheduler import run_recorded
    from tests.conftest import make_settings
    from portal.config import ScheduleSettings

    url, mode = sys.argv[1], sys.argv[2]
    app = create_app(make_settings(url, "/tmp/portal-worker", schedule=ScheduleSettings(sweep=2)))
    print("ready", flush=True)  # imported and built: the test names the window once all are
    start, until = map(float, sys.stdin.readline().split())
    while time.time() < start:  # every process starts together
        time.sleep(0.005)
    if mode == "tick":
        while time.time() < until:
            run_recorded(app, "sweep", trigger="scheduler", only_if_due=True)
            time.sleep(0.05)
    else:
        from portal.jobs import NoProgress
        from portal.retention.services import sweep
        from portal.config import RetentionSettings
        now = dt.datetime.now(dt.UTC) + dt.timedelta(days=90)
        sweep(app, now=now, retention=RetentionSettings(batch_size=25), progress=NoProgress())
    """
)


def _three(database_url: str, mode: str, seconds: float) -> None:
    """Three processes, the window of ``seconds`` opened only once every one of them has
    imported and built its app: on a busy machine that can take longer than the window
    (a fixed head start once left one process ticking alone at the end of it)."""
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, database_url, mode],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for worker in workers:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
    start = time.time() + 0.5
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write(f"{start} {start + seconds}\n")
        worker.stdin.close()
    for worker in workers:
        assert worker.wait(timeout=120) == 0
        assert worker.stdout is not None
        worker.stdout.close()


@pytest.mark.postgres_only
def test_three_processes_run_a_singleton_job_once_per_tick(database_url, engine):
    _three(database_url, "tick", 7.0)
    runs = sorted(r["started_at"] for r in all_rows(engine, "job_run"))
    # 7 s of ticking at a 2 s interval, whoever ran it: at most 4 runs; a starved machine
    # may manage fewer, but never two within one interval.
    assert 2 <= len(runs) <= 4
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(runs)]
    assert min(gaps) >= 2.0  # never twice in one interval


@pytest.mark.postgres_only
def test_three_processes_never_process_a_batch_twice(app, engine, subscriptions, clock):
    for _ in range(150):
        app.test_client().post(
            "/api/push/subscribe", json={"subscription": subscriptions().to_json()}
        )
    with engine.begin() as conn:  # all long silent: the sweep expires everything it sees
        conn.execute(
            sa.text(
                "UPDATE push_subscription SET state = 'stale', stale_at = :t, last_seen_at = :t"
            ),
            {"t": dt.datetime(2020, 1, 1, tzinfo=dt.UTC)},
        )
    _three(str(engine.url.render_as_string(hide_password=False)), "batches", 0.0)
    with engine.connect() as conn:
        expired = conn.execute(
            sa.text("SELECT count(*) FROM push_subscription WHERE state = 'expired'")
        ).scalar_one()
        events = conn.execute(
            sa.text(
                "SELECT subscription_id, count(*) FROM consent_event WHERE kind = 'expired' GROUP BY subscription_id"
            )
        ).all()
    assert expired == 150
    assert len(events) == 150
    assert {count for _, count in events} == {1}  # each subscription ended exactly once
    assert app.test_cli_runner().invoke(args=["portal", "verify-log"]).exit_code == 0
