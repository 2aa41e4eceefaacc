"""A campaign's delivery funnel (portal.campaigns.funnel): accepted → shown → clicked.

The counts are of deliveries, each stage within the one before it; the rates never divide
by zero; the periods of the chart fit the campaign's duration. Run on SQLite and on
PostgreSQL (PORTAL_TEST_DATABASE), as every database test is.
"""

from __future__ import annotations

import datetime as dt
import itertools

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from portal.campaigns import funnel
from portal.campaigns.funnel import BUCKET_WIDTHS, MAX_BUCKETS, Rate, choose_width, rate
from portal.db import db
from portal.delivery.models import DeliveryReceipt, ReceiptEvent
from portal.delivery.receipts import Receipt, record
from tests.factories import FunnelFactory

S = dt.timedelta(seconds=1)
M = dt.timedelta(minutes=1)


@pytest.fixture
def make(catalogue_ready, clock):
    """A campaign sent at the clock's time (2026-01-01 00:00 UTC), in an open session;
    ``read()`` gives its funnel."""
    with db.begin(catalogue_ready) as session:
        factory = FunnelFactory(session, sent_at=clock.now())

        def read() -> funnel.Funnel:
            session.flush()
            return funnel.read(session, factory.campaign, now=clock.now() + dt.timedelta(days=1))

        factory.read = read  # type: ignore[attr-defined]
        yield factory


# -- counts -------------------------------------------------------------------------------


def test_a_campaign_without_deliveries_has_no_receipts_no_rates_and_no_chart(make):
    got = make.read()
    assert (got.accepted, got.shown, got.clicked, got.unaccepted) == (0, 0, 0, 0)
    assert not got.receipts
    assert got.shown_of_accepted is None
    assert got.clicked_of_shown is None
    assert got.clicked_of_accepted is None
    assert (got.width, got.buckets) == (None, [])


def test_accepted_without_receipts_has_a_rate_of_accepted_but_none_of_shown(make):
    make.many(3)
    got = make.read()
    assert (got.accepted, got.shown, got.clicked) == (3, 0, 0)
    assert not got.receipts
    assert got.clicked_of_shown is None  # nothing shown: no click-through rate of shown
    assert got.clicked_of_accepted == Rate(0, 3)
    assert str(got.clicked_of_accepted) == "0.0%"
    assert got.buckets[-1].accepted_by == 3


def test_each_stage_counts_deliveries_and_the_rates_use_the_stage_before(make):
    make.many(4)  # accepted, nothing reported
    make.many(4, shown=2 * S)  # shown, not clicked
    make.many(2, shown=2 * S, clicked=5 * S)  # shown and clicked
    make.many(3, "failed")
    make.many(1, "revoked")
    make.many(2, "skipped")
    make.many(1, "queued")
    got = make.read()
    assert (got.accepted, got.shown, got.clicked) == (10, 6, 2)
    assert str(got.shown_of_accepted) == "60.0%"
    assert str(got.clicked_of_shown) == "33.3%"
    assert str(got.clicked_of_accepted) == "20.0%"
    assert (got.clicked_unreported, got.unaccepted) == (0, 0)


def test_a_click_without_a_shown_receipt_counts_as_shown_once(make):
    make.delivery(clicked=30 * S)  # the worker was offline when it showed it
    make.delivery(shown=3 * S, clicked=30 * S)
    got = make.read()
    assert (got.accepted, got.shown, got.clicked, got.clicked_unreported) == (2, 2, 2, 1)
    assert got.clicked_of_shown == Rate(2, 2)
    # It was shown no later than it was clicked.
    (only,) = got.buckets
    assert (only.shown_by, only.clicked_by) == (2, 2)


def test_a_repeated_report_is_one_receipt_and_counts_once(make, clock):
    delivery_id = make.delivery()
    session = make.session
    for event in (ReceiptEvent.SHOWN, ReceiptEvent.SHOWN, ReceiptEvent.CLICKED):
        record(session, Receipt(delivery_id, event, None), now=clock.now() + 10 * S)
    assert record(session, Receipt(delivery_id, ReceiptEvent.CLICKED, None), now=clock.now()) is (
        False
    )
    rows = session.scalar(sa.select(sa.func.count()).select_from(DeliveryReceipt))
    assert rows == 2
    got = make.read()
    assert (got.accepted, got.shown, got.clicked) == (1, 1, 1)


