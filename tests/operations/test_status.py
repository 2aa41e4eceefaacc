"""What the jobs page says about each job: its interval in words and its next run, from
its last run and its interval (or the shared due time a singleton goes by)."""

from __future__ import annotations

import datetime as dt

import pytest

from portal.config import ScheduleSettings, Settings
from portal.jobs import JOBS, find
from portal.operations.status import (
    NextRun,
    describe_interval,
    every,
    next_run,
)

NOW = dt.datetime(2026, 12, 1, 21, 0, tzinfo=dt.UTC)
SETTINGS = Settings(schedule=ScheduleSettings(dispatch=5, sweep=3600, verify_log=86400))


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (1, "every second"),
        (5, "every 5 seconds"),
        (90, "every 90 seconds"),
        (600, "every 10 minutes"),
        (3600, "every hour"),
        (5400, "every 90 minutes"),
        (86400, "every day"),
        (7 * 86400, "every 7 days"),
        (0.2, "every second"),  # never "every 0 seconds"
    ],
)
def test_an_interval_in_words(seconds, words):
    assert every(seconds) == words


def test_each_job_says_how_often_it_runs():
    assert describe_interval(find("dispatch"), SETTINGS) == "every 5 seconds, in every process"
    assert describe_interval(find("sweep"), SETTINGS) == "every hour"
    assert describe_interval(find("verify-log"), SETTINGS) == "every day"
    assert describe_interval(find("backfill-hash"), SETTINGS) == "not scheduled: run by hand only"


def test_dispatch_ticks_at_least_every_30_seconds_in_every_process():
    slow = Settings(schedule=ScheduleSettings(dispatch=120))
    assert describe_interval(find("dispatch"), slow) == "every 30 seconds, in every process"
    last = NOW - dt.timedelta(seconds=10)
    assert next_run(find("dispatch"), slow, last_started=last, due_at=None, now=NOW) == NextRun(
        at=last + dt.timedelta(seconds=30)
    )


def test_every_job_in_the_table_says_what_it_does():
    for entry in JOBS:
        assert entry.description.strip().endswith("."), entry.name


def test_the_next_run_is_the_last_run_plus_the_interval():
    sweep = find("sweep")
    last = NOW - dt.timedelta(minutes=20)
    upcoming = next_run(sweep, SETTINGS, last_started=last, due_at=None, now=NOW)
    assert upcoming == NextRun(at=dt.datetime(2026, 12, 1, 21, 40, tzinfo=dt.UTC))
    assert not upcoming.due_now
    assert upcoming.describe() == "2026-12-01 21:40:00 UTC"


def test_a_job_whose_time_has_come_or_that_never_ran_is_due_now():
    sweep = find("sweep")
    overdue = next_run(
        sweep, SETTINGS, last_started=NOW - dt.timedelta(hours=3), due_at=None, now=NOW
    )
    never = next_run(sweep, SETTINGS, last_started=None, due_at=None, now=NOW)
    exactly = next_run(
        sweep, SETTINGS, last_started=NOW - dt.timedelta(hours=1), due_at=None, now=NOW
    )
    for upcoming in (overdue, never, exactly):
        assert upcoming.due_now
        assert upcoming.describe() == "due now"


def test_dispatch_runs_that_sent_something_give_its_next_tick():
    dispatch = find("dispatch")
    last = NOW - dt.timedelta(seconds=2)
    assert next_run(dispatch, SETTINGS, last_started=last, due_at=None, now=NOW) == NextRun(
        at=NOW + dt.timedelta(seconds=3)
    )
    # Its runs are recorded only when they sent something: an old one means due now,
    # and it never keeps a shared due time (a stray one is not what it goes by).
    old = NOW - dt.timedelta(hours=1)
    later = NOW + dt.timedelta(hours=1)
    assert next_run(dispatch, SETTINGS, last_started=old, due_at=later, now=NOW).due_now


def test_a_singleton_goes_by_the_shared_due_time():
    verify = find("verify-log")
    last = NOW - dt.timedelta(hours=2)
    # An officer asked for a check now: due now, though the day is not over.
    assert next_run(verify, SETTINGS, last_started=last, due_at=NOW, now=NOW).due_now
    # The interval was shortened since the last run: the schedulers still wait for the
    # time that run set.
    set_by_the_run = last + dt.timedelta(days=1)
    shortened = Settings(schedule=ScheduleSettings(verify_log=3600))
    assert next_run(
        verify, shortened, last_started=last, due_at=set_by_the_run, now=NOW
    ) == NextRun(at=set_by_the_run)


def test_a_job_run_by_hand_is_never_scheduled():
    for name in ("backfill-hash", "canonicalise-endpoints"):
        upcoming = next_run(find(name), SETTINGS, last_started=NOW, due_at=None, now=NOW)
        assert upcoming.by_hand and not upcoming.due_now
        assert upcoming.describe() == "not scheduled: run by hand only"
