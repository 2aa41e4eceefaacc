"""From the staff form to the browser, against the fake push service that decrypts.

The engine's own tests cover sending; these cover the form path: what a person launches
or tests on the page is what the people consent allows receive, once, readable.
"""

from __future__ import annotations

import json
import re
import uuid

import sqlalchemy as sa

from portal.campaigns.models import Campaign
from portal.consent.catalogue import topic_by_slug
from portal.consent.recipients import recipients
from portal.db import db
from portal.delivery.models import Delivery
from portal.staff.models import StaffAudit
from portal.subscriptions.models import PushSubscription
from tests.campaigns.conftest import form_data, set_region


def subscribe(app, fake_push, *, region=None, topics=None, client=None):
    sub = fake_push.subscribe()
    body = {"subscription": sub.to_json()}
    if topics is not None:
        body |= {"topics": topics, "policyVersion": "v1"}
    response = (client or app.test_client()).post("/api/push/subscribe", json=body)
    assert response.status_code == 201, response.json
    if region:
        set_region(app, sub.endpoint, region)
    return sub


def subscription_ids(app) -> dict[str, uuid.UUID]:
    with db.begin(app) as session:
        return {
            row.endpoint: row.id
            for row in session.execute(sa.select(PushSubscription.endpoint, PushSubscription.id))
        }


def test_a_campaign_launched_from_the_form_reaches_exactly_the_people_consent_allows(
    push_app, dispatcher, fake_push, sign_in, clock
):
    app = push_app
    people = [
        subscribe(app, fake_push, region="US"),  # marketing default applies
        subscribe(app, fake_push, region="US"),
        subscribe(app, fake_push, region="EU"),  # default does not apply
        subscribe(app, fake_push, region="EU", topics=["weekly-digest"]),  # opted in
        subscribe(app, fake_push, region="UK", topics=["weekly-digest", "offers"]),
        subscribe(app, fake_push, region="US", topics=[]),  # opted out of marketing
        subscribe(app, fake_push, region="US", topics=["offers"]),  # another topic only
        subscribe(app, fake_push),  # region unknown: no marketing default
    ]
    leaving = subscribe(app, fake_push, region="US", topics=["weekly-digest"])
    assert (
        app.test_client()
        .post(
            "/api/push/unsubscribe", json={"endpoint": leaving.endpoint, "auth": leaving.auth_b64}
        )
        .status_code
        == 200
    )
    people.append(leaving)
    with db.begin(app) as session:
        topic = topic_by_slug(session, "weekly-digest")
        allowed = {r.subscription_id for r in recipients(session, topic.id)}
    ids = subscription_ids(app)
    assert len(allowed) == 4
    assert 0 < len(allowed) < len(people)

    staff = sign_in(app)
    fields = form_data(
        title="Monday digest", body="Five things\r\nthis week", url="/news", urgency="low"
    )
    review = staff.post("/staff/campaigns/new", {**fields, "action": "review"})
    assert "<strong>4</strong> subscriptions may get this campaign" in review.text
    campaign_id = re.search(r'name="campaign_id" value="([0-9a-f-]{36})"', review.text).group(1)
    launched = staff.post(
        "/staff/campaigns/new", {**fields, "campaign_id": campaign_id, "action": "launch"}
    )
    assert launched.status_code == 303
    assert fake_push.received() == []  # launching sends nothing by itself

    dispatcher.tick()

    with db.begin(app) as session:
        deliveries = {
            d.subscription_id: d.id
            for d in session.scalars(
                sa.select(Delivery).where(Delivery.campaign_id == uuid.UUID(campaign_id))
            )
        }
        assert session.get(Campaign, uuid.UUID(campaign_id)).status == "completed"
    assert set(deliveries) == allowed
    for person in people:
        subscription_id = ids[person.endpoint]
        messages = fake_push.plaintexts(person)
        if subscription_id not in allowed:
            assert messages == [], person.endpoint
            continue
        (message,) = messages  # exactly one, and readable by this browser only
        assert json.loads(message) == {
            "deliveryId": str(deliveries[subscription_id]),
            "campaignId": campaign_id,
            "title": "Monday digest",
            "body": "Five things\nthis week",
            "url": "/news",
            "tag": f"campaign-{campaign_id}",
        }
        (received,) = fake_push.received(person)
        assert (received.headers["ttl"], received.headers["urgency"]) == ("86400", "low")
    assert len(fake_push.received()) == len(allowed)

    page = staff.get(f"/staff/campaigns/{campaign_id}").text
    assert "Finished: 4 of 4 delivered." in page
    assert '<span class="tag tag--success" id="campaign-status">Delivered</span>' in page
    assert '<td>201 Created</td><td class="numeric">4</td>' in page
    dispatcher.tick()
    assert len(fake_push.received()) == len(allowed)  # never twice


