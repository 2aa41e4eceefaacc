"""The endpoint-hash backfill job and the command line around jobs."""

from __future__ import annotations

import datetime as dt
import io
import sys

import pytest
import sqlalchemy as sa

from portal.cli import ClickProgress
from portal.jobs import NoProgress, run_job
from portal.operations.scheduler import run_recorded
from portal.seams import current_portal
from portal.subscriptions.validation import endpoint_hash
from tests.helpers import all_rows


def _subscribe(client, subscriptions, n):
    subs = [subscriptions() for _ in range(n)]
    for sub in subs:
        assert (
            client.post("/api/push/subscribe", json={"subscription": sub.to_json()}).status_code
            == 201
        )
    return subs


def test_backfill_repairs_wrong_hashes_and_is_safe_to_run_again(app, client, engine, subscriptions):
    subs = _subscribe(client, subscriptions, 5)
    with engine.begin() as conn:
        for index, sub in enumerate(subs[:3]):
            conn.execute(
                sa.text("UPDATE push_subscription SET endpoint_hash = :h WHERE endpoint = :e"),
                {"h": bytes([index]) * 32, "e": sub.endpoint},
            )
    report = run_job(app, "backfill-hash")
    assert (report.processed, report.changed, report.problems) == (5, 3, [])
    for row in all_rows(engine, "push_subscription"):
        assert bytes(row["endpoint_hash"]) == endpoint_hash(row["endpoint"])
    again = run_job(app, "backfill-hash")
    assert (again.processed, again.changed) == (5, 0)


def test_backfill_reports_a_duplicate_endpoint_instead_of_merging(
    app, client, engine, subscriptions
):
    first, second = _subscribe(client, subscriptions, 2)
    with engine.begin() as conn:  # a legacy row: the same endpoint stored twice
        conn.execute(
            sa.text(
                "UPDATE push_subscription SET endpoint = :e, endpoint_hash = :h WHERE endpoint = :old"
            ),
            {"e": first.endpoint, "h": b"\x07" * 32, "old": second.endpoint},
        )
    report = run_job(app, "backfill-hash")
    assert report.changed == 0
    assert len(report.problems) == 1
    assert "already stored on another row" in report.problems[0]


def test_cli_run_job_prints_progress_and_summary(app, client, subscriptions):
    _subscribe(client, subscriptions, 3)
    result = app.test_cli_runner().invoke(args=["portal", "run-job", "backfill-hash"])
    assert result.exit_code == 0, result.output
    assert "backfill-hash: 3 rows looked at, 0 changed" in result.output


def test_run_job_draws_a_bar_per_phase_on_a_terminal(
    app, client, clock, subscriptions, monkeypatch
):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    _subscribe(client, subscriptions, 2)  # go quiet: phase one turns them stale
    ending = subscriptions(expiration_time=(clock.now() + dt.timedelta(days=1)).timestamp() * 1000)
    client.post("/api/push/subscribe", json={"subscription": ending.to_json()})
    clock.advance(days=31)  # ...and phase two expires the one past its expiration time
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    progress = ClickProgress("sweep")
    try:
        report = run_recorded(app, "sweep", trigger="command", progress=progress)
    finally:
        progress.close()

    assert report is not None and (report.processed, report.changed) == (3, 3)
    # Each phase's bar is finished on a line of its own; the last drawing of each is full.
    bars = [line.rsplit("\r", 1)[-1] for line in terminal.getvalue().split("\n") if line]
    assert len(bars) == 2
    for bar in bars:
        assert "sweep" in bar and "[####" in bar and "100%" in bar


def test_cli_vapid_keys_prints_a_matching_pair(app):
    from portal.config import Settings

    result = app.test_cli_runner().invoke(args=["portal", "vapid-keys"])
    lines = dict(line.split("=", 1) for line in result.output.strip().splitlines())
    environ = {
        "VAPID_PRIVATE_KEY": lines["VAPID_PRIVATE_KEY"],
        "VAPID_PUBLIC_KEY": lines["VAPID_PUBLIC_KEY"],
    }
    settings = Settings.from_env(environ, app.instance_path)  # raises if the pair mismatched
    assert settings.vapid_public_key == lines["VAPID_PUBLIC_KEY"]
    assert len(lines["VAPID_PUBLIC_KEY"]) == 87


def test_cli_db_current_names_the_head(app):
    result = app.test_cli_runner().invoke(args=["db", "current"])
    assert result.exit_code == 0
    assert "(head)" in result.output


class _Interrupted(Exception):
    pass


class _StopAfterOneBatch:
    def __init__(self) -> None:
        self.batches: list[int] = []

    def start(self, total: int) -> None:
        self.total = total

    def advance(self, count: int) -> None:
        self.batches.append(count)
        raise _Interrupted


