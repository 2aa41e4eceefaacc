"""Quiet hours (portal/delivery/quiet.py): marketing deliveries whose turn comes at night
where the person is wait until morning; transactional ones go. The portal-wide window
(QUIET_HOURS) and the person's own (the preference centre), sent through the engine to
the fake push service on both databases."""

from __future__ import annotations

import datetime as dt
import html as htmllib
import json
import re
import zoneinfo

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from portal.campaigns import services as campaigns
from portal.campaigns.models import Campaign
from portal.campaigns.services import CampaignDraft
from portal.config import ConfigError, QuietHoursSettings, Settings
from portal.consent.models import ConsentEvent
from portal.db import db
from portal.delivery import quiet
from portal.delivery.models import Delivery
from portal.delivery.quiet import Window, parse_window, quiet_until
from portal.subscriptions.models import Subscriber
from tests.campaigns.conftest import form_data
from tests.helpers import csrf_token

UTC = dt.UTC
NIGHT = Window(dt.time(21), dt.time(8))


def at(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


# -- the rule -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "window"),
    [
        ("21:00-08:00", NIGHT),
        (" 21:00 – 08:00 ", NIGHT),
        ("12:30-14:00", Window(dt.time(12, 30), dt.time(14))),
    ],
)
def test_a_window_is_two_different_times(text, window):
    assert parse_window(text) == window


@pytest.mark.parametrize("text", ["", "21:00", "21:00-21:00", "9pm-8am", "21:00-24:00", "x-y"])
def test_anything_else_is_no_window(text):
    assert parse_window(text) is None


def test_a_window_across_midnight_holds_the_night_and_not_its_end():
    assert NIGHT.holds(dt.time(21)) and NIGHT.holds(dt.time(23, 59)) and NIGHT.holds(dt.time(7, 59))
    assert not NIGHT.holds(dt.time(8)) and not NIGHT.holds(dt.time(20, 59))
    day = Window(dt.time(12), dt.time(14))
    assert day.holds(dt.time(13)) and not day.holds(dt.time(14)) and not day.holds(dt.time(11))


def test_quiet_hours_end_at_the_persons_morning():
    # 03:00 UTC: 22:00 in New York (until 08:00 there, 13:00 UTC), noon in Tokyo.
    now = at(2026, 1, 1, 3)
    assert quiet_until(now, "America/New_York", [NIGHT]) == at(2026, 1, 1, 13)
    assert quiet_until(now, "Asia/Tokyo", [NIGHT]) is None
    assert quiet_until(now, "Europe/London", [NIGHT]) == at(2026, 1, 1, 8)
    assert quiet_until(now, "Mars/Olympus", [NIGHT]) == at(2026, 1, 1, 8)  # unknown: UTC


def test_windows_that_overlap_or_touch_are_one_quiet_time():
    now = at(2026, 1, 1, 6)  # 06:00 in London
    mine = Window(dt.time(7, 30), dt.time(9, 15))
    assert quiet_until(now, "Europe/London", [NIGHT, mine]) == at(2026, 1, 1, 9, 15)
    touching = Window(dt.time(8), dt.time(10))
    assert quiet_until(now, "Europe/London", [NIGHT, touching]) == at(2026, 1, 1, 10)


def test_quiet_hours_across_clock_changes_north_and_south():
    # New York, 14 March 2027: clocks go forward at 02:00; 08:00 EDT is 12:00 UTC.
    assert quiet_until(at(2027, 3, 14, 3), "America/New_York", [NIGHT]) == at(2027, 3, 14, 12)
    # Sydney, 4 April 2027: clocks go back at 03:00; 08:00 AEST (UTC+10) is 22:00 UTC.
    assert quiet_until(at(2027, 4, 3, 12), "Australia/Sydney", [NIGHT]) == at(2027, 4, 3, 22)
    # Sydney, 3 October 2027: clocks go forward at 02:00; 08:00 AEDT (UTC+11) is 21:00 UTC.
    assert quiet_until(at(2027, 10, 2, 12), "Australia/Sydney", [NIGHT]) == at(2027, 10, 2, 21)


