"""Campaign rules behind the form and the command line: links, send times, test sends."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
import sqlalchemy as sa

from portal.campaigns import services
from portal.campaigns.models import Campaign
from portal.campaigns.services import CampaignDraft
from portal.db import db
from portal.delivery.models import Delivery
from portal.errors import ValidationError
from portal.subscriptions.models import PushSubscription, Subscriber
from tests.factories import SubscriptionFactory


def draft(**fields):
    return CampaignDraft(**{"topic": "weekly-digest", "title": "T", "body": "B", **fields})


def problems(app, clock, **fields):
    with db.begin(app) as session:
        return {
            (p.field, p.code)
            for p in services.validate_draft(session, draft(**fields), now=clock.now())
        }


@pytest.mark.parametrize(
    "link", ["/\\evil.example", "/\t/evil.example", "/ok path", "/x\x00", "//evil.example"]
)
def test_a_same_site_path_cannot_point_off_site(catalogue_ready, clock, link):
    assert ("url", "invalid_link") in problems(catalogue_ready, clock, url=link)


def test_a_send_time_in_the_past_is_refused_with_a_minute_of_grace(catalogue_ready, clock):
    now = clock.now()
    assert ("send_at", "in_the_past") in problems(
        catalogue_ready, clock, send_at=now - dt.timedelta(minutes=2)
    )
    assert problems(catalogue_ready, clock, send_at=now - dt.timedelta(seconds=30)) == set()


def test_deliver_until_without_a_zone_is_refused_not_crashed(catalogue_ready, clock):
    naive = dt.datetime(2026, 2, 1)
    assert ("deliver_until", "invalid_value") in problems(
        catalogue_ready, clock, deliver_until=naive
    )


def test_the_zone_is_checked_for_every_caller_and_kept(catalogue_ready, clock):
    assert ("timezone", "zone_alias") in problems(catalogue_ready, clock, time_zone="US/Eastern")
    assert ("timezone", "unknown_zone") in problems(catalogue_ready, clock, time_zone="Mars/X")
    assert problems(catalogue_ready, clock, time_zone="Europe/Paris") == set()
    with db.begin(catalogue_ready) as session:
        with pytest.raises(ValidationError, match="US/Eastern → America/New_York"):
            services.create_campaign(
                session, draft(time_zone="US/Eastern"), created_by="x", now=clock.now()
            )
        made = services.create_campaign(
            session, draft(time_zone="Asia/Kolkata"), created_by="x", now=clock.now()
        )
        assert made.time_zone == "Asia/Kolkata"
    with db.begin(catalogue_ready) as session:
        assert session.scalars(sa.select(Campaign.time_zone)).all() == ["Asia/Kolkata"]


def _subscribe(app, client=None):
    sub = SubscriptionFactory()()
    response = (client or app.test_client()).post(
        "/api/push/subscribe", json={"subscription": sub.to_json()}
    )
    assert response.status_code == 201
    with db.begin(app) as session:
        row = session.scalars(
            sa.select(PushSubscription).where(PushSubscription.endpoint == sub.endpoint)
        ).one()
        return row.id, row.subscriber_id


def test_a_test_campaign_has_exactly_one_delivery_and_no_audience(catalogue_ready, clock):
    app = catalogue_ready
    mine, me = _subscribe(app)
    for _ in range(3):
        _subscribe(app)  # the topic's audience: none of it is the test's
    with db.begin(app) as session:
        campaign = services.create_test_campaign(
            session,
            draft(send_at=clock.now() + dt.timedelta(days=1)),
            subscription_id=mine,
            subscriber_id=me,
            created_by="me@example.test",
            now=clock.now(),
        )
        campaign_id = campaign.id
        assert campaign.is_test
        assert campaign.send_at == clock.now()  # a test goes now, whatever the schedule
        assert campaign.materialised_at == clock.now()
    with db.begin(app) as session:
        fresh = session.get(Campaign, campaign_id)
        fresh.materialised_at = None  # even if asked again, it never materialises
        assert services.materialise_batch(session, fresh, now=clock.now()) == 0
        deliveries = session.scalars(sa.select(Delivery)).all()
        assert [(d.subscription_id, d.consent_reason, d.status) for d in deliveries] == [
            (mine, "test", "queued")
        ]


def test_a_test_goes_only_to_the_senders_own_subscriptions(catalogue_ready, clock):
    app = catalogue_ready
    mine, me = _subscribe(app)
    theirs, _ = _subscribe(app)
    with db.begin(app) as session, pytest.raises(ValidationError) as refused:
        services.create_test_campaign(
            session,
            draft(),
            subscription_id=theirs,
            subscriber_id=me,
            created_by="me@example.test",
            now=clock.now(),
        )
    assert refused.value.field == "subscription"
    with db.begin(app) as session:
        assert [s.id for s in services.subscriptions_for_tests(session, me)] == [mine]
        assert session.scalar(sa.select(sa.func.count()).select_from(Campaign)) == 0


def test_an_ended_subscription_gets_no_test(catalogue_ready, clock):
    app = catalogue_ready
    mine, me = _subscribe(app)
    with db.begin(app) as session:
        session.get(PushSubscription, mine).state = "revoked"
    with db.begin(app) as session:
        assert services.subscriptions_for_tests(session, me) == []
        with pytest.raises(ValidationError):
            services.create_test_campaign(
                session,
                draft(),
                subscription_id=mine,
                subscriber_id=me,
                created_by="me@example.test",
                now=clock.now(),
            )


def test_test_campaigns_are_left_out_of_the_list_unless_asked_for(catalogue_ready, clock):
    app = catalogue_ready
    mine, me = _subscribe(app)
    with db.begin(app) as session:
        real = services.create_campaign(
            session, draft(title="Real"), created_by="x", now=clock.now()
        )
        test = services.create_test_campaign(
            session,
            draft(title="Trial"),
            subscription_id=mine,
            subscriber_id=me,
            created_by="x",
            now=clock.now(),
        )
        real_id, test_id = real.id, test.id
    with db.begin(app) as session:
        assert [r.campaign.id for r in services.list_campaigns(session).rows] == [real_id]
        listed = services.list_campaigns(session, include_tests=True).rows
        assert {r.campaign.id for r in listed} == {real_id, test_id}
        (trial,) = [r for r in listed if r.campaign.id == test_id]
        assert trial.total == 1


def test_create_campaign_takes_a_chosen_id(catalogue_ready, clock):
    chosen = uuid.uuid4()
    with db.begin(catalogue_ready) as session:
        made = services.create_campaign(
            session, draft(), created_by="x", now=clock.now(), campaign_id=chosen
        )
        assert made.id == chosen


def test_deliveries_are_numbered_in_the_audience_s_order_whatever_the_table_s(
    catalogue_ready, clock
):
    """A campaign's deliveries are claimed in id order, so their ids follow the
    subscriptions' ids, not the order the database happens to read the audience in: here
    the first three subscriptions and their people were written again, which moves their
    rows to the end of PostgreSQL's tables, and the audience is written in batches of four."""
    app = catalogue_ready
    subscribed, subscribers = zip(*(_subscribe(app) for _ in range(6)), strict=True)
    with db.begin(app) as session:
        session.execute(
            sa.update(PushSubscription)
            .where(PushSubscription.id.in_(subscribed[:3]))
            .values(consecutive_failures=PushSubscription.consecutive_failures)
        )
        session.execute(
            sa.update(Subscriber)
            .where(Subscriber.id.in_(subscribers[:3]))
            .values(time_zone=Subscriber.time_zone)
        )
        campaign = services.create_campaign(
            session, draft(topic="security-alerts"), created_by="x", now=clock.now()
        )
        campaign.status = "sending"
        session.flush()
        if session.get_bind().dialect.name == "postgresql":
            # The plan a big table gets: the tables read in the order their rows lie.
            for scan in ("indexscan", "indexonlyscan", "bitmapscan"):
                session.execute(sa.text(f"SET LOCAL enable_{scan} = off"))
        batches = [
            services.materialise_batch(session, campaign, now=clock.now(), batch=4)
            for _ in range(3)
        ]
        assert batches == [4, 2, 0]  # each batch says how many it wrote; 0 when complete
        deliveries = session.execute(
            sa.select(Delivery.subscription_id).order_by(Delivery.id)
        ).scalars()
        assert list(deliveries) == sorted(subscribed)
