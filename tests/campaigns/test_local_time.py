"""Local-time delivery (portal/campaigns/local_time.py): "at 09:00 in each person's time
zone", with a fallback zone; through the rule, the engine, the form and the command line."""

from __future__ import annotations

import datetime as dt
import html as htmllib
import re
import zoneinfo

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from portal.campaigns import local_time
from portal.campaigns import services as campaigns
from portal.campaigns.local_time import due_by_zone, latest_due, local_due, parse_local_time
from portal.campaigns.models import Campaign
from portal.campaigns.services import CampaignDraft
from portal.db import db
from portal.delivery.models import Delivery
from portal.errors import ValidationError
from tests.campaigns.conftest import form_data
from tests.campaigns.test_cli import run
from tests.campaigns.test_form import field_error

UTC = dt.UTC
NINE = dt.time(9, 0)


def at(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


# -- the rule -----------------------------------------------------------------------------


def test_each_zone_gets_the_first_such_time_at_or_after_the_start():
    start = at(2026, 12, 3, 10, 0)  # 19:00 in Tokyo, 05:00 in New York, 10:00 in London
    assert local_due(start, NINE, "America/New_York") == at(2026, 12, 3, 14, 0)  # today
    assert local_due(start, NINE, "Asia/Tokyo") == at(2026, 12, 4, 0, 0)  # passed: tomorrow
    assert local_due(start, NINE, "Europe/London") == at(2026, 12, 4, 9, 0)  # passed an hour ago
    assert local_due(start, NINE, "Atlantic/Azores") == start  # 09:00 there right now: now
    assert local_due(start, NINE, "Asia/Kolkata") == at(2026, 12, 4, 3, 30)  # half-hour zone
    assert local_due(start, NINE, "Etc/GMT+5") == at(2026, 12, 3, 14, 0)  # a fixed offset


def test_summer_time_in_the_north_new_york():
    # The US moves its clocks forward on 14 March 2027 at 02:00 (UTC-5 → UTC-4).
    assert local_due(at(2027, 3, 13, 12), NINE, "America/New_York") == at(2027, 3, 13, 14)
    assert local_due(at(2027, 3, 14, 0), NINE, "America/New_York") == at(2027, 3, 14, 13)
    # 02:30 does not exist that night: it goes as long after the jump (03:30 EDT).
    assert local_due(at(2027, 3, 14, 0), dt.time(2, 30), "America/New_York") == at(
        2027, 3, 14, 7, 30
    )
    # 7 November 2027, 01:30 happens twice (EDT, then EST): the first one.
    assert local_due(at(2027, 11, 7, 0), dt.time(1, 30), "America/New_York") == at(
        2027, 11, 7, 5, 30
    )


def test_summer_time_in_the_south_sydney():
    # Sydney: summer time ends on 4 April 2027 (03:00 AEDT → 02:00 AEST, UTC+11 → +10)
    # and starts on 3 October 2027 (02:00 AEST → 03:00 AEDT).
    assert local_due(at(2027, 4, 2, 12), NINE, "Australia/Sydney") == at(2027, 4, 2, 22)  # +11
    assert local_due(at(2027, 4, 3, 12), NINE, "Australia/Sydney") == at(2027, 4, 3, 23)  # +10
    assert local_due(at(2027, 10, 1, 12), NINE, "Australia/Sydney") == at(2027, 10, 1, 23)
    assert local_due(at(2027, 10, 2, 12), NINE, "Australia/Sydney") == at(2027, 10, 2, 22)
    # 02:30 on 4 April happens twice: the first (+11), not the second (+10).
    assert local_due(at(2027, 4, 3, 12), dt.time(2, 30), "Australia/Sydney") == at(
        2027, 4, 3, 15, 30
    )
    # 02:30 on 3 October does not exist: 03:30 AEDT.
    assert local_due(at(2027, 10, 2, 12), dt.time(2, 30), "Australia/Sydney") == at(
        2027, 10, 2, 16, 30
    )


_ZONES = [
    "America/New_York",
    "Australia/Sydney",
    "Australia/Lord_Howe",  # a half-hour change
    "Europe/London",
    "America/Santiago",  # changes at midnight
    "Asia/Tokyo",
    "Pacific/Kiritimati",
    "Pacific/Pago_Pago",
    "Asia/Kathmandu",
    "UTC",
    "Etc/GMT+12",
]


@given(
    start=st.datetimes(
        min_value=dt.datetime(2000, 1, 1),
        max_value=dt.datetime(2037, 12, 31),
        timezones=st.just(UTC),
    ),
    minutes=st.integers(0, 24 * 60 - 1),
    zone=st.sampled_from(_ZONES),
)
def test_the_due_time_is_the_first_one_after_the_start(start, minutes, zone):
    chosen = dt.time(minutes // 60, minutes % 60)
    due = local_due(start, chosen, zone)
    assert due is not None
    assert start <= due < start + dt.timedelta(hours=26)
    tz = zoneinfo.ZoneInfo(zone)
    shown = due.astimezone(tz)
    if shown.time() != chosen:
        # Only a time the clocks skipped: it goes as long after the jump as it was after
        # the gap's start, so an hour (Lord Howe: half an hour) later on the wall.
        wall = dt.datetime.combine(shown.date(), chosen)
        assert dt.timedelta(0) < shown.replace(tzinfo=None) - wall <= dt.timedelta(hours=1)
    # And none earlier: the day before's occurrence was before the start.
    before = dt.datetime.combine(shown.date() - dt.timedelta(days=1), chosen, tzinfo=tz)
    assert before.astimezone(UTC) < start


def test_an_unknown_zone_takes_the_fallback_and_an_unknown_fallback_is_an_error():
    start = at(2026, 12, 3, 10)
    due = due_by_zone(start, NINE, [None, "Mars/Olympus", "Asia/Tokyo"], "Europe/London")
    assert due == {
        None: at(2026, 12, 4, 9),
        "Mars/Olympus": at(2026, 12, 4, 9),
        "Asia/Tokyo": at(2026, 12, 4, 0),
    }
    assert local_due(start, NINE, "Mars/Olympus") is None
    with pytest.raises(ValueError, match="unknown fallback zone"):
        due_by_zone(start, NINE, [None], "Mars/Olympus")


def test_the_latest_due_time_is_the_last_zone_to_reach_it():
    start = at(2026, 12, 3, 10)
    last = latest_due(start, NINE)
    assert last == at(2026, 12, 4, 9)  # UTC+0 saw 09:00 an hour before the start
    for zone in ("America/New_York", "Asia/Tokyo", "Pacific/Kiritimati", "Etc/GMT+12"):
        assert local_due(start, NINE, zone) <= last


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("09:00", NINE), ("23:59", dt.time(23, 59)), (" 00:00 ", dt.time(0, 0))],
)
def test_a_time_of_day_is_24_hour_hh_mm(text, parsed):
    assert parse_local_time(text) == parsed


