"""Frequency caps (portal/delivery/caps.py): at most so many marketing notifications per
person a rolling day and week, and one a day for whoever chose it; never a transactional
topic or a test send. Sent through the engine to the fake push service."""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import time
import uuid

import pytest
import sqlalchemy as sa

from portal.campaigns import services as campaigns
from portal.campaigns.services import CampaignDraft
from portal.config import FrequencyCapSettings
from portal.consent.models import ConsentEvent
from portal.db import db
from portal.delivery import caps
from portal.delivery.models import Delivery
from portal.subscriptions.models import PushSubscription, Subscriber
from tests.campaigns.conftest import form_data
from tests.helpers import csrf_token

HOUR = dt.timedelta(hours=1)
DAY = dt.timedelta(days=1)


@pytest.fixture
def capped(sending_app):
    """An app like ``push_app`` with caps; ``capped(per_day=…, per_week=…)`` makes it,
    and its dispatcher, in batches of 50."""

    def make(per_day: int = 0, per_week: int = 0):
        caps = FrequencyCapSettings(per_day=per_day, per_week=per_week)
        return sending_app(frequency_caps=caps)

    return make


def _person(app, fake_push, *, devices: int = 1, topics=("weekly-digest", "offers")):
    """One person (one browser's subscriber cookie) with ``devices`` subscriptions, opted
    in to ``topics``; returns the fake push subscriptions."""
    client = app.test_client()
    subs = []
    for _ in range(devices):
        sub = fake_push.subscribe()
        response = client.post(
            "/api/push/subscribe",
            json={"subscription": sub.to_json(), "topics": list(topics), "policyVersion": "v1"},
        )
        assert response.status_code == 201, response.json
        subs.append(sub)
    return subs


def _launch(app, clock, topic="weekly-digest", title="Monday digest"):
    with db.begin(app) as session:
        draft = CampaignDraft(topic=topic, title=title, body="Five things", url="/news")
        return campaigns.create_campaign(session, draft, created_by="test", now=clock.now()).id


def _outcomes(app, campaign_id):
    """(status, reason) of each delivery of the campaign, in id order."""
    with db.begin(app) as session:
        return [
            (row.status, row.reason)
            for row in session.execute(
                sa.select(Delivery.status, Delivery.reason)
                .where(Delivery.campaign_id == campaign_id)
                .order_by(Delivery.id)
            )
        ]


def _send(app, engine, clock, topic="weekly-digest"):
    campaign_id = _launch(app, clock, topic=topic)
    engine.tick()
    return _outcomes(app, campaign_id)


SENT = ("accepted", None)
CAPPED = ("skipped", "frequency_cap")


def test_a_daily_cap_holds_back_the_next_marketing_campaign_until_a_day_has_passed(
    capped, fake_push, clock
):
    app, engine = capped(per_day=2)
    (device,) = _person(app, fake_push)

    assert _send(app, engine, clock) == [SENT]
    clock.advance(HOUR)
    assert _send(app, engine, clock, topic="offers") == [SENT]
    clock.advance(HOUR)
    assert _send(app, engine, clock) == [CAPPED]
    assert len(fake_push.received(device)) == 2
    # 24 hours after the first one, one more may go; the second still counts.
    clock.advance(DAY - 2 * HOUR + dt.timedelta(seconds=1))
    assert _send(app, engine, clock) == [SENT]
    assert _send(app, engine, clock) == [CAPPED]
    assert len(fake_push.received(device)) == 3


def test_a_weekly_cap_counts_seven_days(capped, fake_push, clock):
    app, engine = capped(per_week=3)
    (device,) = _person(app, fake_push)
    for _ in range(3):
        assert _send(app, engine, clock) == [SENT]
        clock.advance(DAY)
    assert _send(app, engine, clock) == [CAPPED]  # day 4: three in the last 7 days
    clock.advance(4 * DAY)  # day 8: the first has left the window
    assert _send(app, engine, clock) == [SENT]
    assert len(fake_push.received(device)) == 4