def test_receipts_of_deliveries_not_recorded_as_accepted_are_counted_apart(make):
    make.delivery("failed", shown=2 * S)  # the 201 was lost; the browser had it
    make.delivery("sending", shown=1 * S, clicked=4 * S)  # the answer is not written yet
    make.delivery("skipped")
    make.delivery(shown=2 * S)
    got = make.read()
    assert (got.accepted, got.shown, got.clicked, got.unaccepted) == (1, 1, 0, 2)
    assert got.receipts


def test_only_this_campaigns_deliveries_count(make, clock):
    make.delivery(shown=2 * S, clicked=3 * S)
    other = FunnelFactory(make.session, sent_at=clock.now())
    other.many(5, shown=2 * S, clicked=3 * S)
    got = make.read()
    assert (got.accepted, got.shown, got.clicked) == (1, 1, 1)


def test_rate_refuses_a_zero_denominator():
    assert rate(0, 0) is None
    assert rate(5, 0) is None
    assert rate(1, 3) == Rate(1, 3)
    assert str(Rate(1, 3)) == "33.3%"
    assert str(Rate(2, 3)) == "66.7%"
    assert str(Rate(3, 3)) == "100.0%"


# -- periods ------------------------------------------------------------------------------


def test_a_short_campaign_is_counted_by_the_minute_with_running_totals(make, clock):
    make.delivery(after=10 * S, shown=12 * S)
    make.delivery(after=20 * S, shown=70 * S, clicked=190 * S)
    make.delivery(after=65 * S)
    got = make.read()
    assert got.width == 60
    start = clock.now()
    assert [b.start for b in got.buckets] == [start + i * M for i in range(4)]
    assert [b.end for b in got.buckets] == [start + (i + 1) * M for i in range(4)]
    assert [(b.accepted, b.shown, b.clicked) for b in got.buckets] == [
        (2, 1, 0),
        (1, 1, 0),
        (0, 0, 0),
        (0, 0, 1),
    ]
    assert [(b.accepted_by, b.shown_by, b.clicked_by) for b in got.buckets] == [
        (2, 1, 0),
        (3, 2, 0),
        (3, 2, 0),
        (3, 2, 1),
    ]


def test_an_event_on_a_boundary_is_in_the_period_it_starts(make, clock):
    make.delivery(after=0 * S)
    make.delivery(after=60 * S)  # 00:01:00 exactly: the second minute
    got = make.read()
    assert [(b.start - clock.now(), b.accepted) for b in got.buckets] == [(0 * M, 1), (M, 1)]


def test_a_campaign_over_days_is_counted_in_longer_periods_from_midnight(make, clock):
    make.delivery(after=dt.timedelta(hours=5), shown=dt.timedelta(hours=6))
    make.delivery(after=dt.timedelta(hours=5), clicked=dt.timedelta(days=3, hours=20))
    got = make.read()
    # 05:00 to 20:00 three days later: 30 periods of 3 hours, too many; 16 of 6 hours.
    assert got.width == 6 * 3600
    assert got.buckets[0].start == clock.now()  # midnight UTC, not the first event's hour
    assert len(got.buckets) == 16
    last = got.buckets[-1]
    assert (last.accepted_by, last.shown_by, last.clicked_by) == (2, 2, 1)
    assert sum(b.shown for b in got.buckets) == 2


def test_a_receipt_before_the_recorded_answer_moves_the_acceptance_earlier(make):
    # The browser reported it 10 s after the send; the 201 was written 3 minutes later.
    make.delivery(after=3 * M, shown=10 * S)
    got = make.read()
    first = got.buckets[0]
    assert (first.accepted, first.shown) == (1, 1)
    for bucket in got.buckets:
        assert bucket.accepted_by >= bucket.shown_by >= bucket.clicked_by