def test_a_test_send_reaches_only_the_staff_members_own_browser(
    push_app, dispatcher, fake_push, sign_in, clock
):
    app = push_app
    staff = sign_in(app)
    # This browser subscribed on the subscribe page (its cookies are the staff client's),
    # and chose no marketing topic: the test is for its owner, not for the audience.
    mine = subscribe(app, fake_push, region="US", topics=[], client=staff.client)
    others = [subscribe(app, fake_push, region="US", topics=["weekly-digest"]) for _ in range(2)]
    ids = subscription_ids(app)

    review = staff.post("/staff/campaigns/new", {**form_data(), "action": "review"}).text
    assert "Which of your browsers" in review
    chosen = re.search(
        r'<input type="radio" id="subscription" name="subscription" value="([0-9a-f-]{36})" checked>',
        review,
    ).group(1)
    assert uuid.UUID(chosen) == ids[mine.endpoint]
    assert "This browser:" in review

    response = staff.post(
        "/staff/campaigns/test-send",
        {**form_data(schedule="later", send_at="2026-06-01T09:00"), "subscription": chosen},
    )
    # Post/redirect/get: the answer is the review page again, at an address of its own.
    assert response.status_code == 303
    sent = staff.get(response.headers["Location"])
    assert sent.status_code == 200
    assert "Test queued" in sent.text
    follow = re.search(
        r'<a class="back-link" href="(/staff/campaigns/[0-9a-f-]{36})">Follow the test send</a>',
        sent.text,
    )
    assert follow
    # The draft as it was left, schedule included (the session keeps what the test has
    # no column for), ready to launch.
    assert "Mon 1 Jun 2026, 09:00 UTC" in sent.text
    assert '<input type="hidden" name="send_at" value="2026-06-01T09:00">' in sent.text
    assert '<input type="hidden" name="title" value="Monday digest">' in sent.text
    assert staff.get(response.headers["Location"]).text.count("Test queued") == 1  # a reload
    assert fake_push.received() == []  # the request only queues it

    dispatcher.tick()

    (message,) = fake_push.plaintexts(mine)
    content = json.loads(message)
    assert (content["title"], content["body"], content["url"]) == (
        "Monday digest",
        "Five things this week",
        "/news",
    )
    for other in others:
        assert fake_push.received(other) == []
    with db.begin(app) as session:
        (test,) = session.scalars(sa.select(Campaign)).all()
        assert (test.is_test, test.status) == (True, "completed")
        (delivery,) = session.scalars(sa.select(Delivery)).all()
        assert (delivery.consent_reason, delivery.status) == ("test", "accepted")
        (audit,) = session.scalars(
            sa.select(StaffAudit).where(StaffAudit.action == "campaign.test_sent")
        ).all()
        assert audit.actor_email == "campaigner@example.test"
        assert audit.target == f"campaign:{test.id}"

    # Not a campaign: left out of the list unless asked for, and marked where shown.
    assert "No campaigns yet" in staff.get("/staff/campaigns").text
    listed = staff.get("/staff/campaigns?tests=1").text
    assert "Test send</span>" in listed
    page = staff.get(follow.group(1)).text
    assert '<span class="tag tag--test">Test send</span>' in page
    assert "Finished: 1 of 1 delivered." in page


def test_a_test_send_cannot_be_pointed_at_someone_elses_subscription(
    push_app, dispatcher, fake_push, sign_in
):
    app = push_app
    staff = sign_in(app)
    subscribe(app, fake_push, client=staff.client)
    victim = subscribe(app, fake_push, topics=["weekly-digest"])
    response = staff.post(
        "/staff/campaigns/test-send",
        {**form_data(), "subscription": str(subscription_ids(app)[victim.endpoint])},
    )
    assert response.status_code == 422
    assert "that one is not yours or has ended" in response.text
    dispatcher.tick()
    assert fake_push.received() == []
    with db.begin(app) as session:
        assert session.scalar(sa.select(sa.func.count()).select_from(Campaign)) == 0