def test_transactional_topics_are_never_capped_nor_counted(capped, fake_push, clock):
    app, engine = capped(per_day=1)
    (device,) = _person(app, fake_push, topics=("weekly-digest", "security-alerts"))

    assert _send(app, engine, clock, topic="security-alerts") == [SENT]
    assert _send(app, engine, clock) == [SENT]  # the account message did not count
    assert _send(app, engine, clock) == [CAPPED]
    assert _send(app, engine, clock, topic="security-alerts") == [SENT]  # never held back
    assert len(fake_push.received(device)) == 3


def test_one_campaign_on_several_devices_is_one_notification(capped, fake_push, clock):
    app, engine = capped(per_day=2)
    phone, laptop = _person(app, fake_push, devices=2)
    assert _send(app, engine, clock) == [SENT, SENT]
    assert _send(app, engine, clock) == [SENT, SENT]
    assert _send(app, engine, clock) == [CAPPED, CAPPED]
    assert len(fake_push.received(phone)) == len(fake_push.received(laptop)) == 2


def test_each_person_is_counted_apart(capped, fake_push, clock):
    app, engine = capped(per_day=1)
    (first,) = _person(app, fake_push)
    (second,) = _person(app, fake_push, topics=("offers",))
    assert _send(app, engine, clock) == [SENT]  # the first person's only
    assert _send(app, engine, clock, topic="offers") == [CAPPED, SENT]
    assert len(fake_push.received(first)) == len(fake_push.received(second)) == 1


def test_two_campaigns_in_one_batch_send_the_earlier_only(capped, fake_push, clock):
    app, engine = capped(per_day=1)
    (device,) = _person(app, fake_push)
    earlier = _launch(app, clock)
    later = _launch(app, clock, topic="offers")
    engine.tick()
    assert _outcomes(app, earlier) == [SENT]
    assert _outcomes(app, later) == [CAPPED]
    assert len(fake_push.received(device)) == 1


def test_one_a_day_applies_to_whoever_chose_it_with_no_portal_cap(capped, fake_push, clock):
    app, engine = capped()  # no portal-wide cap
    (chooser,) = _person(app, fake_push)
    (other,) = _person(app, fake_push)
    with db.begin(app) as session:
        chooser_id = session.scalar(
            sa.select(PushSubscription.subscriber_id).where(
                PushSubscription.endpoint == chooser.endpoint
            )
        )
        session.execute(
            sa.update(Subscriber).where(Subscriber.id == chooser_id).values(one_a_day=True)
        )
    assert _send(app, engine, clock) == [SENT, SENT]
    assert _send(app, engine, clock, topic="offers") == [CAPPED, SENT]
    assert len(fake_push.received(chooser)) == 1
    assert len(fake_push.received(other)) == 2


def test_one_a_day_is_the_stricter_of_the_two(capped, fake_push, clock):
    app, engine = capped(per_day=3)
    (device,) = _person(app, fake_push)
    with db.begin(app) as session:
        session.execute(sa.update(Subscriber).values(one_a_day=True))
    assert _send(app, engine, clock) == [SENT]
    assert _send(app, engine, clock) == [CAPPED]
    assert len(fake_push.received(device)) == 1


def test_test_sends_are_not_capped_nor_counted(capped, fake_push, clock):
    app, engine = capped(per_day=1)
    (device,) = _person(app, fake_push)
    with db.begin(app) as session:
        subscription = session.scalars(sa.select(PushSubscription)).one()
        draft = CampaignDraft(topic="weekly-digest", title="Test", body="Test", url="/news")
        for _ in range(2):
            campaigns.create_test_campaign(
                session,
                draft,
                subscriber_id=subscription.subscriber_id,
                subscription_id=subscription.id,
                created_by="test",
                now=clock.now(),
            )
    engine.tick()
    assert len(fake_push.received(device)) == 2
    assert _send(app, engine, clock) == [SENT]
    assert len(fake_push.received(device)) == 3


def test_no_caps_and_no_choice_sends_everything(capped, fake_push, clock):
    app, engine = capped()
    (device,) = _person(app, fake_push)
    for _ in range(5):
        assert _send(app, engine, clock) == [SENT]
    assert len(fake_push.received(device)) == 5