@pytest.mark.parametrize("text", ["9:00", "24:00", "09:60", "9am", "09:00:00", "", "０９:００"])
def test_anything_else_is_not_a_time_of_day(text):
    assert parse_local_time(text) is None


def test_the_review_page_counts_deliveries_per_hour():
    start = at(2026, 12, 3, 10)
    audience = {"Asia/Tokyo": 3, "America/New_York": 2, "America/Toronto": 1, None: 4}
    assert local_time.per_hour(start, NINE, audience, "Europe/London") == [
        (at(2026, 12, 3, 14), 3),  # New York and Toronto
        (at(2026, 12, 4, 0), 3),
        (at(2026, 12, 4, 9), 4),  # no zone: London's 09:00
    ]


# -- the rules a campaign obeys ----------------------------------------------------------


def _draft(**fields) -> CampaignDraft:
    return CampaignDraft(
        **{"topic": "weekly-digest", "title": "Morning", "body": "Good morning", **fields}
    )


def _problems(app, clock, **fields) -> list[ValidationError]:
    with db.begin(app) as session:
        return campaigns.validate_draft(session, _draft(**fields), now=clock.now())


def test_the_fallback_zone_follows_the_zone_rule(catalogue_ready, clock):
    (problem,) = _problems(catalogue_ready, clock, local_time=NINE, fallback_zone="US/Eastern")
    assert (problem.field, problem.code) == ("fallback_zone", "zone_alias")
    assert "America/New_York" in problem.message
    # Without one, the campaign's own zone is the fallback.
    assert _problems(catalogue_ready, clock, local_time=NINE, time_zone="Europe/Paris") == []
    assert _draft(local_time=NINE, time_zone="Europe/Paris").fallback == "Europe/Paris"
    assert _draft(time_zone="Europe/Paris").fallback is None


def test_dont_deliver_after_must_leave_every_zone_its_hour(catalogue_ready, clock):
    start = clock.now()  # 1 January 2026, 00:00 UTC
    (problem,) = _problems(
        catalogue_ready, clock, local_time=NINE, deliver_until=start + dt.timedelta(hours=12)
    )
    assert (problem.field, problem.code) == ("deliver_until", "before_local_time")
    assert "the last time zones reach 09:00 then" in problem.message
    last = latest_due(start, NINE)
    assert _problems(catalogue_ready, clock, local_time=NINE, deliver_until=last) == []


