"""Time travel through every transition and window of the data lifecycle."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from portal.config import RetentionSettings
from portal.jobs import NoProgress, run_job
from portal.retention import services
from portal.retention.services import months_before
from portal.subscriptions.validation import endpoint_hash
from tests.helpers import StopAfterFirstBatch, all_rows, count_rows

DAY = dt.timedelta(days=1)


def _subscribe(app, subscriptions, n=1, **kwargs):
    subs = [subscriptions(**kwargs) for _ in range(n)]
    for sub in subs:
        assert (
            app.test_client()
            .post("/api/push/subscribe", json={"subscription": sub.to_json()})
            .status_code
            == 201
        )
    return subs


def _row(engine, sub):
    return {bytes(r["endpoint_hash"]): r for r in all_rows(engine, "push_subscription")}[
        endpoint_hash(sub.endpoint)
    ]


def _state(engine, sub):
    return _row(engine, sub)["state"]


def _events(engine, kind):
    with engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT count(*) FROM consent_event WHERE kind = :k"), {"k": kind}
        ).scalar_one()


def test_quiet_for_30_days_turns_stale_then_expired_30_days_later(
    app, engine, clock, subscriptions
):
    (sub,) = _subscribe(app, subscriptions)
    clock.advance(days=29, hours=23)
    run_job(app, "sweep")
    assert _state(engine, sub) == "pending"
    clock.advance(hours=2)  # 30 days and an hour with no sign of life
    report = run_job(app, "sweep")
    assert report.changed == 1
    assert _state(engine, sub) == "stale"
    assert _events(engine, "expired") == 0  # stale is not an end
    clock.advance(days=29)
    run_job(app, "sweep")
    assert _state(engine, sub) == "stale"
    clock.advance(days=1, hours=1)
    run_job(app, "sweep")
    row = _row(engine, sub)
    assert row["state"] == "expired"
    assert row["end_reason"] == "expired"
    assert _events(engine, "expired") == 1  # a system-driven end is logged
    run_job(app, "sweep")
    assert _events(engine, "expired") == 1  # and only once


def test_a_heartbeat_or_a_success_is_a_sign_of_life(app, client, engine, clock, subscriptions):
    seen, reached = _subscribe(app, subscriptions, 2)
    clock.advance(days=20)
    client.post("/api/push/heartbeat", json={"endpoint": seen.endpoint, "auth": seen.auth_b64})
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE push_subscription SET last_success_at = :t WHERE endpoint = :e"),
            {"t": clock.now(), "e": reached.endpoint},
        )
    clock.advance(days=15)
    run_job(app, "sweep")
    assert _state(engine, seen) == "pending"
    assert _state(engine, reached) == "pending"


def test_expiration_time_passed_expires_at_once(app, engine, clock, subscriptions):
    soon = clock.now() + dt.timedelta(hours=5)
    (sub,) = _subscribe(app, subscriptions, expiration_time=soon.timestamp() * 1000)
    run_job(app, "sweep")
    assert _state(engine, sub) == "pending"
    clock.advance(hours=6)
    run_job(app, "sweep")
    assert _state(engine, sub) == "expired"
    assert _events(engine, "expired") == 1


def test_an_active_subscription_reached_long_ago_turns_stale(app, engine, clock, subscriptions):
    (sub,) = _subscribe(app, subscriptions)
    with engine.begin() as conn:  # a send reached it today: active
        conn.execute(
            sa.text(
                "UPDATE push_subscription SET state = 'active', last_success_at = :t "
                "WHERE endpoint = :e"
            ),
            {"t": clock.now(), "e": sub.endpoint},
        )
    clock.advance(days=29, hours=23)
    run_job(app, "sweep")
    assert _state(engine, sub) == "active"
    clock.advance(hours=2)
    assert run_job(app, "sweep").changed == 1
    assert _state(engine, sub) == "stale"


def test_a_stale_subscription_past_its_expiration_time_expires_and_is_tombstoned_a_week_later(
    app, engine, clock, subscriptions
):
    expires = clock.now() + dt.timedelta(days=40)
    (sub,) = _subscribe(app, subscriptions, expiration_time=expires.timestamp() * 1000)
    clock.advance(days=31)
    run_job(app, "sweep")
    assert _state(engine, sub) == "stale"
    clock.set(expires - dt.timedelta(minutes=1))  # stale for 9 days: not yet
    run_job(app, "sweep")
    assert _state(engine, sub) == "stale"
    clock.advance(minutes=2)
    run_job(app, "sweep")
    row = _row(engine, sub)
    assert (row["state"], row["end_reason"]) == ("expired", "expired")
    with engine.connect() as conn:
        previous = conn.execute(
            sa.text("SELECT previous_state FROM consent_event WHERE kind = 'expired'")
        ).scalar_one()
    assert previous == "stale"

    # An expired subscription, like a revoked one, is tombstoned after the grace period.
    clock.advance(days=6, hours=23)
    assert run_job(app, "tombstone").changed == 0
    clock.advance(hours=2)
    assert run_job(app, "tombstone").changed == 1
    row = _row(engine, sub)
    assert row["deleted_at"] is not None
    assert (row["endpoint"], row["p256dh"], row["auth_sealed"]) == (None, None, None)


def test_tombstone_after_the_grace_period_keeps_only_the_proof(
    app, client, engine, clock, subscriptions
):
    gone, kept = _subscribe(app, subscriptions, 2)
    client.post("/api/push/unsubscribe", json={"endpoint": gone.endpoint, "auth": gone.auth_b64})
    clock.advance(days=6, hours=23)
    run_job(app, "tombstone")
    assert _row(engine, gone)["deleted_at"] is None
    clock.advance(hours=2)
    report = run_job(app, "tombstone")
    assert report.changed == 1
    row = _row(engine, gone)
    assert row["deleted_at"] is not None
    for column in ("endpoint", "p256dh", "auth_sealed", "user_agent", "locale", "expiration_time"):
        assert row[column] is None, column
    for column in ("endpoint_hash", "subscriber_id", "created_at", "revoked_at"):
        assert row[column] is not None, column
    assert _row(engine, kept)["deleted_at"] is None


def test_purge_folds_old_tombstones_into_counters(app, client, engine, clock, subscriptions):
    subs = _subscribe(app, subscriptions, 3, service="fcm") + _subscribe(
        app, subscriptions, 1, service="autopush"
    )
    for sub in subs:
        client.post("/api/push/unsubscribe", json={"endpoint": sub.endpoint, "auth": sub.auth_b64})
    clock.advance(days=8)
    run_job(app, "tombstone")
    clock.set(months_before(clock.now(), -13) - DAY)  # a day short of the audit window
    assert run_job(app, "purge").changed == 0
    clock.advance(days=2)
    report = run_job(app, "purge")
    assert report.changed == 4
    assert count_rows(engine, "push_subscription") == 0
    with engine.connect() as conn:
        counters = {
            (r.push_service, r.end_reason): (r.month, r.count)
            for r in conn.execute(sa.text("SELECT * FROM retention_counter"))
        }
    assert counters == {
        ("fcm", "unsubscribed"): ("2026-01", 3),
        ("autopush", "unsubscribed"): ("2026-01", 1),
    }
    # The consent log still proves the subscriptions existed and ended.
    assert _events(engine, "unsubscribed") == 4
    assert app.test_cli_runner().invoke(args=["portal", "verify-log"]).exit_code == 0


def test_purge_adds_to_existing_counters(app, client, engine, clock, subscriptions):
    for _ in range(2):
        (sub,) = _subscribe(app, subscriptions)
        client.post("/api/push/unsubscribe", json={"endpoint": sub.endpoint, "auth": sub.auth_b64})
        clock.advance(days=8)
        run_job(app, "tombstone")
        clock.advance(days=400)
        run_job(app, "purge")
        clock.set(dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count FROM retention_counter")).scalar_one() == 2


@pytest.mark.parametrize(
    ("when", "months", "expected"),
    [
        (
            dt.datetime(2027, 3, 31, 12, tzinfo=dt.UTC),
            13,
            dt.datetime(2026, 2, 28, 12, tzinfo=dt.UTC),
        ),
        (dt.datetime(2027, 1, 15, tzinfo=dt.UTC), 13, dt.datetime(2025, 12, 15, tzinfo=dt.UTC)),
        (dt.datetime(2024, 3, 30, tzinfo=dt.UTC), 1, dt.datetime(2024, 2, 29, tzinfo=dt.UTC)),
    ],
)
def test_months_before(when, months, expected):
    assert months_before(when, months) == expected


def _five_due(job, app, client, clock, subscriptions):
    """Five subscriptions that ``job`` will change, at a clock where it is due for all."""
    subs = _subscribe(app, subscriptions, 5)
    if job == "sweep":
        clock.advance(days=31)
        return
    for sub in subs:
        client.post("/api/push/unsubscribe", json={"endpoint": sub.endpoint, "auth": sub.auth_b64})
    clock.advance(days=8)
    if job == "purge":
        run_job(app, "tombstone")
        clock.advance(days=400)


@pytest.mark.parametrize("job", ["sweep", "tombstone", "purge"])
def test_a_job_asked_to_stop_finishes_its_batch_and_leaves_the_rest_for_the_next_run(
    app, client, engine, clock, subscriptions, job
):
    """Graceful shutdown: the scheduler sets the stop flag; a job returns after the batch
    in hand, which is committed, and the next run picks up the rest."""
    _five_due(job, app, client, clock, subscriptions)
    progress = StopAfterFirstBatch()
    function = getattr(services, job)
    settings = RetentionSettings(batch_size=2)
    stopped = function(
        app, now=clock.now(), retention=settings, progress=progress, stop=progress.stop
    )
    assert progress.batches == [2]
    assert (stopped.processed, stopped.changed) == (2, 2)
    rows = all_rows(engine, "push_subscription")
    if job == "sweep":
        assert sorted(r["state"] for r in rows) == ["pending"] * 3 + ["stale"] * 2
    elif job == "tombstone":
        assert sorted(r["deleted_at"] is None for r in rows) == [False] * 2 + [True] * 3
    else:
        assert len(rows) == 3
    rest = function(app, now=clock.now(), retention=settings, progress=NoProgress())
    assert rest.changed == 3
    again = function(app, now=clock.now(), retention=settings, progress=NoProgress())
    assert again.changed == 0
