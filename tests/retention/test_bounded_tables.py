"""The bounded tables (portal/retention/tables.py, rate limits in portal/ratelimit.py):
for each, rows older than its window go, younger rows stay, and the figures the pages
show are the same afterwards. Run in batches of two, so every walk crosses batches; on
SQLite and on PostgreSQL (PORTAL_TEST_DATABASE)."""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from flask import Flask

from portal import create_app
from portal.campaigns import funnel
from portal.compliance.services import chain_status
from portal.config import ConfigError, RetentionSettings, Settings
from portal.db import db
from portal.delivery.models import DeliveryReceipt
from portal.feedback import services as feedback
from portal.feedback.models import FeedbackApplied, FeedbackDigest
from portal.jobs import job_names, run_job
from portal.operations.models import RECENT_RUNS_LISTED, JobRun
from portal.operations.status import statuses
from portal.ratelimit import RateLimitCounter, window_start
from portal.retention.tables import RECENT_DIGESTS_KEPT
from portal.seams import current_portal
from portal.staff.models import Role, StaffSession, StaffUser
from tests.conftest import publish_test_catalogue
from tests.factories import FunnelFactory

DAY = dt.timedelta(days=1)


@pytest.fixture
def app(settings, clock) -> Iterator[Flask]:
    application = create_app(
        settings.with_overrides(retention=RetentionSettings(batch_size=2)), clock=clock
    )
    yield application
    application.extensions["portal.db"].engine.dispose()


def _count(app: Flask, model: type) -> int:
    with db.begin(app) as session:
        return session.execute(sa.select(sa.func.count()).select_from(model)).scalar_one()


def _retain(app: Flask) -> None:
    report = run_job(app, "table-retention")
    assert not report.problems


def test_the_job_is_in_the_table_of_jobs():
    assert "table-retention" in job_names()


def _digest(session, at: dt.datetime) -> FeedbackDigest:
    row = FeedbackDigest(received_at=at, result="accepted", events=1, applied=1)
    session.add(row)
    return row


def test_old_feedback_digests_go_and_the_page_lists_the_same_ones(app, clock):
    now = clock.now()
    with db.begin(app) as session:
        for n in range(RECENT_DIGESTS_KEPT + 2):  # within the window
            _digest(session, now - n * dt.timedelta(hours=1))
        for n in range(5):  # 91 days and more
            _digest(session, now - (91 + n) * DAY)
    with db.begin(app) as session:
        listed = [d.id for d in feedback.recent_digests(session, RECENT_DIGESTS_KEPT)]
    _retain(app)
    assert _count(app, FeedbackDigest) == RECENT_DIGESTS_KEPT + 2
    with db.begin(app) as session:
        assert [d.id for d in feedback.recent_digests(session, RECENT_DIGESTS_KEPT)] == listed
        oldest = session.execute(sa.select(sa.func.min(FeedbackDigest.received_at))).scalar()
    assert oldest >= now - 90 * DAY


def test_the_newest_digests_the_page_lists_stay_however_old(app, clock):
    now = clock.now()
    with db.begin(app) as session:
        for n in range(RECENT_DIGESTS_KEPT + 3):
            _digest(session, now - (200 + n) * DAY)
    with db.begin(app) as session:
        listed = [d.id for d in feedback.recent_digests(session, RECENT_DIGESTS_KEPT)]
    _retain(app)
    with db.begin(app) as session:
        assert [d.id for d in feedback.recent_digests(session, RECENT_DIGESTS_KEPT)] == listed
    assert _count(app, FeedbackDigest) == RECENT_DIGESTS_KEPT


def _marker(session, at: dt.datetime, digest: FeedbackDigest | None = None) -> None:
    key = uuid.uuid4().bytes
    session.add(
        FeedbackApplied(
            organization="org",
            event_key_hash=hashlib.sha256(key).digest(),
            key_kind="delivery",
            provider="fcm",
            target_hash=hashlib.sha256(b"target" + key).digest(),
            outcome="revoked",
            applied_at=at,
            digest_id=digest.id if digest else None,
        )
    )


def test_old_feedback_markers_go_younger_ones_stay(app, clock):
    now = clock.now()
    with db.begin(app) as session:
        digest = _digest(session, now - 40 * DAY)
        session.flush()
        for n in range(5):
            _marker(session, now - (31 + n) * DAY, digest)
        for n in range(3):
            _marker(session, now - (29 - n) * DAY, digest)
    _retain(app)
    with db.begin(app) as session:
        kept = session.execute(sa.select(FeedbackApplied.applied_at)).scalars().all()
    assert len(kept) == 3
    assert all(at > now - 30 * DAY for at in kept)
    assert _count(app, FeedbackDigest) == 1  # fewer than the page lists: kept