@given(
    now=st.datetimes(
        min_value=dt.datetime(2000, 1, 1), max_value=dt.datetime(2037, 1, 1), timezones=st.just(UTC)
    ),
    start=st.integers(0, 1439),
    end=st.integers(0, 1439),
    zone=st.sampled_from(["UTC", "America/New_York", "Australia/Sydney", "Asia/Kathmandu"]),
)
def test_the_end_of_quiet_hours_is_outside_them_and_nothing_before_it_is(now, start, end, zone):
    window = quiet.window(dt.time(start // 60, start % 60), dt.time(end // 60, end % 60))
    if window is None:
        return
    until = quiet_until(now, zone, [window])
    local = now.astimezone(zoneinfo.ZoneInfo(zone))
    if until is None:
        assert not window.holds(local.time())
        return
    assert window.holds(local.time())
    assert now < until <= now + dt.timedelta(hours=25)
    assert not window.holds(until.astimezone(local.tzinfo).time()) or until == now


# -- the setting --------------------------------------------------------------------------


def test_quiet_hours_are_off_unless_set_and_a_bad_value_stops_the_start(tmp_path):
    assert Settings.from_env({}, str(tmp_path)).quiet_hours.window is None
    read = Settings.from_env({"QUIET_HOURS": "21:00-08:00"}, str(tmp_path))
    assert read.quiet_hours.window == NIGHT
    with pytest.raises(ConfigError, match="QUIET_HOURS must be two different times"):
        Settings.from_env({"QUIET_HOURS": "21:00-21:00"}, str(tmp_path))


# -- through the engine -------------------------------------------------------------------


@pytest.fixture
def quiet_app(sending_app, clock):
    """``quiet_app(window)``: an app like ``push_app`` with those quiet hours, and its
    dispatcher; the clock at 1 January 2026, 03:00 UTC."""
    clock.advance(hours=3)

    def make(window: Window | None = NIGHT):
        return sending_app(quiet_hours=QuietHoursSettings(window=window))

    return make


def _person(app, fake_push, zone: str | None, topics=("weekly-digest", "security-alerts")):
    client = app.test_client()
    sub = fake_push.subscribe()
    body = {"subscription": sub.to_json(), "topics": list(topics), "policyVersion": "v1"}
    if zone:
        body["timeZone"] = zone
    response = client.post("/api/push/subscribe", json=body)
    assert response.status_code == 201, response.json
    return sub, client


def _launch(app, clock, topic="weekly-digest"):
    with db.begin(app) as session:
        draft = CampaignDraft(topic=topic, title="News", body="Five things")
        return campaigns.create_campaign(session, draft, created_by="test", now=clock.now()).id


def _rows(app, campaign_id):
    with db.begin(app) as session:
        return sorted(
            (row.status, row.reason, row.next_attempt_at, row.attempts)
            for row in session.execute(
                sa.select(
                    Delivery.status, Delivery.reason, Delivery.next_attempt_at, Delivery.attempts
                ).where(Delivery.campaign_id == campaign_id)
            )
        )


def test_marketing_waits_for_morning_where_the_person_is(quiet_app, fake_push, clock, sign_in):
    app, engine = quiet_app()
    new_york, _ = _person(app, fake_push, "America/New_York")  # 22:00 there
    tokyo, _ = _person(app, fake_push, "Asia/Tokyo")  # noon
    nowhere, _ = _person(app, fake_push, None)  # the campaign's zone: UTC, 03:00
    campaign_id = _launch(app, clock)
    report = engine.tick()
    assert report.deferred == 2
    assert _rows(app, campaign_id) == [
        ("accepted", None, at(2026, 1, 1, 3), 1),
        ("queued", "quiet_hours", at(2026, 1, 1, 8), 0),  # waiting is not an attempt
        ("queued", "quiet_hours", at(2026, 1, 1, 13), 0),
    ]
    assert [len(fake_push.received(s)) for s in (new_york, tokyo, nowhere)] == [0, 1, 0]

    page = htmllib.unescape(
        re.sub(r"<[^>]+>", "", sign_in(app).get(f"/staff/campaigns/{campaign_id}").text)
    )
    assert (
        "2 deliveries waiting for quiet hours to end where the person is; the next due "
        "Thu 1 Jan 2026, 08:00 UTC." in page
    )
    assert "Retrying" not in page and "waiting for their first attempt" not in page

    clock.advance(hours=5)  # 08:00 UTC: morning in London's zone (the campaign's, UTC)
    engine.tick()
    assert [len(fake_push.received(s)) for s in (new_york, tokyo, nowhere)] == [0, 1, 1]
    clock.advance(hours=5)  # 13:00 UTC: 08:00 in New York
    engine.tick()
    engine.tick()
    assert [len(fake_push.received(s)) for s in (new_york, tokyo, nowhere)] == [1, 1, 1]
    assert [row[:2] for row in _rows(app, campaign_id)] == [("accepted", None)] * 3
    with db.begin(app) as session:
        assert session.get(Campaign, campaign_id).status == "completed"


def test_transactional_topics_and_tests_go_through_quiet_hours(quiet_app, fake_push, clock):
    app, engine = quiet_app()
    new_york, _ = _person(app, fake_push, "America/New_York")
    campaign_id = _launch(app, clock, topic="security-alerts")
    engine.tick()
    assert [row[:2] for row in _rows(app, campaign_id)] == [("accepted", None)]
    assert len(fake_push.received(new_york)) == 1


def test_without_quiet_hours_nothing_waits(quiet_app, fake_push, clock):
    app, engine = quiet_app(None)
    _person(app, fake_push, "America/New_York")
    campaign_id = _launch(app, clock)
    engine.tick()
    assert [row[:2] for row in _rows(app, campaign_id)] == [("accepted", None)]


def _quiet_events(app):
    with db.begin(app) as session:
        return [
            (row.previous_state, row.new_state, row.source, json.loads(row.context)["screen"])
            for row in session.execute(
                sa.select(ConsentEvent)
                .where(ConsentEvent.kind == "quiet_hours_chosen")
                .order_by(ConsentEvent.seq)
            ).scalars()
        ]


def _windows(app):
    with db.begin(app) as session:
        return [
            (row.quiet_from, row.quiet_until)
            for row in session.execute(sa.select(Subscriber.quiet_from, Subscriber.quiet_until))
        ]


def _save(client, **fields):
    page = client.get("/preferences").text
    return client.post("/preferences/quiet-hours", data={"csrf_token": csrf_token(page), **fields})


def test_a_persons_own_quiet_hours_are_a_consent_event_and_hold_their_marketing(
    quiet_app, fake_push, clock
):
    app, engine = quiet_app(None)  # no portal-wide window: only the person's own
    tokyo, client = _person(app, fake_push, "Asia/Tokyo")  # 12:00 there at 03:00 UTC
    saved = _save(client, action="save", quiet_from="11:00", quiet_until="13:30")
    assert saved.status_code == 303 and saved.headers["Location"].endswith("/preferences")
    page = htmllib.unescape(client.get("/preferences").text)
    assert "Saved: no marketing notifications between 11:00 and 13:30 where you are." in page
    assert "Times are in your time zone, Asia/Tokyo, as your browser told us." in page
    assert 'value="11:00"' in page and 'value="13:30"' in page
    screen = "preference-centre:quiet-hours"
    assert _quiet_events(app) == [("none", "11:00-13:30", "preference-centre", screen)]
    assert _windows(app) == [(dt.time(11), dt.time(13, 30))]
    # The same again: nothing changes, nothing is logged.
    _save(client, action="save", quiet_from="11:00", quiet_until="13:30")
    assert "Nothing needed to change." in client.get("/preferences").text
    assert len(_quiet_events(app)) == 1

    campaign_id = _launch(app, clock)
    engine.tick()
    assert _rows(app, campaign_id) == [("queued", "quiet_hours", at(2026, 1, 1, 4, 30), 0)]
    transactional = _launch(app, clock, topic="security-alerts")
    engine.tick()
    assert [row[:2] for row in _rows(app, transactional)] == [("accepted", None)]
    clock.advance(hours=1, minutes=30)
    engine.tick()
    assert len(fake_push.received(tokyo)) == 2

    removed = _save(client, action="remove")
    assert removed.status_code == 303
    assert "Saved: you have no quiet hours of your own." in client.get("/preferences").text
    assert _quiet_events(app)[1] == ("11:00-13:30", "none", "preference-centre", screen)
    assert _windows(app) == [(None, None)]


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        (
            {"action": "save", "quiet_from": "9pm", "quiet_until": "07:00"},
            "quiet-from",
            "Enter the time quiet hours start, like 22:00",
        ),
        (
            {"action": "save", "quiet_from": "22:00", "quiet_until": ""},
            "quiet-until",
            "Enter the time quiet hours end, like 07:00",
        ),
        (
            {"action": "save", "quiet_from": "22:00", "quiet_until": "22:00"},
            "quiet-until",
            "Enter an end time different from the start time",
        ),
        (
            {"action": "everything", "quiet_from": "22:00", "quiet_until": "07:00"},
            "quiet-from",
            "Choose to save quiet hours or to remove them",
        ),
    ],
)
def test_bad_quiet_hours_are_refused_and_change_nothing(
    quiet_app, fake_push, fields, field, message
):
    app, _ = quiet_app(None)
    _, client = _person(app, fake_push, "Asia/Tokyo")
    answer = _save(client, **fields)
    assert answer.status_code == 400
    page = htmllib.unescape(answer.text)
    assert f'<a href="#{field}">{message}</a>' in page  # the error summary links the field
    assert re.search(rf'id="{field}"[^>]*aria-invalid="true"', page)
    assert _windows(app) == [(None, None)]
    assert _quiet_events(app) == []


