"""Delivery retention (portal/campaigns/tally.py, run by ``table-retention``): the
deliveries of a campaign finished longer ago than DELIVERY_RETENTION_MONTHS are folded
into counters and deleted with their receipts, and every figure the staff see — the
campaign page as a whole, its outcome chart, the funnel and its chart, the A/B results,
the campaign list — is the same before, half-way through and after. Batches of two, so
every fold crosses batches; on SQLite and on PostgreSQL (PORTAL_TEST_DATABASE)."""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from portal import batches, create_app
from portal.campaigns import funnel, outcome, tally, variants
from portal.campaigns import services as campaigns
from portal.campaigns.models import Campaign
from portal.config import ConfigError, RetentionSettings, Settings
from portal.db import db
from portal.delivery.models import Delivery, DeliveryReceipt, DeliveryTally, FunnelTally
from portal.jobreport import JobReport, NoProgress
from portal.jobs import run_job
from portal.retention.tables import fold_deliveries
from portal.seams import current_portal
from tests.conftest import publish_test_catalogue
from tests.factories import FunnelFactory

S = dt.timedelta(seconds=1)
MONTH = dt.timedelta(days=31)


@pytest.fixture
def app(settings, clock) -> Iterator[Flask]:
    application = create_app(
        settings.with_overrides(retention=RetentionSettings(batch_size=2, fold_pause_seconds=0)),
        clock=clock,
    )
    application.config["TESTING"] = True
    yield application
    application.extensions["portal.db"].engine.dispose()


def _build(app: Flask, sent: dt.datetime, *, ab: bool = True, status: str = "completed") -> str:
    """A campaign sent at ``sent`` and finished then: accepted deliveries shown and
    clicked over an hour (on the notification and on its buttons), retried ones, failed,
    revoked and skipped ones, on two push services and two variants."""
    with db.begin(app) as session:
        factory = FunnelFactory(session, sent_at=sent)
        factory.campaign.status = status
        if ab:
            factory.campaign.variants = [
                {"title": "A", "body": "First"},
                {"title": "B", "body": "Second"},
            ]
        ids = []
        ids += [factory.delivery(after=5 * S) for _ in range(5)]
        ids += [factory.delivery(after=6 * S, shown=40 * S) for _ in range(4)]
        ids.append(factory.delivery(after=5 * S, shown=50 * S, clicked=8 * 60 * S))
        ids.append(factory.delivery(after=7 * S, clicked=20 * 60 * S))
        ids.append(factory.delivery(after=9 * S, shown=61 * 60 * S, button_1=62 * 60 * S))
        ids.append(factory.delivery(after=9 * S, button_2=3 * 60 * S))
        ids += [factory.delivery("failed") for _ in range(3)]
        ids += [factory.delivery("revoked") for _ in range(2)]
        ids.append(factory.delivery("skipped"))
        # A receipt for a delivery not recorded as accepted: counted apart.
        ids.append(factory.delivery("failed", shown=30 * S))
        rows = {
            d.id: d
            for d in session.execute(
                sa.select(Delivery).where(Delivery.campaign_id == factory.campaign.id)
            ).scalars()
        }
        for n, delivery_id in enumerate(ids):
            row = rows[int(delivery_id)]
            row.push_service = "mozilla" if n % 3 == 0 else "fcm"
            row.variant = n % 2 if ab else None
            if n % 4 == 0:
                row.attempts = 3
            if row.status == "failed":
                row.reason, row.last_status_code = "max_attempts", 503
            if row.status == "revoked":
                row.reason, row.last_status_code = "gone", 410
            if row.status == "skipped":
                row.reason = "frequency_cap"
        return str(factory.campaign.id)


def _figures(app: Flask, campaign_id: str, now: dt.datetime) -> dict[str, Any]:
    with db.begin(app) as session:
        campaign = session.get(Campaign, uuid.UUID(campaign_id))
        assert campaign is not None
        reading = outcome.read(session, campaign, now=now)
        listed = campaigns.list_campaigns(session, include_tests=True)
        return {
            "facts": reading.facts,
            "retries": reading.retries,
            "by_service": campaigns.outcome_by_service(session, campaign),
            "funnel": funnel.read(session, campaign, now=now),
            "variants": variants.results(session, campaign),
            "list": [(row.campaign.id, row.counts) for row in listed.rows],
        }


def _page(browser, campaign_id: str) -> str:
    page = browser.get(f"/staff/campaigns/{campaign_id}")
    assert page.status_code == 200
    # The form tokens are signed with the time (a new second, a new token); nothing
    # else may differ.
    return re.sub(r'(name="csrf_token"[^>]*value=")[^"]*"', r'\1"', page.text)


