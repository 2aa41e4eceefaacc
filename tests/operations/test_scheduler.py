"""Job coordination: locks, due times, run records, and several processes at once."""

from __future__ import annotations

import datetime as dt
import itertools
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import sqlalchemy as sa

from portal import create_app
from portal.jobs import JOBS, JobReport, job
from portal.operations.scheduler import JobBusy, job_lock, run_recorded
from tests.helpers import all_rows
from tests.support import ROOT


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


def test_a_failing_job_is_recorded_with_its_error(app, engine):
    @job("explodes")
    def _explodes(app, progress) -> JobReport:
        raise RuntimeError("disk on fire")

    try:
        with pytest.raises(RuntimeError):
            run_recorded(app, "explodes", trigger="command")
    finally:
        JOBS.pop("explodes")
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


WORKER = textwrap.dedent(
    """
    import sys, time, datetime as dt
    from portal import create_app
    from portal.operations.scheduler import run_recorded
    from tests.conftest import make_settings
    from portal.config import ScheduleSettings

    url, mode, start, until = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    app = create_app(make_settings(url, "/tmp/portal-worker", schedule=ScheduleSettings(sweep=2)))
    while time.time() < start:  # every process starts together, after its imports
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
    start = time.time() + 10  # after every process has imported, even on a busy machine
    args = [database_url, mode, str(start), str(start + seconds)]
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, *args], cwd=ROOT) for _ in range(3)]
    for worker in workers:
        assert worker.wait(timeout=120) == 0


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