def _one_person_two_campaigns(app, fake_push, clock):
    """One person with one device, and two marketing campaigns launched for them:
    (first, second, (subscription id, subscriber id))."""
    _person(app, fake_push)
    first, second = _launch(app, clock), _launch(app, clock, topic="offers")
    with db.begin(app) as session:
        subscription = session.scalars(sa.select(PushSubscription)).one()
        return first, second, (subscription.id, subscription.subscriber_id)


def _check(session, delivery_id, campaign_id, device, marketing, *, now, **limits):
    """caps.over_cap for one delivery of ``campaign_id`` to ``device`` (subscription id,
    subscriber id), with the caps ``limits`` (per_day, per_week)."""
    return caps.over_cap(
        session,
        [caps.Candidate(delivery_id, campaign_id, *device)],
        set(marketing),
        now=now,
        caps=FrequencyCapSettings(**limits),
    )


def _delivery(session, campaign_id, subscription_id, status, at):
    row = Delivery(
        campaign_id=campaign_id,
        subscription_id=subscription_id,
        push_service="fcm",
        status=status,
        attempts=1,
        next_attempt_at=at,
        consent_reason="explicit_opt_in",
        updated_at=at,
    )
    session.add(row)
    session.flush()
    return row.id


@pytest.mark.parametrize(
    ("status", "held"),
    [
        # Out right now (claimed, and past its own check): counted.
        ("sending", True),
        # Accepted counts; failed, revoked, skipped and queued never.
        ("accepted", True),
        ("failed", False),
        ("revoked", False),
        ("skipped", False),
        ("queued", False),
    ],
)
def test_what_counts_against_a_delivery(capped, fake_push, clock, status, held):
    """The rule itself (caps.over_cap): another marketing campaign's delivery to the same
    person, in each status; one held back is marked skipped in the same transaction."""
    app, _ = capped(per_day=1)
    first, second, device = _one_person_two_campaigns(app, fake_push, clock)
    now = clock.now()
    with db.begin(app) as session:
        _delivery(session, first, device[0], status, now)
        mine = _delivery(session, second, device[0], "sending", now)
        found = _check(session, mine, second, device, (first, second), now=now, per_day=1)
    assert found == ({mine} if held else set())
    assert _outcomes(app, second) == ([CAPPED] if held else [("sending", None)])


def test_of_two_claimed_at_once_exactly_one_goes(capped, fake_push, clock):
    """Two processes claimed one person's deliveries of two campaigns before either was
    checked: the first check sees the other out and holds its own back (marked skipped
    at once), so the second check sees nothing out and lets its own go. Never both,
    never neither."""
    app, _ = capped(per_day=1)
    first, second, device = _one_person_two_campaigns(app, fake_push, clock)
    now = clock.now()
    with db.begin(app) as session:
        ids = {c: _delivery(session, c, device[0], "sending", now) for c in (first, second)}
    verdicts = []
    for campaign in (second, first):  # the later delivery is checked first
        with db.begin(app) as session:
            verdicts.append(
                _check(session, ids[campaign], campaign, device, ids, now=now, per_day=1)
            )
    assert verdicts == [{ids[second]}, set()]
    assert _outcomes(app, second) == [CAPPED]
    assert _outcomes(app, first) == [("sending", None)]


@pytest.mark.postgres_only
def test_a_check_waits_for_another_checking_the_same_person(capped, fake_push, clock):
    """Two processes check one person at the same moment. The first holds its delivery
    back (the other is out) and has not committed yet; the second must wait for it and
    then see that hold, or both would be held and the person get neither."""
    app, _ = capped(per_day=1)
    first, second, device = _one_person_two_campaigns(app, fake_push, clock)
    now = clock.now()
    with db.begin(app) as session:
        ids = {c: _delivery(session, c, device[0], "sending", now) for c in (first, second)}

    def check(session, campaign):
        return _check(session, ids[campaign], campaign, device, ids, now=now, per_day=1)

    checked = threading.Event()
    verdicts: dict[uuid.UUID, set[int]] = {}

    def first_check():
        with db.begin(app) as session:
            verdicts[first] = check(session, first)
            checked.set()
            time.sleep(0.5)  # checked, not yet committed

    holder = threading.Thread(target=first_check)
    holder.start()
    assert checked.wait(10)
    with db.begin(app) as session:
        started = time.monotonic()
        verdicts[second] = check(session, second)
        waited = time.monotonic() - started
    holder.join()
    assert verdicts == {first: {ids[first]}, second: set()}
    assert waited > 0.2, "the second check did not wait for the first"
    assert _outcomes(app, first) == [CAPPED]
    assert _outcomes(app, second) == [("sending", None)]