# -- through the engine -------------------------------------------------------------------


def _person(app, fake_push, zone: str | None):
    sub = fake_push.subscribe()
    body = {"subscription": sub.to_json(), "topics": ["weekly-digest"], "policyVersion": "v1"}
    if zone is not None:
        body["timeZone"] = zone
    response = app.test_client().post("/api/push/subscribe", json=body)
    assert response.status_code == 201, response.json
    return sub


def _launch(app, clock, **fields) -> Campaign:
    with db.begin(app) as session:
        campaign = campaigns.create_campaign(
            session, _draft(**fields), created_by="test", now=clock.now()
        )
        session.expunge(campaign)
        return campaign


def _due(app, campaign_id):
    with db.begin(app) as session:
        return sorted(
            (row.next_attempt_at, row.status)
            for row in session.execute(
                sa.select(Delivery.next_attempt_at, Delivery.status).where(
                    Delivery.campaign_id == campaign_id
                )
            )
        )


def test_each_person_gets_it_at_nine_where_they_are(push_app, dispatcher, fake_push, clock):
    # 1 January 2026, 00:00 UTC: 09:00 in Tokyo now, London at 09:00 UTC, New York 14:00.
    tokyo = _person(push_app, fake_push, "Asia/Tokyo")
    new_york = _person(push_app, fake_push, "America/New_York")
    nowhere = _person(push_app, fake_push, None)
    lost = _person(push_app, fake_push, "Europe/Paris")
    with db.begin(push_app) as session:  # a zone a later database no longer knows
        session.execute(
            sa.text("UPDATE subscriber SET time_zone = 'Mars/Olympus' WHERE time_zone = :z"),
            {"z": "Europe/Paris"},
        )
    campaign = _launch(push_app, clock, local_time=NINE, fallback_zone="Europe/London")
    assert (campaign.local_time, campaign.fallback_zone) == (NINE, "Europe/London")

    dispatcher.tick()
    assert _due(push_app, campaign.id) == [
        (at(2026, 1, 1, 0), "accepted"),
        (at(2026, 1, 1, 9), "queued"),
        (at(2026, 1, 1, 9), "queued"),
        (at(2026, 1, 1, 14), "queued"),
    ]
    assert [len(fake_push.received(s)) for s in (tokyo, new_york, nowhere, lost)] == [1, 0, 0, 0]

    clock.advance(hours=8, minutes=59)
    dispatcher.tick()
    assert [len(fake_push.received(s)) for s in (tokyo, new_york, nowhere, lost)] == [1, 0, 0, 0]
    clock.advance(minutes=1)
    dispatcher.tick()
    assert [len(fake_push.received(s)) for s in (tokyo, new_york, nowhere, lost)] == [1, 0, 1, 1]
    clock.advance(hours=5)
    dispatcher.tick()
    dispatcher.tick()
    assert [len(fake_push.received(s)) for s in (tokyo, new_york, nowhere, lost)] == [1, 1, 1, 1]
    with db.begin(push_app) as session:
        assert session.get(Campaign, campaign.id).status == "completed"


def test_a_campaign_without_a_local_time_sends_everyone_at_once(
    push_app, dispatcher, fake_push, clock
):
    subs = [_person(push_app, fake_push, zone) for zone in ("Asia/Tokyo", None)]
    campaign = _launch(push_app, clock)
    dispatcher.tick()
    assert _due(push_app, campaign.id) == [(clock.now(), "accepted")] * 2
    assert [len(fake_push.received(s)) for s in subs] == [1, 1]


def _page(person, campaign_id) -> str:
    return htmllib.unescape(
        re.sub(r"<[^>]+>", "", person.get(f"/staff/campaigns/{campaign_id}").text)
    )


def test_the_campaign_page_says_who_waits_for_their_hour(
    push_app, dispatcher, fake_push, clock, sign_in
):
    for zone in ("Asia/Tokyo", "America/New_York", "America/Chicago"):
        _person(push_app, fake_push, zone)
    campaign = _launch(push_app, clock, local_time=NINE, fallback_zone="Europe/London")
    dispatcher.tick()
    page = _page(sign_in(push_app), campaign.id)
    assert (
        "At 09:00 in each person's time zone (Europe/London for people whose zone is not known)"
        in page
    )
    assert (
        "2 deliveries waiting for 09:00 in the person's time zone; the next due Thu 1 Jan 2026, "
        "14:00 UTC." in page
    )
    assert "waiting for their first attempt" not in page
    assert "Retrying" not in page


