"""The delivery table's monthly partitions (PostgreSQL, portal/delivery/partitions.py):
every campaign's deliveries in its month's partition, the coming months made ahead, and a
past month whose campaigns all finished before the retention window folded into their
counters and dropped whole — the campaign pages showing the same figures."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa
from flask import Flask

from portal import create_app
from portal.campaigns.models import Campaign
from portal.config import RetentionSettings
from portal.db import db, held_transaction_lock, uuid7
from portal.delivery import partitions
from portal.delivery.models import Delivery, DeliveryTally
from portal.delivery.partitions import Month
from portal.jobs import run_job
from portal.retention.services import months_before
from tests.campaigns.test_tally import MONTH, _build, _figures, _page, _receipts, _rows


@pytest.fixture
def app(settings, clock, backend) -> Iterator[Flask]:
    if backend != "postgresql":
        pytest.skip("delivery is one table on SQLite")
    application = create_app(
        settings.with_overrides(
            retention=RetentionSettings(
                batch_size=2, fold_pause_seconds=0, partition_lock_timeout_ms=300
            )
        ),
        clock=clock,
    )
    application.config["TESTING"] = True
    with db.begin(application) as session:
        before = partitions.months(session)
    yield application
    # The months as they were: the next test of this database starts from the same.
    with db.begin(application) as session:
        for month in partitions.months(session):
            if month not in before:
                session.execute(sa.text(f"DROP TABLE {month.name}"))
        for month in before:
            if month not in partitions.months(session):
                partitions.create(session, month, lock_timeout_ms=5000)
    application.extensions["portal.db"].engine.dispose()


def _partition_of(app: Flask, campaign_id: str) -> set[str]:
    with db.begin(app) as session:
        return set(
            session.execute(
                sa.text(
                    "SELECT DISTINCT tableoid::regclass::text FROM delivery"
                    " WHERE campaign_id = :campaign"
                ),
                {"campaign": uuid.UUID(campaign_id)},
            ).scalars()
        )


def _months(app: Flask) -> list[Month]:
    with db.begin(app) as session:
        return partitions.months(session)


def _make(app: Flask, month: Month) -> int:
    with db.begin(app) as session:
        return partitions.create(session, month, lock_timeout_ms=5000)


def test_the_bounds_are_the_lowest_uuid7_of_the_month():
    month = Month(2025, 12)
    assert month.next() == Month(2026, 1)
    low, high = partitions.bound(month.start), partitions.bound(month.end)
    last = month.end - dt.timedelta(milliseconds=1)
    for at in (month.start, month.start + dt.timedelta(days=15), last):
        assert low <= uuid7(at=at) < high
    assert uuid7(at=month.start - dt.timedelta(milliseconds=1)) < low
    assert uuid7(at=month.end) >= high
    assert partitions.is_partition("delivery_2025_12")
    assert partitions.is_partition("delivery_default")
    assert not partitions.is_partition("delivery_tally")
    assert not partitions.is_partition("delivery_receipt")


def test_the_migration_partitions_delivery_and_a_campaign_lands_in_its_month(
    app, clock, catalogue_ready
):
    now = dt.datetime.now(dt.UTC)
    this = Month.of(now)
    assert {this, this.next(), this.next().next()} <= set(_months(app))
    with db.begin(app) as session:
        assert partitions.partitioned(session)
    made_now = _build(app, now, ab=False)
    assert _partition_of(app, made_now) == {this.name}
    # An id of no month partition (here: a month made by no one): the default partition.
    long_ago = _build(app, dt.datetime(2001, 5, 2, tzinfo=dt.UTC), ab=False)
    assert _partition_of(app, long_ago) == {"delivery_default"}


def test_a_month_whose_campaigns_all_finished_is_counted_and_dropped_whole(app, clock, campaigner):
    now = clock.now()
    sent = now - 14 * MONTH
    month = Month.of(sent)
    assert _make(app, month) == 0
    first, second = _build(app, sent), _build(app, sent + dt.timedelta(days=1), ab=False)
    assert _partition_of(app, first) == _partition_of(app, second) == {month.name}
    before = {c: _figures(app, c, now) for c in (first, second)}
    page_before = _page(campaigner, first)
    assert _receipts(app) == 2 * 11

    report = run_job(app, "table-retention")

    assert not report.problems
    assert month not in _months(app)
    assert (_rows(app, Delivery, first), _rows(app, Delivery, second)) == (0, 0)
    assert report.changed >= 40
    assert _receipts(app) == 0
    assert {c: _figures(app, c, now) for c in (first, second)} == before
    assert _page(campaigner, first) == page_before
    # One counter row per group: counted set-wise, in one go.
    with db.begin(app) as session:
        groups = session.execute(
            sa.select(sa.func.count()).select_from(
                sa.select(DeliveryTally.status, DeliveryTally.reason, DeliveryTally.variant)
                .where(DeliveryTally.campaign_id == uuid.UUID(first))
                .group_by(
                    DeliveryTally.status,
                    DeliveryTally.reason,
                    DeliveryTally.last_status_code,
                    DeliveryTally.push_service,
                    DeliveryTally.variant,
                )
                .subquery()
            )
        ).scalar_one()
    assert _rows(app, DeliveryTally, first) == groups
    # And again: nothing to do, the same figures.
    assert not run_job(app, "table-retention").problems
    assert {c: _figures(app, c, now) for c in (first, second)} == before


def test_a_campaign_still_sending_keeps_its_month_and_a_month_held_long_folds_row_by_row(
    app, clock, catalogue_ready
):
    # A month that ended within the cutoff's month: it may still be dropped whole.
    sent = months_before(clock.now(), 13) - dt.timedelta(days=20)
    month = Month.of(sent)
    _make(app, month)
    done = _build(app, sent, ab=False)
    sending = _build(app, sent + dt.timedelta(hours=1), ab=False, status="sending")
    with db.begin(app) as session:
        session.get(Campaign, uuid.UUID(sending)).finished_at = None

    assert not run_job(app, "table-retention").problems
    # Kept whole: neither dropped (a campaign of its month still sends) nor folded row by
    # row (the month may still be dropped whole).
    assert month in _months(app)
    assert (_rows(app, Delivery, done), _rows(app, Delivery, sending)) == (20, 20)
    assert _rows(app, DeliveryTally, done) == 0

    # A month later the cutoff has passed the month's end by a month: the finished
    # campaign is folded row by row; the one sending keeps its rows, and the month.
    clock.advance(days=62)
    before = _figures(app, done, clock.now())
    assert not run_job(app, "table-retention").problems
    assert month in _months(app)
    assert (_rows(app, Delivery, done), _rows(app, Delivery, sending)) == (0, 20)
    assert _figures(app, done, clock.now()) == before

    # It finishes; once that is a window ago, the month goes with what was left.
    with db.begin(app) as session:
        campaign = session.get(Campaign, uuid.UUID(sending))
        campaign.status, campaign.finished_at = "completed", clock.now()
    clock.advance(days=13 * 31 + 1)
    left = _figures(app, sending, clock.now())
    assert not run_job(app, "table-retention").problems
    assert month not in _months(app)
    assert _rows(app, Delivery, sending) == 0
    assert _figures(app, sending, clock.now()) == left


def test_the_coming_months_are_made_and_rows_in_the_default_partition_move_in(
    app, clock, catalogue_ready
):
    # A month no partition was made for (the job did not run): its campaign went to the
    # default partition.
    month = Month(2026, 6)
    assert month not in _months(app)
    clock.set(month.start + dt.timedelta(days=3))
    stray = _build(app, month.start + dt.timedelta(days=2), ab=False)
    assert _partition_of(app, stray) == {"delivery_default"}
    before = _figures(app, stray, clock.now())

    assert not run_job(app, "table-retention").problems

    assert {month, month.next(), month.next().next()} <= set(_months(app))
    assert _partition_of(app, stray) == {month.name}
    assert _figures(app, stray, clock.now()) == before
    # Made already: the next run makes none and moves nothing.
    with db.begin(app) as session:
        assert partitions.create_ahead(session, clock.now(), lock_timeout_ms=300) == []


def test_a_drop_that_cannot_have_its_lock_keeps_everything_and_the_next_run_drops_it(
    app, clock, catalogue_ready, database_url
):
    now = clock.now()
    sent = now - 14 * MONTH
    month = Month.of(sent)
    _make(app, month)
    with db.begin(app) as session:
        partitions.create_ahead(session, now, lock_timeout_ms=5000)  # only the drop waits
    old = _build(app, sent, ab=False)
    before, receipts = _figures(app, old, now), _receipts(app)
    url = database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as reader:
        # A long read of the deliveries: the drop must wait for it, and gives up after
        # DELIVERY_PARTITION_LOCK_TIMEOUT_MS (300 here) rather than stall the senders.
        reader.execute("SELECT count(*) FROM delivery").fetchone()
        report = run_job(app, "table-retention")
        assert report.problems == [f"{month.name} not dropped: LockNotAvailable"]
        assert month in _months(app)
        reader.rollback()
    # Nothing counted, nothing deleted, and not folded row by row meanwhile either.
    assert _rows(app, Delivery, old) == 20
    assert _rows(app, DeliveryTally, old) == 0
    assert _receipts(app) == receipts > 0
    assert _figures(app, old, now) == before

    assert not run_job(app, "table-retention").problems
    assert month not in _months(app)
    assert _figures(app, old, now) == before


def test_nothing_of_it_on_sqlite(settings, clock, backend):
    if backend != "sqlite":
        pytest.skip("the SQLite side")
    app = create_app(settings, clock=clock)
    try:
        with db.begin(app) as session:
            assert not partitions.partitioned(session)
            assert partitions.months(session) == []
            assert partitions.create_ahead(session, clock.now(), lock_timeout_ms=10) == []
            assert partitions.droppable(session, clock.now(), clock.now()) == []
    finally:
        app.extensions["portal.db"].engine.dispose()


def test_one_process_at_a_time_makes_and_drops_partitions(app, clock, catalogue_ready):
    """Every process runs table-retention: while one holds the partitions' step, another
    passes it by (no problem, nothing made, nothing counted twice), then does it."""
    now = clock.now()
    sent = now - 14 * MONTH
    month = Month.of(sent)
    _make(app, month)
    old = _build(app, sent, ab=False)
    before = _figures(app, old, now)
    if Month.of(now) in _months(app):  # made by an earlier test's run of the job
        with db.begin(app) as session:
            session.execute(sa.text(f"DROP TABLE {Month.of(now).name}"))
    engine = app.extensions["portal.db"].engine
    with held_transaction_lock(engine, partitions.MAINTENANCE_LOCK, wait=False) as held:
        assert held
        report = run_job(app, "table-retention")
        assert not report.problems
        assert month in _months(app)
        assert _rows(app, Delivery, old) == 20  # nor folded row by row meanwhile
        assert Month.of(now) not in _months(app)  # the coming months not made either
    report = run_job(app, "table-retention")
    assert not report.problems
    assert month not in _months(app)
    assert Month.of(now) in _months(app)
    assert _figures(app, old, now) == before
    # Told to make or drop a month another process made or dropped: nothing happens.
    with db.begin(app) as session:
        assert partitions.drop(session, month, lock_timeout_ms=300) == 0
        assert partitions.create(session, Month.of(now), lock_timeout_ms=300) == 0
    assert Month.of(now) in _months(app)