def test_the_widths_are_the_shortest_that_fit():
    day0 = int(dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp())
    cases = {
        10 * 60: 60,
        30 * 60: 2 * 60,
        2 * 3600: 10 * 60,
        20 * 3600: 3600,
        3 * 86400: 6 * 3600,
        20 * 86400: 86400,
        60 * 86400: 7 * 86400,
        400 * 86400: 3 * 7 * 86400,
    }
    for span, width in cases.items():
        assert choose_width(day0, day0 + span)[0] == width, span


@given(
    first=st.integers(min_value=1_700_000_000, max_value=1_900_000_000),
    span=st.integers(min_value=0, max_value=3 * 365 * 86400),
)
def test_every_chosen_width_fits_and_none_shorter_would(first, span):
    last = first + span
    width, start = choose_width(first, last)
    periods = (last - start) // width + 1
    assert start <= first < start + width
    assert periods <= MAX_BUCKETS
    assert (start - funnel._ORIGIN_SECONDS) % width == 0  # whole periods from a Monday
    shorter = [w for w in BUCKET_WIDTHS if w < width]
    for w in shorter:
        s = funnel._ORIGIN_SECONDS + (first - funnel._ORIGIN_SECONDS) // w * w
        assert (last - s) // w + 1 > MAX_BUCKETS


def test_running_totals_never_fall_and_end_at_the_counts(make):
    for i, (shown, clicked) in enumerate(itertools.product((None, 40 * S), (None, 90 * S))):
        make.delivery(after=(i + 1) * S, shown=shown, clicked=clicked)
    got = make.read()
    ends = got.buckets[-1]
    assert (ends.accepted_by, ends.shown_by, ends.clicked_by) == (
        got.accepted,
        got.shown,
        got.clicked,
    )
    for a, b in itertools.pairwise(got.buckets):
        assert a.accepted_by <= b.accepted_by and a.shown_by <= b.shown_by


# -- where it was clicked -------------------------------------------------------------------


def test_a_click_on_a_button_is_a_click_and_is_counted_by_its_button(make):
    """The service worker reports a button's click as ``action-1`` or ``action-2``, not
    ``clicked``: the funnel counts it as clicked (and shown), under its own button."""
    make.delivery(shown=2 * S, button_1=9 * S)
    make.delivery(button_2=30 * S)  # no shown receipt: the click says it was on screen
    make.delivery(shown=2 * S, clicked=5 * S)
    make.delivery(shown=2 * S)
    got = make.read()
    assert (got.accepted, got.shown, got.clicked) == (4, 4, 3)
    assert (got.clicked_body, got.clicked_buttons) == (1, (1, 1))
    assert got.clicked_unreported == 1
    assert got.clicked_again == 0
    assert got.of_accepted(got.clicked_buttons[0]) == Rate(1, 4)
    (only,) = got.buckets
    assert (only.shown_by, only.clicked_by) == (4, 3)


def test_a_delivery_clicked_in_two_places_counts_once_and_under_each(make, clock):
    make.delivery(shown=2 * S, clicked=4 * S, button_1=3 * 60 * S)
    got = make.read()
    assert got.clicked == 1
    assert (got.clicked_body, got.clicked_buttons, got.clicked_again) == (1, (1, 0), 1)
    # Clicked from its first click (the notification, at 4 s), not the later button.
    assert got.buckets[0].clicked == 1


def test_button_clicks_of_deliveries_not_accepted_are_counted_apart(make):
    make.delivery("queued", button_1=5 * S)
    got = make.read()
    assert (got.accepted, got.clicked, got.clicked_buttons, got.unaccepted) == (0, 0, (0, 0), 1)


@pytest.mark.postgres_only
def test_the_funnel_is_read_without_jit_compilation(make):
    """Compiling the funnel's statements cost PostgreSQL about 2 s a read (bench/funnel.py);
    the read turns it off for its own transaction only."""
    session = make.session
    make.many(2, shown=2 * S)
    assert session.execute(sa.text("SHOW jit")).scalar_one() == "on"
    make.read()
    assert session.execute(sa.text("SHOW jit")).scalar_one() == "off"