def test_a_browser_without_a_subscription_is_told_how_to_get_one(campaigner, catalogue_ready):
    html = campaigner.post("/staff/campaigns/new", {**form_data(), "action": "review"}).text
    assert "This browser has no subscription linked to you" in html
    assert (
        '<a href="/" target="_blank" rel="noopener">subscribe page (opens in a new tab)</a>' in html
    )
    assert "Send a test to this browser" not in html
    response = campaigner.post(
        "/staff/campaigns/test-send", {**form_data(), "subscription": str(uuid.uuid4())}
    )
    assert response.status_code == 422
    assert "Choose one of this browser&#39;s subscriptions" in response.text


def test_a_test_send_with_a_bad_draft_goes_back_to_the_form(campaigner, catalogue_ready):
    response = campaigner.post(
        "/staff/campaigns/test-send", {**form_data(title=""), "subscription": ""}
    )
    assert response.status_code == 422
    assert '<a href="#title">Enter a title</a>' in response.text


def test_the_page_after_a_test_send_is_its_senders_alone(push_app, fake_push, sign_in):
    app = push_app
    staff = sign_in(app)
    subscribe(app, fake_push, client=staff.client)
    review = staff.post("/staff/campaigns/new", {**form_data(), "action": "review"}).text
    chosen = re.search(r'name="subscription" value="([0-9a-f-]{36})" checked', review).group(1)
    sent = staff.post("/staff/campaigns/test-send", {**form_data(), "subscription": chosen})
    assert sent.status_code == 303
    colleague = sign_in(app, "colleague@example.test")
    assert colleague.get(sent.headers["Location"]).status_code == 404
    assert staff.get(f"/staff/campaigns/test-send/{uuid.uuid4()}").status_code == 404
    assert staff.get(sent.headers["Location"]).status_code == 200
    with db.begin(app) as session:
        assert session.scalar(sa.select(sa.func.count()).select_from(Campaign)) == 1


AB = {
    "variant_b_title": "B title",
    "variant_b_body": "B body",
    "test_share": "20",
    "winner_after_hours": "4",
}


def _launch_after_test_send(staff, app, fields):
    review = staff.post("/staff/campaigns/new", {**form_data(**fields), "action": "review"}).text
    chosen = re.search(r'name="subscription" value="([0-9a-f-]{36})" checked', review).group(1)
    sent = staff.post("/staff/campaigns/test-send", {**form_data(**fields), "subscription": chosen})
    assert sent.status_code == 303
    return staff.get(sent.headers["Location"])


def test_a_test_send_keeps_the_ab_test_for_the_launch(push_app, fake_push, sign_in):
    """The test goes with variant A's text alone; the page after it, and the launch from
    it, keep variants and the test share as typed."""
    app = push_app
    staff = sign_in(app)
    subscribe(app, fake_push, client=staff.client)
    page = _launch_after_test_send(staff, app, AB)
    assert page.status_code == 200
    html = page.text
    for name, value in AB.items():
        assert re.search(rf'name="{name}"[^>]*value="{value}"', html), name
    # Launch with what the page carries, nothing else.
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', html))
    assert {name: fields.get(name) for name in AB} == AB
    fields.pop("csrf_token", None)
    launched = staff.post("/staff/campaigns/new", {**fields, "action": "launch"})
    assert launched.status_code == 303, launched.text
    with db.begin(app) as session:
        campaign = session.scalars(sa.select(Campaign).where(Campaign.is_test.is_(False))).one()
        assert campaign.test_share == 20
        assert campaign.winner_after == 4 * 3600


def test_variants_too_long_to_keep_are_said_not_dropped(push_app, fake_push, sign_in):
    app = push_app
    staff = sign_in(app)
    subscribe(app, fake_push, client=staff.client)
    long = {**AB, "variant_b_body": "word " * 400}
    page = _launch_after_test_send(staff, app, long)
    assert page.status_code == 200
    assert "Variants B and C were too long to keep on this page" in page.text
    assert 'value="launch"' not in page.text  # the form, to type them again, not Launch
