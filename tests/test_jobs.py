"""The table of jobs: each scheduled job's interval is a setting, the singletons are the
ones they always were, a job without an interval stops the start, and ``run-job`` finds
every job in the table."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

import pytest

from portal import create_app, jobs
from portal.config import ScheduleSettings, Settings
from portal.jobs import JOBS, Job, JobReport, JobTableError, check_table, find, job_names
from portal.operations.scheduler import SINGLETON_JOBS, PortalScheduler, interval_of

PORTAL = Path(jobs.__file__).resolve().parent


def _nothing(app, progress) -> JobReport:
    return JobReport("nothing")


def test_the_table_as_shipped_passes_its_check():
    check_table()
    assert len({entry.name for entry in JOBS}) == len(JOBS)


def test_every_scheduled_job_names_an_interval_setting_that_exists(app):
    intervals = {item.name for item in fields(ScheduleSettings)}
    scheduled = [entry for entry in JOBS if not entry.by_hand]
    assert {entry.name for entry in scheduled} == {
        "dispatch",
        "sweep",
        "tombstone",
        "purge",
        "reseal",
        "verify-log",
        "rate-limit-prune",
        "table-retention",
        "consent-log-sequencer",
    }
    for entry in scheduled:
        assert entry.interval in intervals, entry.name
        assert interval_of(app, entry.name) == getattr(ScheduleSettings(), entry.interval) > 0


def test_the_singletons_are_the_jobs_that_always_were():
    assert SINGLETON_JOBS == (
        "sweep",
        "tombstone",
        "purge",
        "reseal",
        "verify-log",
        "rate-limit-prune",
        "table-retention",
        "consent-log-sequencer",  # one at a time, and its state row's lock besides
    )
    assert not find("dispatch").singleton  # every process sends
    assert [entry.name for entry in JOBS if entry.by_hand] == [
        "backfill-hash",
        "canonicalise-endpoints",
    ]


def test_a_scheduled_job_without_an_interval_is_refused_naming_it():
    with pytest.raises(
        JobTableError, match="job 'nightly' has no interval: name the ScheduleSettings field"
    ):
        check_table((*JOBS, Job("nightly", _nothing, interval=None)))


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            Job("nightly", _nothing, interval="nightly"),
            "names the interval 'nightly', which is not a",
        ),
        (Job("once", _nothing, interval="sweep", by_hand=True), "run by hand only but names"),
        (Job("sweep", _nothing, interval="sweep"), "job 'sweep' is in the table of jobs twice"),
        (Job("quiet", _nothing, interval="sweep"), "job 'quiet' has no description"),
        (
            Job("blank", _nothing, interval=None, by_hand=True, description="  "),
            "job 'blank' has no description",
        ),
    ],
)
def test_other_table_mistakes_are_refused(entry, message):
    with pytest.raises(JobTableError, match=message):
        check_table((*JOBS, entry))


def test_the_app_and_the_scheduler_refuse_to_start_with_such_a_table(settings, clock, monkeypatch):
    app = create_app(settings, clock=clock)
    monkeypatch.setattr(jobs, "JOBS", (*JOBS, Job("nightly", _nothing, interval=None)))
    with pytest.raises(JobTableError, match="'nightly' has no interval"):
        create_app(settings, clock=clock)
    scheduler = PortalScheduler(app)
    with pytest.raises(JobTableError, match="'nightly' has no interval"):
        scheduler.start()
    assert not scheduler.started
    app.extensions["portal.db"].engine.dispose()


def test_a_by_hand_job_has_no_interval_to_ask_for():
    with pytest.raises(JobTableError, match="run by hand only"):
        find("backfill-hash").interval_seconds(Settings())


def test_run_job_finds_every_job_in_the_table(app):
    runner = app.test_cli_runner()
    unknown = runner.invoke(args=["portal", "run-job", "no-such-job"])
    assert unknown.exit_code == 2
    assert f"choose from {', '.join(job_names())}" in unknown.output
    for name in job_names():
        result = runner.invoke(args=["portal", "run-job", name])
        assert result.exit_code == 0, (name, result.output)
        assert result.output.strip().splitlines()[-1].startswith(f"{name}: ")


def test_job_functions_never_import_the_table():
    """Features' job modules import what a job returns from portal.jobreport; only the
    factory, the command line and the scheduler (and its page, with what it says about
    each job) import portal.jobs."""
    importers = []
    for path in PORTAL.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if "portal.jobs" in names:
                importers.append(str(path.relative_to(PORTAL)))
    assert sorted(importers) == [
        "__init__.py",
        "cli.py",
        "operations/scheduler.py",
        "operations/status.py",
        "operations/views.py",
    ]