def test_quiet_hours_need_the_persons_cookie_and_a_token(quiet_app, fake_push):
    app, _ = quiet_app(None)
    stranger = app.test_client()
    refused = stranger.post(
        "/preferences/quiet-hours",
        data={"action": "save", "quiet_from": "22:00", "quiet_until": "07:00"},
    )
    assert refused.status_code in (400, 403)
    _, client = _person(app, fake_push, "Asia/Tokyo")
    no_token = client.post(
        "/preferences/quiet-hours",
        data={"action": "save", "quiet_from": "22:00", "quiet_until": "07:00"},
    )
    assert no_token.status_code == 400
    assert _windows(app) == [(None, None)]


@pytest.mark.parametrize(
    ("window", "topic", "said"),
    [
        (
            NIGHT,
            "weekly-digest",
            "Quiet hours apply: a delivery whose turn comes between 21:00 and 08:00",
        ),
        (None, "weekly-digest", "No portal-wide quiet hours are set;"),
        (NIGHT, "security-alerts", "A transactional topic: quiet hours never hold it back."),
    ],
)
def test_the_review_page_says_what_quiet_hours_will_do(quiet_app, sign_in, window, topic, said):
    app, _ = quiet_app(window)
    page = sign_in(app).post("/staff/campaigns/new", {**form_data(topic=topic), "action": "review"})
    note = re.search(r'<p class="hint" id="quiet-note">([^<]*)</p>', page.text)
    assert note and htmllib.unescape(note.group(1)).startswith(said), note