def _give_every_row_a_wrong_hash(engine) -> None:
    """A distinct wrong digest on each row (the unique index holds meanwhile)."""
    with engine.begin() as conn:
        ids = conn.execute(sa.text("SELECT id FROM push_subscription ORDER BY id")).scalars().all()
        for index, row_id in enumerate(ids):
            conn.execute(
                sa.text("UPDATE push_subscription SET endpoint_hash = :h WHERE id = :i"),
                {"h": bytes([index + 1]) * 32, "i": row_id},
            )


def test_backfill_walks_in_chunks_and_picks_up_after_an_interruption(
    app, client, engine, subscriptions
):
    from portal.subscriptions.jobs import backfill_endpoint_hash

    _subscribe(client, subscriptions, 5)
    _give_every_row_a_wrong_hash(engine)
    stopped = _StopAfterOneBatch()
    with pytest.raises(_Interrupted):
        backfill_endpoint_hash(app, batch_size=2, progress=stopped)
    assert (stopped.total, stopped.batches) == (5, [2])
    repaired = [
        bytes(row["endpoint_hash"]) == endpoint_hash(row["endpoint"])
        for row in sorted(all_rows(engine, "push_subscription"), key=lambda r: str(r["id"]))
    ]
    assert sum(repaired) == 2  # the first chunk committed; the rest waits for the next run

    report = backfill_endpoint_hash(app, batch_size=2, progress=NoProgress())
    assert (report.processed, report.changed, report.problems) == (5, 3, [])
    for row in all_rows(engine, "push_subscription"):
        assert bytes(row["endpoint_hash"]) == endpoint_hash(row["endpoint"])


def test_backfill_pauses_between_chunks_and_stops_when_a_replica_falls_behind(
    app, client, engine, subscriptions
):
    from portal.subscriptions.jobs import backfill_endpoint_hash

    _subscribe(client, subscriptions, 5)
    _give_every_row_a_wrong_hash(engine)
    pauses: list[float] = []
    lags = iter([0.5, 42.0])
    report = backfill_endpoint_hash(
        app,
        batch_size=2,
        progress=NoProgress(),
        pause_seconds=0.075,
        max_lag_seconds=10.0,
        lag=lambda session: next(lags),
        sleep=pauses.append,
    )
    # chunk 1, lag 0.5 s, pause; chunk 2, lag 42 s: stop before the third chunk
    assert pauses == [0.075]
    assert (report.processed, report.changed) == (4, 4)
    assert report.problems == [
        "stopped after 4 rows: replication lag 42.0 s is over 10 s; run the job again to go on"
    ]
    assert (
        sum(
            bytes(row["endpoint_hash"]) == endpoint_hash(row["endpoint"])
            for row in all_rows(engine, "push_subscription")
        )
        == 4
    )

    pauses.clear()
    again = backfill_endpoint_hash(
        app,
        batch_size=2,
        progress=NoProgress(),
        pause_seconds=0.075,
        max_lag_seconds=10.0,
        lag=lambda session: 0.0,
        sleep=pauses.append,
    )
    assert (again.processed, again.changed, again.problems) == (5, 1, [])
    assert pauses == [0.075, 0.075]  # between the three chunks, not after the last


def test_replication_lag_reads_zero_without_replicas(app):
    from portal.batches import replication_lag_seconds
    from portal.db import db

    with db.begin(app) as session:
        assert replication_lag_seconds(session) == 0.0


def test_the_backfill_job_takes_its_pause_and_lag_limit_from_the_settings(
    app, client, subscriptions, monkeypatch
):
    from portal.subscriptions import jobs

    seen: dict[str, object] = {}
    real = jobs.backfill_endpoint_hash

    def spy(app, **kwargs):
        seen.update(kwargs)
        return real(app, **kwargs)

    monkeypatch.setattr(jobs, "backfill_endpoint_hash", spy)
    settings = current_portal(app).settings
    run_job(app, "backfill-hash")
    assert seen["pause_seconds"] == settings.backfill_pause_seconds == 0.075
    assert seen["max_lag_seconds"] == settings.backfill_max_replication_lag_seconds == 10.0


def test_run_job_without_a_terminal_prints_plain_progress_lines(app, client, subscriptions):
    _subscribe(client, subscriptions, 3)
    result = app.test_cli_runner().invoke(args=["portal", "run-job", "backfill-hash"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    # A line when the phase starts and one when it ends, then the summary.
    assert lines[0] == "backfill-hash: 0 of 3 (0%)"
    assert "backfill-hash: 3 of 3 (100%)" in lines
    assert "[####" not in result.output


def test_plain_progress_reports_at_most_once_an_interval(monkeypatch, capsys):
    from portal import cli

    now = [100.0]
    monkeypatch.setattr(cli.time, "monotonic", lambda: now[0])
    progress = cli.ClickProgress("reseal", interval=10.0)
    progress.start(1000)
    for _ in range(5):
        now[0] += 4.0
        progress.advance(100)
    progress.close()
    assert capsys.readouterr().err.splitlines() == [
        "reseal: 0 of 1,000 (0%)",
        "reseal: 300 of 1,000 (30%)",  # 12 s after the start
        "reseal: 500 of 1,000 (50%)",  # the end of the phase
    ]