def _rows(app: Flask, model: type, campaign_id: str) -> int:
    with db.begin(app) as session:
        return session.execute(
            sa.select(sa.func.count())
            .select_from(model)
            .where(model.campaign_id == uuid.UUID(campaign_id))  # type: ignore[attr-defined]
        ).scalar_one()


def _receipts(app: Flask) -> int:
    with db.begin(app) as session:
        return session.execute(sa.select(sa.func.count()).select_from(DeliveryReceipt)).scalar_one()


def test_a_folded_campaign_shows_the_same_figures_and_its_rows_are_gone(app, clock, campaigner):
    now = clock.now()
    old = _build(app, now - 14 * MONTH)
    before, page_before = _figures(app, old, now), _page(campaigner, old)
    assert before["funnel"].accepted == 13
    assert before["funnel"].unaccepted == 1
    assert before["variants"] is not None
    assert _rows(app, Delivery, old) == 20
    assert _receipts(app) == 11

    report = run_job(app, "table-retention")

    assert not report.problems
    assert _rows(app, Delivery, old) == 0
    assert _receipts(app) == 0
    assert _figures(app, old, now) == before
    assert _page(campaigner, old) == page_before
    # Compacted: one counter row per group, however many batches of two it took.
    with db.begin(app) as session:
        groups = session.execute(
            sa.select(sa.func.count()).select_from(
                sa.select(*(DeliveryTally.__table__.c[name] for name in tally.GROUP))
                .where(DeliveryTally.campaign_id == uuid.UUID(old))
                .distinct()
                .subquery()
            )
        ).scalar_one()
    assert _rows(app, DeliveryTally, old) == groups
    with db.begin(app) as session:
        funnel_rows = session.execute(
            sa.select(FunnelTally.kind, FunnelTally.at).where(
                FunnelTally.campaign_id == uuid.UUID(old)
            )
        ).all()
    assert len(funnel_rows) == len(set(funnel_rows))
    # Run again: nothing left to fold, the same figures.
    assert not run_job(app, "table-retention").problems
    assert _figures(app, old, now) == before


def test_half_folded_the_figures_are_the_same(app, clock, catalogue_ready):
    """The readers add the counters to the rows still here: stop anywhere, same figures."""
    now = clock.now()
    old = _build(app, now - 14 * MONTH)
    before = _figures(app, old, now)
    with db.begin(app) as session:
        ids = sorted(
            session.execute(
                sa.select(Delivery.id).where(Delivery.campaign_id == uuid.UUID(old))
            ).scalars()
        )
    for chunk in (ids[:3], ids[3:4], ids[4:11]):
        with db.begin(app) as session:
            assert tally.fold(session, uuid.UUID(old), chunk) == len(chunk)
        assert _figures(app, old, now) == before
    with db.begin(app) as session:
        assert tally.compact(session, uuid.UUID(old)) is False  # rows left: not yet
    assert _rows(app, Delivery, old) == 20 - 11
    assert not run_job(app, "table-retention").problems
    assert _rows(app, Delivery, old) == 0
    assert _figures(app, old, now) == before


def test_only_campaigns_finished_before_the_window_are_folded(app, clock, catalogue_ready):
    now = clock.now()
    old = _build(app, now - 14 * MONTH, ab=False)
    cancelled = _build(app, now - 14 * MONTH, ab=False, status="cancelled")
    young = _build(app, now - 12 * MONTH, ab=False)
    long_running = _build(app, now - 14 * MONTH, ab=False)
    still_sending = _build(app, now - 14 * MONTH, ab=False, status="sending")
    with db.begin(app) as session:
        # Sent 14 months ago, finished only a month ago: kept.
        session.get(Campaign, uuid.UUID(long_running)).finished_at = now - MONTH
        session.get(Campaign, uuid.UUID(still_sending)).finished_at = None
    assert not run_job(app, "table-retention").problems
    assert (_rows(app, Delivery, old), _rows(app, Delivery, cancelled)) == (0, 0)
    for kept in (young, long_running, still_sending):
        assert _rows(app, Delivery, kept) == 20
        assert _rows(app, DeliveryTally, kept) == 0
    assert _receipts(app) == 3 * 11