def test_erasure_removes_the_persons_quiet_hours(quiet_app, fake_push, clock):
    from portal.retention.services import erase_subscriber

    app, _ = quiet_app(None)
    _, client = _person(app, fake_push, "Asia/Tokyo")
    _save(client, action="save", quiet_from="22:00", quiet_until="07:00")
    with db.begin(app) as session:
        (subscriber_id,) = session.scalars(sa.select(Subscriber.id)).all()
        erase_subscriber(session, subscriber_id, now=clock.now())
    assert _windows(app) == [(None, None)]


@pytest.mark.parametrize(
    ("now", "zone", "until"),
    [
        # 01:00 on Sunday 4 April 2027 in Sydney (UTC+11); at 03:00 the clocks go back, so
        # 08:00 is UTC+10: 22:00 UTC, eleven wall-clock hours but twelve real ones later.
        (at(2027, 4, 3, 14), "Australia/Sydney", at(2027, 4, 3, 22)),
        # 01:00 on Sunday 14 March 2027 in New York (UTC-5); at 02:00 the clocks go
        # forward, so 08:00 is UTC-4: 12:00 UTC, six real hours later.
        (at(2027, 3, 14, 6), "America/New_York", at(2027, 3, 14, 12)),
    ],
    ids=["sydney-autumn", "new-york-spring"],
)
def test_quiet_hours_end_at_eight_across_the_clock_change_through_the_engine(
    quiet_app, fake_push, clock, now, zone, until
):
    app, engine = quiet_app()
    clock.advance(now - clock.now())
    sub, _ = _person(app, fake_push, zone)
    campaign_id = _launch(app, clock)
    engine.tick()
    assert _rows(app, campaign_id) == [("queued", "quiet_hours", until, 0)]
    clock.advance(until - clock.now() - dt.timedelta(seconds=1))
    engine.tick()
    assert fake_push.received(sub) == []
    clock.advance(dt.timedelta(seconds=1))
    engine.tick()
    assert len(fake_push.received(sub)) == 1