# -- the form and the command line ----------------------------------------------------------


def test_the_form_launches_a_local_time_campaign_after_showing_the_hours(
    push_app, sign_in, fake_push, clock, monkeypatch
):
    from portal.campaigns import views

    for zone in ("Asia/Tokyo", "America/New_York", "America/Toronto", None):
        _person(push_app, fake_push, zone)
    campaigner = sign_in(push_app)
    fields = form_data(local_time="09:00", fallback_zone="Europe/London", timezone="Europe/Paris")
    counted = views.audience_counts
    readings: list[int] = []

    def counting(session, topic_id):
        readings.append(topic_id)
        return counted(session, topic_id)

    monkeypatch.setattr(views, "audience_counts", counting)
    review = campaigner.post("/staff/campaigns/new", {**fields, "action": "review"})
    assert review.status_code == 200
    assert len(readings) == 1  # the total and the hours from one reading of everyone
    text = htmllib.unescape(re.sub(r"<[^>]+>", "", review.text))
    assert "Deliveries per hour" in text
    hours = re.findall(
        r'<tr><th scope="row"><time datetime="([^"]+)">[^<]+</time></th>'
        r'<td class="numeric">([\d,]+)</td></tr>',
        review.text,
    )
    assert hours == [
        ("2026-01-01T00:00:00Z", "1"),  # Tokyo, now
        ("2026-01-01T09:00:00Z", "1"),  # no zone: London
        ("2026-01-01T14:00:00Z", "2"),  # New York and Toronto
    ]
    assert "1 of them has no known time zone" in text
    assert "At 09:00 in each person's time zone (Europe/London for people" in text
    # The fields go on to Launch, hidden.
    assert '<input type="hidden" name="local_time" value="09:00">' in review.text
    assert '<input type="hidden" name="fallback_zone" value="Europe/London">' in review.text

    launched = campaigner.post("/staff/campaigns/new", {**fields, "action": "launch"})
    assert launched.status_code == 303
    with db.begin(push_app) as session:
        (campaign,) = session.scalars(sa.select(Campaign)).all()
        assert (campaign.local_time, campaign.fallback_zone) == (NINE, "Europe/London")


def test_the_form_takes_its_own_zone_as_the_fallback(campaigner, catalogue_ready):
    fields = form_data(local_time="07:30", timezone="Asia/Tokyo")
    assert (
        campaigner.post("/staff/campaigns/new", {**fields, "action": "launch"}).status_code == 303
    )
    with db.begin(catalogue_ready) as session:
        (campaign,) = session.scalars(sa.select(Campaign)).all()
        assert (campaign.local_time, campaign.fallback_zone) == (dt.time(7, 30), "Asia/Tokyo")


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"local_time": "9am"}, "local_time", "Enter the time as hours and minutes, like 09:00"),
        ({"local_time": "25:00"}, "local_time", "Enter the time as hours and minutes, like 09:00"),
        (
            {"local_time": "09:00", "fallback_zone": "Mars/Olympus"},
            "fallback_zone",
            "There is no time zone Mars/Olympus",
        ),
        (
            {"local_time": "09:00", "deliver_until": "2026-01-01T12:00"},
            "deliver_until",
            "“Don't deliver after” must be Thu 1 Jan 2026, 23:30 UTC or later",  # Darwin, UTC+9:30,
        ),
    ],
)
def test_the_form_refuses_a_bad_local_time_and_changes_nothing(
    campaigner, catalogue_ready, fields, field, message
):
    for action in ("review", "launch"):
        response = campaigner.post(
            "/staff/campaigns/new", {**form_data(**fields), "action": action}
        )
        assert response.status_code == 422
        assert field_error(response.text, field).startswith(message)
    with db.begin(catalogue_ready) as session:
        assert session.scalars(sa.select(Campaign)).all() == []


def test_a_clone_keeps_the_local_time(push_app, clock, sign_in):
    campaign = _launch(push_app, clock, local_time=NINE, fallback_zone="Europe/London")
    person = sign_in(push_app)
    cloned = person.post(f"/staff/campaigns/{campaign.id}/clone", {})
    assert cloned.status_code == 303
    page = person.get(cloned.headers["Location"]).text
    assert 'name="local_time" type="time" value="09:00"' in page or 'value="09:00"' in page
    assert 'value="Europe/London"' in page