def test_a_longer_window_keeps_them_longer(settings, clock):
    retention = RetentionSettings(batch_size=2, delivery_months=24, fold_pause_seconds=0)
    app = create_app(settings.with_overrides(retention=retention), clock=clock)
    try:
        publish_test_catalogue(app, clock.now())
        campaign_id = _build(app, clock.now() - 14 * MONTH)
        assert not run_job(app, "table-retention").problems
        assert _rows(app, Delivery, campaign_id) == 20
    finally:
        app.extensions["portal.db"].engine.dispose()


@pytest.mark.parametrize(
    ("environ", "problem"),
    [
        ({"DELIVERY_RETENTION_MONTHS": "12"}, "must be at least AUDIT_WINDOW_MONTHS (13)"),
        (
            {"DELIVERY_RETENTION_MONTHS": "20", "AUDIT_WINDOW_MONTHS": "24"},
            "must be at least AUDIT_WINDOW_MONTHS (24)",
        ),
        ({"DELIVERY_RETENTION_MONTHS": "0"}, "DELIVERY_RETENTION_MONTHS must be at least 1"),
        ({"DELIVERY_RETENTION_MONTHS": "a year"}, "must be a whole number"),
    ],
)
def test_a_window_shorter_than_the_audit_window_is_refused_at_start(tmp_path, environ, problem):
    with pytest.raises(ConfigError, match=re.escape(problem)):
        Settings.from_env(environ, str(tmp_path))


def test_the_window_and_the_pause_are_read_from_the_environment(tmp_path):
    defaults = Settings.from_env({}, str(tmp_path)).retention
    assert (defaults.delivery_months, defaults.fold_pause_seconds) == (13, 0.1)
    environ = {"DELIVERY_RETENTION_MONTHS": "25", "DELIVERY_FOLD_PAUSE_MS": "250"}
    read = Settings.from_env(environ, str(tmp_path)).retention
    assert (read.delivery_months, read.fold_pause_seconds) == (25, 0.25)
    with pytest.raises(ConfigError, match="DELIVERY_FOLD_PAUSE_MS"):
        Settings.from_env({"DELIVERY_FOLD_PAUSE_MS": "soon"}, str(tmp_path))


def test_the_fold_pauses_between_batches(settings, clock):
    retention = RetentionSettings(batch_size=2, fold_pause_seconds=0.05)
    app = create_app(settings.with_overrides(retention=retention), clock=clock)
    try:
        publish_test_catalogue(app, clock.now())
        campaign_id = _build(app, clock.now() - 14 * MONTH, ab=False)
        started = time.perf_counter()
        assert not run_job(app, "table-retention").problems
        took = time.perf_counter() - started
        assert _rows(app, Delivery, campaign_id) == 0
        assert took >= 10 * 0.05  # ten full batches of two, a pause after each
    finally:
        app.extensions["portal.db"].engine.dispose()


def test_a_replica_behind_stops_the_fold_and_the_next_run_goes_on(
    app, clock, catalogue_ready, monkeypatch
):
    now = clock.now()
    old = _build(app, now - 14 * MONTH)
    before = _figures(app, old, now)
    monkeypatch.setattr(batches, "replication_lag_seconds", lambda session: 60.0)
    report = run_job(app, "table-retention")
    assert report.problems == [
        "stopped after 2 rows: replication lag 60.0 s is over 10 s; run the job again to go on"
    ]
    assert _rows(app, Delivery, old) == 18  # one batch folded, then it stopped
    assert _figures(app, old, now) == before
    monkeypatch.setattr(batches, "replication_lag_seconds", lambda session: 0.0)
    assert not run_job(app, "table-retention").problems
    assert _rows(app, Delivery, old) == 0
    assert _figures(app, old, now) == before


def test_processes_folding_the_same_campaign_at_once_count_each_delivery_once(
    app, clock, catalogue_ready
):
    """Four folders at once (PostgreSQL: SKIP LOCKED shares the batches and the campaign's
    row orders the compactions; SQLite: its write lock takes them in turn)."""
    now = clock.now()
    ids = [_build(app, now - 14 * MONTH) for _ in range(3)]
    before = {campaign_id: _figures(app, campaign_id, now) for campaign_id in ids}
    portal = current_portal(app)
    errors: list[BaseException] = []

    def folder() -> None:
        try:
            with app.app_context():
                fold_deliveries(app, now, portal.settings, NoProgress(), JobReport("test"))
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=folder) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for campaign_id in ids:
        assert _rows(app, Delivery, campaign_id) == 0
        assert _figures(app, campaign_id, now) == before[campaign_id]
    with db.begin(app) as session:
        folded = session.execute(sa.select(sa.func.sum(DeliveryTally.deliveries))).scalar_one()
    assert folded == 3 * 20