def test_ended_staff_sessions_go_live_and_recent_ones_stay(app, clock):
    now = clock.now()
    idle = dt.timedelta(minutes=30)
    with db.begin(app) as session:
        user = StaffUser(
            email="ops@example.test",
            password_hash="x",
            created_at=now - 30 * DAY,
            must_replace_password=False,
        )
        user.set_roles({Role.ADMIN})
        session.add(user)
        session.flush()

        def add(created: dt.datetime, seen: dt.datetime, expires: dt.datetime) -> bytes:
            token = uuid.uuid4().bytes + uuid.uuid4().bytes
            session.add(
                StaffSession(
                    id=token,
                    staff_user_id=user.id,
                    created_at=created,
                    last_seen_at=seen,
                    expires_at=expires,
                )
            )
            return token

        live = add(now - DAY / 24, now - dt.timedelta(minutes=1), now + 11 * DAY / 24)
        just_ended = add(now - DAY / 2, now - idle - DAY / 2, now + DAY / 4)  # idle 12 h ago
        expired_long_ago = add(now - 3 * DAY, now - 3 * DAY, now - 2 * DAY)
        idle_long_ago = add(now - 5 * DAY, now - 5 * DAY, now + DAY)
    _retain(app)
    with db.begin(app) as session:
        kept = set(session.execute(sa.select(StaffSession.id)).scalars())
    assert kept == {live, just_ended}
    assert expired_long_ago not in kept and idle_long_ago not in kept


def test_rate_limit_counters_of_ended_windows_go_the_current_ones_count_on(app, clock):
    now = clock.now()
    window = app.extensions["portal"].settings.rate_limit.window_seconds
    current = window_start(now, window)
    with db.begin(app) as session:
        for n in range(5):
            session.add(
                RateLimitCounter(
                    key=hashlib.sha256(b"old%d" % n).digest(),
                    window_start=current - (n + 1) * dt.timedelta(seconds=window),
                    hits=3,
                )
            )
        for n in range(3):
            session.add(
                RateLimitCounter(
                    key=hashlib.sha256(b"now%d" % n).digest(), window_start=current, hits=7
                )
            )
    run_job(app, "rate-limit-prune")
    with db.begin(app) as session:
        kept = session.execute(
            sa.select(RateLimitCounter.window_start, RateLimitCounter.hits)
        ).all()
    assert [(start, hits) for start, hits in kept] == [(current, 7)] * 3


def test_receipts_live_as_long_as_their_delivery_and_the_funnel_is_unchanged(app, clock):
    sent = clock.now()
    publish_test_catalogue(app, sent)
    with db.begin(app) as session:
        factory = FunnelFactory(session, sent_at=sent)
        factory.many(3, shown=2 * dt.timedelta(seconds=1))
        factory.many(2, shown=dt.timedelta(seconds=2), clicked=dt.timedelta(seconds=9))
        factory.many(2, "failed")
        campaign = factory.campaign
        # It finished a month before the check below: its deliveries are kept (their own
        # retention, tests/retention/test_delivery_retention.py), and so their receipts.
        campaign.finished_at = sent + 13 * 31 * DAY
        # Receipts whose delivery is gone, old and recent.
        for n in range(5):
            session.add(DeliveryReceipt(delivery_id=str(9_000_000 + n), event="shown", at=sent))
    clock.advance(seconds=14 * 31 * 86400)  # past the 13-month window
    later = clock.now()
    with db.begin(app) as session:
        for n in range(2):
            session.add(
                DeliveryReceipt(delivery_id=str(9_100_000 + n), event="shown", at=later - DAY)
            )
    with db.begin(app) as session:
        before = funnel.read(session, campaign, now=later)
    _retain(app)
    with db.begin(app) as session:
        after = funnel.read(session, campaign, now=later)
        ids = set(session.execute(sa.select(DeliveryReceipt.delivery_id)).scalars())
    assert after == before
    assert (after.accepted, after.shown, after.clicked) == (5, 5, 2)
    assert not any(i.startswith("9000") for i in ids)  # old, delivery gone: deleted
    assert {i for i in ids if i.startswith("9100")} == {"9100000", "9100001"}  # recent
    assert len(ids) == 5 + 2  # the campaign's deliveries' receipts (7 rows) all stayed
    assert _count(app, DeliveryReceipt) == 7 + 2