def test_the_command_line_takes_local_time_and_fallback_zone(catalogue_ready, clock):
    result = run(
        catalogue_ready,
        "create",
        "--topic=weekly-digest",
        "--title=Morning",
        "--body=Good morning",
        "--local-time=09:00",
        "--fallback-zone=America/Sao_Paulo",
    )
    assert result.exit_code == 0, result.output
    assert "sends at 09:00 in each person's time zone (America/Sao_Paulo for people" in (
        result.stderr
    )
    with db.begin(catalogue_ready) as session:
        (campaign,) = session.scalars(sa.select(Campaign)).all()
        assert (campaign.local_time, campaign.fallback_zone) == (NINE, "America/Sao_Paulo")
    # Without --fallback-zone: --zone, or UTC.
    result = run(
        catalogue_ready,
        "create",
        "--topic=weekly-digest",
        "--title=T",
        "--body=B",
        "--local-time=18:15",
        "--zone=Asia/Tokyo",
    )
    assert result.exit_code == 0, result.output
    result = run(
        catalogue_ready,
        "create",
        "--topic=weekly-digest",
        "--title=T",
        "--body=B",
        "--local-time=18:15",
    )
    assert result.exit_code == 0, result.output
    with db.begin(catalogue_ready) as session:
        assert [
            (c.local_time, c.fallback_zone)
            for c in session.scalars(sa.select(Campaign).order_by(Campaign.created_at, Campaign.id))
        ][1:] == [(dt.time(18, 15), "Asia/Tokyo"), (dt.time(18, 15), "UTC")]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--local-time=9am"], "error: local-time: the time as HH:MM, like 09:00"),
        (
            ["--fallback-zone=Europe/London"],
            "error: fallback-zone: The time zone for people "
            "whose zone is not known is only used with a local time: give a local time, or leave "
            "it out",
        ),
        (
            ["--local-time=09:00", "--fallback-zone=US/Eastern"],
            "error: fallback-zone: US/Eastern is an alias: choose America/New_York",
        ),
    ],
)
def test_the_command_line_refuses_what_the_form_refuses(catalogue_ready, args, error):
    result = run(catalogue_ready, "create", "--topic=weekly-digest", "--title=T", "--body=B", *args)
    assert result.exit_code == 1
    assert error in result.stderr
    with db.begin(catalogue_ready) as session:
        assert session.scalars(sa.select(Campaign)).all() == []


@pytest.mark.parametrize("zone", ["Europe/London", "Mars/Olympus"])
@pytest.mark.parametrize("action", ["review", "launch"])
def test_the_form_refuses_a_fallback_zone_without_a_local_time(campaigner, engine, zone, action):
    """The command line's rule, now the form's too (one rule, in validate_draft): what was
    typed is named, not silently dropped."""
    from tests.helpers import Unchanged

    unchanged = Unchanged(engine)
    response = campaigner.post(
        "/staff/campaigns/new", {**form_data(fallback_zone=zone), "action": action}
    )
    assert response.status_code == 422
    assert field_error(response.text, "fallback_zone") == (
        "The time zone for people whose zone is not known is only used with a local time: "
        "give a local time, or leave it out"
    )
    assert unchanged.changed() == []


# -- across a clock change, through the engine -----------------------------------------------


@pytest.mark.parametrize(
    ("start", "zone", "due"),
    [
        # Sydney's summer time ends at 03:00 on Sunday 4 April 2027 (UTC+11 → UTC+10):
        # launched on the Saturday at 12:00 UTC (23:00 there), 09:00 Sunday is 23:00 UTC.
        (at(2027, 4, 3, 12), "Australia/Sydney", at(2027, 4, 3, 23)),
        # New York's begins at 02:00 on Sunday 14 March 2027 (UTC-5 → UTC-4): launched at
        # 03:00 UTC (22:00 Saturday there), 09:00 Sunday is 13:00 UTC, not 14:00.
        (at(2027, 3, 14, 3), "America/New_York", at(2027, 3, 14, 13)),
    ],
    ids=["sydney-autumn", "new-york-spring"],
)
def test_nine_oclock_is_found_across_the_clock_change_and_sent_then(
    push_app, dispatcher, fake_push, clock, start, zone, due
):
    clock.advance(start - clock.now())
    sub = _person(push_app, fake_push, zone)
    campaign = _launch(push_app, clock, local_time=NINE, fallback_zone="UTC")
    dispatcher.tick()
    assert _due(push_app, campaign.id) == [(due, "queued")]
    clock.advance(due - clock.now() - dt.timedelta(seconds=1))
    dispatcher.tick()
    assert fake_push.received(sub) == []
    clock.advance(dt.timedelta(seconds=1))
    dispatcher.tick()
    assert len(fake_push.received(sub)) == 1
    assert _due(push_app, campaign.id) == [(due, "accepted")]
