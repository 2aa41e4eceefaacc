"""The background-jobs operations page: next runs, recent runs, a run by hand."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from portal import jobs
from portal.jobs import Job, JobReport
from portal.operations.scheduler import record_run, run_recorded
from tests.helpers import all_rows, without_cell_labels


def test_admins_see_jobs_and_their_runs(app, admin_browser):
    run_recorded(app, "tombstone", trigger="scheduler", only_if_due=True)
    page = admin_browser.get("/staff/ops/jobs")
    assert page.status_code == 200
    html = without_cell_labels(page.text)
    assert "<h1>Background jobs</h1>" in html
    for name in ("dispatch", "purge", "reseal", "sweep", "tombstone"):
        assert f'<th scope="row">{name}</th>' in html
    assert "scheduler</td>" in html  # the recorded run and who triggered it


def test_an_admin_runs_a_job_now_and_it_is_audited(app, admin_browser, engine):
    response = admin_browser.post("/staff/ops/jobs/sweep/run")
    assert response.status_code == 303
    page = admin_browser.get("/staff/ops/jobs").text
    assert "sweep: 0 rows looked at, 0 changed" in page
    runs = [r for r in all_rows(engine, "job_run") if r["name"] == "sweep"]
    assert [r["trigger"] for r in runs] == ["staff"]
    entries = [r for r in all_rows(engine, "staff_audit") if r["action"] == "operations.job_run"]
    assert len(entries) == 1
    assert entries[0]["target"] == "job:sweep"


def test_an_unknown_job_changes_nothing(app, admin_browser, engine):
    response = admin_browser.post("/staff/ops/jobs/nope/run")
    assert response.status_code == 404
    assert "job" in response.text and "/staff/ops/jobs" in response.text
    assert all_rows(engine, "job_run") == []
    assert [r for r in all_rows(engine, "staff_audit") if r["action"] == "operations.job_run"] == []


def test_each_run_shows_its_start_duration_rows_and_error(
    app, admin_browser, engine, clock, monkeypatch
):
    def _explodes(app, progress) -> JobReport:
        raise RuntimeError("disk on fire")

    with monkeypatch.context() as patch:
        patch.setattr(jobs, "JOBS", (*jobs.JOBS, Job("explodes", _explodes, interval="sweep")))
        with pytest.raises(RuntimeError):
            run_recorded(app, "explodes", trigger="scheduler")
    run_recorded(app, "tombstone", trigger="command")

    html = without_cell_labels(admin_browser.get("/staff/ops/jobs").text)
    runs = html.split('aria-labelledby="runs-heading"')[1]
    started = clock.now().strftime("%Y-%m-%d %H:%M:%S")
    failed = runs.split('<th scope="row">explodes</th>')[1].split("</tr>")[0]
    assert f"<td>{started}</td>" in failed
    assert re.search(r"<td>\d+\.\d\d s</td>", failed)  # how long it took
    assert "<td>RuntimeError: disk on fire</td>" in failed
    clean = runs.split('<th scope="row">tombstone</th>')[1].split("</tr>")[0]
    assert "<td>0</td>" in clean and "<td>command</td>" in clean and "<td>—</td>" in clean


def test_the_one_off_backfills_are_listed_but_run_from_the_command_line_only(
    app, admin_browser, engine
):
    html = without_cell_labels(admin_browser.get("/staff/ops/jobs").text)
    for name in ("backfill-hash", "canonicalise-endpoints"):
        row = _row(html, name)
        assert "<td>not scheduled: run by hand only</td>" in row  # its next run
        assert f"<code>portal run-job {name}</code>" in row
        assert "<form" not in row  # no button
    # Asked for anyway: refused, nothing runs.
    response = admin_browser.post("/staff/ops/jobs/backfill-hash/run")
    assert response.status_code == 303
    assert (
        "backfill-hash is run from the command line only"
        in admin_browser.get("/staff/ops/jobs").text
    )
    assert all_rows(engine, "job_run") == []


def _row(html: str, name: str) -> str:
    jobs_table = html.split('aria-labelledby="jobs-heading"')[1].split("</table>", maxsplit=1)[0]
    return jobs_table.split(f'<tr id="job-{name}">')[1].split("</tr>")[0]


def _cell(row: str, index: int) -> str:
    cell = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)[index]
    return re.sub(r"<[^>]+>", "", cell).strip()  # its text, without the <time> around times


def test_each_job_says_what_it_does_and_how_often(app, admin_browser):
    html = without_cell_labels(admin_browser.get("/staff/ops/jobs").text)
    for entry in jobs.JOBS:
        row = _row(html, entry.name)
        assert _cell(row, 0) == entry.description.replace("'", "&#39;")
    assert _cell(_row(html, "sweep"), 1).startswith("every hour")
    assert _cell(_row(html, "dispatch"), 1).startswith("every 5 seconds, in every process")


def test_dispatch_runs_in_the_history_are_its_last_run(app, admin_browser, clock):
    """Dispatch keeps no due time of its own: its last run is the run history's."""
    for _ in range(16):
        clock.advance(seconds=60)
        record_run(
            app, JobReport("dispatch", processed=3, changed=3, seconds=0.25), trigger="scheduler"
        )
    newest = clock.now() - dt.timedelta(seconds=0.25)
    html = without_cell_labels(admin_browser.get("/staff/ops/jobs").text)
    row = _row(html, "dispatch")
    assert "never" not in row
    assert _cell(row, 2) == f"{newest:%Y-%m-%d %H:%M:%S} UTC, took 0.25 s"
    assert _cell(row, 3).startswith(f"{newest + dt.timedelta(seconds=5):%Y-%m-%d %H:%M:%S} UTC")
    runs = html.split('aria-labelledby="runs-heading"')[1]
    assert runs.count('<th scope="row">dispatch</th>') == 16


