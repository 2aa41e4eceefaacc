"""The background-jobs operations page: next runs, recent runs, a run by hand."""

from __future__ import annotations

import re

import pytest

from portal import jobs
from portal.jobs import Job, JobReport
from portal.operations.scheduler import run_recorded
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
    assert admin_browser.post("/staff/ops/jobs/nope/run").status_code == 303
    assert all_rows(engine, "job_run") == []


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


def test_the_one_off_backfills_are_not_offered_on_the_page(app, admin_browser):
    html = admin_browser.get("/staff/ops/jobs").text
    for name in ("backfill-hash", "canonicalise-endpoints"):
        assert f'<th scope="row">{name}</th>' not in html