def test_a_send_older_than_the_window_no_longer_counts(capped, fake_push, clock):
    app, _ = capped(per_day=1, per_week=2)
    first, second, device = _one_person_two_campaigns(app, fake_push, clock)
    now = clock.now()
    with db.begin(app) as session:
        _delivery(session, first, device[0], "accepted", now - DAY)  # just out
        mine = _delivery(session, second, device[0], "queued", now)
        found = _check(
            session, mine, second, device, (first, second), now=now, per_day=1, per_week=2
        )
    assert found == set()


def test_the_campaign_page_counts_the_capped_deliveries(capped, fake_push, clock, sign_in):
    app, engine = capped(per_day=1)
    for _ in range(3):
        _person(app, fake_push)
    _send(app, engine, clock)
    campaign_id = _launch(app, clock, topic="offers")
    engine.tick()
    assert _outcomes(app, campaign_id) == [CAPPED] * 3
    staff = sign_in(app)
    page = staff.get(f"/staff/campaigns/{campaign_id}").text
    assert "Finished: 0 of 3 delivered, 3 skipped." in page
    assert re.search(
        r"Not sent: the person had already had as many marketing notifications as their "
        r"frequency cap allows</td>\s*<td[^>]*>3</td>",
        page,
    ), "the breakdown names the cap with its count"
    assert "Skipped: frequency cap" in page  # the chart's label and its table


@pytest.mark.parametrize(
    ("per_day", "per_week", "topic", "said"),
    [
        (2, 7, "weekly-digest", "Frequency caps apply: at most 2 a day and 7 a week marketing"),
        (0, 5, "offers", "Frequency caps apply: at most 5 a week marketing notifications"),
        (0, 0, "weekly-digest", "No portal-wide frequency cap is set; people who chose"),
        (2, 7, "security-alerts", "A transactional topic: frequency caps never hold it back"),
    ],
)
def test_the_review_page_says_what_the_caps_will_do(
    capped, sign_in, per_day, per_week, topic, said
):
    app, _ = capped(per_day=per_day, per_week=per_week)
    staff = sign_in(app)
    page = staff.post("/staff/campaigns/new", {**form_data(topic=topic), "action": "review"})
    assert page.status_code == 200
    note = re.search(r'<p class="hint" id="caps-note">([^<]*)</p>', page.text)
    assert note and note.group(1).startswith(said), note


# -- the preference centre's "How often" ------------------------------------------------


def _centre(app, fake_push):
    """A person's browser (its subscriber cookie) on the preference centre."""
    client = app.test_client()
    sub = fake_push.subscribe()
    response = client.post(
        "/api/push/subscribe",
        json={"subscription": sub.to_json(), "topics": ["weekly-digest"], "policyVersion": "v1"},
    )
    assert response.status_code == 201
    return client


def _one_a_day(app) -> list[bool]:
    with db.begin(app) as session:
        return list(session.scalars(sa.select(Subscriber.one_a_day).order_by(Subscriber.id)))


def _frequency_events(app) -> list[tuple[str, str, str, str]]:
    """The log's frequency_chosen events: (previous, new, source, screen)."""
    with db.begin(app) as session:
        return [
            (row.previous_state, row.new_state, row.source, json.loads(row.context)["screen"])
            for row in session.execute(
                sa.select(ConsentEvent)
                .where(ConsentEvent.kind == "frequency_chosen")
                .order_by(ConsentEvent.seq)
            ).scalars()
        ]