def _job_run(session, name: str, at: dt.datetime, *, finished: bool = True) -> JobRun:
    row = JobRun(
        name=name,
        trigger="scheduler",
        host="test:1",
        started_at=at,
        seconds=0.01 if finished else None,
        processed=0,
        changed=0,
    )
    session.add(row)
    session.flush()
    return row


def test_old_job_runs_go_and_the_jobs_pages_show_the_same(app, clock):
    now = clock.now()
    with db.begin(app) as session:
        # A job whose newest run, and newest finished run (by start, as the pages read
        # them), are both old: they stay.
        verify_finished = _job_run(session, "verify-log", now - 30 * DAY)
        verify_older = _job_run(session, "verify-log", now - 31 * DAY)
        verify_stuck = _job_run(session, "verify-log", now - 29 * DAY, finished=False)
        # The sequencer's runs, one a second, some of them 8 days and more ago.
        old_sequencer = [
            _job_run(session, "consent-log-sequencer", now - 8 * DAY - n * dt.timedelta(seconds=1))
            for n in range(5)
        ]
        # More than the jobs page lists, all recent.
        recent_sequencer = [
            _job_run(session, "consent-log-sequencer", now - n * dt.timedelta(seconds=1))
            for n in range(RECENT_RUNS_LISTED + 3)
        ]
        old_ids = {row.id for row in (*old_sequencer, verify_older)}
        kept_ids = {row.id for row in (*recent_sequencer, verify_finished, verify_stuck)}
    settings = current_portal(app).settings
    with db.begin(app) as session:
        statuses_before = [
            (s.job.name, s.last_run.id if s.last_run else None)
            for s in statuses(session, settings, now)
        ]
        listed = list(
            session.execute(
                sa.select(JobRun.id).order_by(JobRun.id.desc()).limit(RECENT_RUNS_LISTED)
            ).scalars()
        )
        check_before = chain_status(session, now)
    _retain(app)
    with db.begin(app) as session:
        ids = set(session.execute(sa.select(JobRun.id)).scalars())
        statuses_after = [
            (s.job.name, s.last_run.id if s.last_run else None)
            for s in statuses(session, settings, now)
        ]
        check_after = chain_status(session, now)
        assert (
            list(
                session.execute(
                    sa.select(JobRun.id).order_by(JobRun.id.desc()).limit(RECENT_RUNS_LISTED)
                ).scalars()
            )
            == listed
        )
    assert not ids & old_ids
    assert kept_ids <= ids
    assert statuses_after == statuses_before
    assert check_after.last_result.id == check_before.last_result.id == verify_finished.id


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("JOB_RUN_RETENTION_DAYS", "0", "JOB_RUN_RETENTION_DAYS must"),
        ("FEEDBACK_DIGEST_RETENTION_DAYS", "0", "FEEDBACK_DIGEST_RETENTION_DAYS must"),
        ("FEEDBACK_MARKER_RETENTION_DAYS", "-3", "FEEDBACK_MARKER_RETENTION_DAYS must"),
        # A negative margin would delete sessions still in use.
        ("STAFF_SESSION_RETENTION_DAYS", "-1", "STAFF_SESSION_RETENTION_DAYS must not be"),
        ("RECEIPT_RETENTION_MONTHS", "0", "RECEIPT_RETENTION_MONTHS must"),
        ("TABLE_RETENTION_INTERVAL_SECONDS", "soon", "must be a whole number"),
    ],
)
def test_retention_settings_refuse_windows_that_would_delete_too_much(
    tmp_path, name, value, message
):
    with pytest.raises(ConfigError, match=message):
        Settings.from_env({name: value}, str(tmp_path))


def test_the_defaults_are_the_documented_ones(tmp_path):
    retention = Settings.from_env({}, str(tmp_path)).retention
    assert (
        retention.feedback_digest_days,
        retention.feedback_marker_days,
        retention.staff_session_days,
        retention.receipt_months,
        retention.job_run_days,
    ) == (90, 30, 1, 13, 7)
    assert Settings.from_env({}, str(tmp_path)).schedule.table_retention == 3600
    assert Settings.from_env({}, str(tmp_path)).database_prepared_statements is False