def test_a_singleton_shows_its_last_run_and_the_next_one_it_set(app, admin_browser, clock):
    run_recorded(app, "sweep", trigger="scheduler")
    started = clock.now()
    clock.advance(minutes=10)
    html = without_cell_labels(admin_browser.get("/staff/ops/jobs").text)
    row = _row(html, "sweep")
    assert _cell(row, 2).startswith(f"{started:%Y-%m-%d %H:%M:%S} UTC,")
    assert "took " in _cell(row, 2)
    assert _cell(row, 3).startswith(f"{started + dt.timedelta(hours=1):%Y-%m-%d %H:%M:%S} UTC")
    never = _row(html, "purge")
    assert _cell(never, 2) == "never"
    assert _cell(never, 3).startswith("due now")


def test_a_failed_last_run_says_so(app, admin_browser, monkeypatch):
    def _explodes(app, progress) -> JobReport:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(
        jobs,
        "JOBS",
        tuple(
            Job("sweep", _explodes, interval="sweep", description="Explodes.")
            if entry.name == "sweep"
            else entry
            for entry in jobs.JOBS
        ),
    )
    with pytest.raises(RuntimeError):
        run_recorded(app, "sweep", trigger="scheduler")
    html = without_cell_labels(admin_browser.get("/staff/ops/jobs").text)
    assert _cell(_row(html, "sweep"), 2).endswith("failed")


def test_the_page_says_when_the_scheduler_is_off(app, admin_browser):
    # The tests' settings turn the scheduler off (PORTAL_SCHEDULER=off).
    html = without_cell_labels(admin_browser.get("/staff/ops/jobs").text)
    assert "The scheduler is off in this process" in html
    assert "<code>PORTAL_SCHEDULER=off</code>" in html
    assert _cell(_row(html, "purge"), 3) == "due now (scheduler off here)"
    assert _cell(_row(html, "backfill-hash"), 3) == "not scheduled: run by hand only"


def test_the_page_says_when_the_scheduler_is_on(make_app, make_staff, browser):
    scheduled = make_app(scheduler=True)
    scheduled.extensions["portal.scheduler"].start = lambda: None  # no threads in this test
    make_staff("admin@example.test")
    admin = browser(scheduled)
    admin.sign_in("admin@example.test")
    html = without_cell_labels(admin.get("/staff/ops/jobs").text)
    assert "The scheduler is off" not in html
    assert "has not started yet" in html
    assert _cell(_row(html, "purge"), 3) == "due now"