def test_the_preference_centre_saves_one_a_day_and_back_each_a_consent_event(push_app, fake_push):
    client = _centre(push_app, fake_push)
    page = client.get("/preferences").text
    assert re.search(r'id="how-often-as-sent"[^>]*\bchecked\b', page)
    saved = client.post(
        "/preferences/frequency", data={"csrf_token": csrf_token(page), "how_often": "one-a-day"}
    )
    assert saved.status_code == 303
    assert _one_a_day(push_app) == [True]
    page = client.get("/preferences").text
    assert "Saved: at most one marketing notification a day." in page
    assert re.search(r'id="how-often-one-a-day"[^>]*\bchecked\b', page)
    screen = "preference-centre:how-often"
    assert _frequency_events(push_app) == [("as_sent", "one_a_day", "preference-centre", screen)]
    # The same choice again changes nothing and logs nothing.
    client.post(
        "/preferences/frequency", data={"csrf_token": csrf_token(page), "how_often": "one-a-day"}
    )
    page = client.get("/preferences").text
    assert "Saved: at most one marketing notification a day. Nothing needed to change." in page
    assert len(_frequency_events(push_app)) == 1
    client.post(
        "/preferences/frequency", data={"csrf_token": csrf_token(page), "how_often": "as-sent"}
    )
    assert _one_a_day(push_app) == [False]
    assert _frequency_events(push_app)[1] == ("one_a_day", "as_sent", "preference-centre", screen)


@pytest.mark.parametrize("value", [None, "", "two-a-day", "ONE-A-DAY", "one-a-day " * 50])
def test_a_choice_that_is_not_offered_is_refused_and_changes_nothing(push_app, fake_push, value):
    client = _centre(push_app, fake_push)
    page = client.get("/preferences").text
    data = {"csrf_token": csrf_token(page)}
    if value is not None:
        data["how_often"] = value
    refused = client.post("/preferences/frequency", data=data)
    assert refused.status_code == 400
    assert "Choose how often you want marketing notifications" in refused.text
    assert 'href="#how-often-as-sent"' in refused.text
    assert _one_a_day(push_app) == [False]
    assert _frequency_events(push_app) == []


def test_without_a_subscriber_or_a_token_nothing_is_saved(push_app, fake_push):
    client = _centre(push_app, fake_push)
    token = csrf_token(client.get("/preferences").text)
    stranger = push_app.test_client()  # no subscriber cookie; a token from the home page
    stranger_token = re.search(r'name="csrf-token" content="([^"]+)"', stranger.get("/").text)
    assert stranger_token
    refused = stranger.post(
        "/preferences/frequency",
        data={"csrf_token": stranger_token.group(1), "how_often": "one-a-day"},
    )
    assert refused.status_code == 403
    # The person's own browser without the form's token.
    forged = client.post("/preferences/frequency", data={"how_often": "one-a-day"})
    assert forged.status_code == 400
    assert token  # the form had one
    assert _one_a_day(push_app) == [False]


def test_the_choice_says_the_portal_caps(capped, fake_push):
    app, _ = capped(per_day=2, per_week=7)
    client = _centre(app, fake_push)
    assert "Never more than 2 a day and 7 a week." in client.get("/preferences").text
    plain, _ = capped()
    assert (
        "One for each campaign on a topic you chose."
        in _centre(plain, fake_push).get("/preferences").text
    )


def test_the_caps_are_read_from_the_environment(tmp_path):
    from portal.config import ConfigError, Settings

    read = Settings.from_env(
        {"MARKETING_CAP_PER_DAY": "2", "MARKETING_CAP_PER_WEEK": "7"}, str(tmp_path)
    )
    assert read.frequency_caps == FrequencyCapSettings(per_day=2, per_week=7)
    assert Settings.from_env({}, str(tmp_path)).frequency_caps == FrequencyCapSettings(0, 0)
    for bad in ("-1", "two", "1.5"):
        with pytest.raises(ConfigError, match="MARKETING_CAP_PER_DAY"):
            Settings.from_env({"MARKETING_CAP_PER_DAY": bad}, str(tmp_path))


def test_an_unknown_person_is_their_own_subscription():
    item = caps.Candidate(1, uuid.uuid4(), uuid.uuid4(), None)
    assert item.person == item.subscription_id
