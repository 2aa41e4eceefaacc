"""Test devices: staff register their own browsers and send a campaign's exact message to
some of them from the review page, without launching (portal/campaigns/testdevices.py).

Every send goes through the fake push service on loopback, which decrypts what it gets
with the browser's own keys: a test here proves the device could read the message.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

import pytest
import sqlalchemy as sa

from portal.campaigns import testdevices
from portal.campaigns.testdevice_models import TestDevice, TestSend
from portal.campaigns.testdevices import SENDS_PER_WINDOW
from portal.consent.catalogue import topic_by_slug
from portal.consent.recipients import audience_breakdown
from portal.db import db
from portal.staff.models import Role, StaffAudit
from tests.campaigns.conftest import form_data
from tests.helpers import all_rows, count_rows

# What a refused request must leave alone.
TABLES = (
    "staff_test_device",
    "staff_test_send",
    "staff_audit",
    "campaign",
    "campaign_draft",
    "delivery",
    "consent_event",
    "push_subscription",
    "subscriber",
)

RICH = {
    "image": "/static/img/sale.png",
    "badge": "/static/img/badge.png",
    "action1_title": "Shop now",
    "action1_url": "/shop",
    "action2_title": "Later",
    "action2_url": "/later",
    "require_interaction": "y",
}


def register(staff, fake_push, name: str, sub=None) -> Any:
    sub = sub or fake_push.subscribe()
    response = staff.post(
        "/staff/campaigns/test-devices",
        {"name": name, "subscription": json.dumps(sub.to_json())},
        headers={"User-Agent": "Mozilla/5.0 (X11; Linux x86_64) Chrome/131.0 Safari/537.36"},
    )
    assert response.status_code == 303, response.text
    return sub


def device_ids(app) -> dict[str, int]:
    with db.begin(app) as session:
        return {d.name: d.id for d in session.scalars(sa.select(TestDevice))}


def snapshot(engine) -> dict[str, Any]:
    return {table: all_rows(engine, table) for table in TABLES}


def send(staff, ids, **fields: Any) -> Any:
    return staff.post(
        "/staff/campaigns/device-test",
        {**form_data(**fields), "device": [str(i) for i in ids]},
    )


@pytest.fixture
def app(push_app):
    return push_app


@pytest.fixture
def staff(push_app, sign_in):
    return sign_in(push_app)


# -- the page -----------------------------------------------------------------------------


def test_the_page_registers_renames_and_removes_this_browser(app, staff, fake_push, engine):
    empty = staff.get("/staff/campaigns/test-devices")
    assert empty.status_code == 200
    assert "You have no test devices yet" in empty.text
    assert "Allow notifications and register this browser" in empty.text

    sub = register(staff, fake_push, "  Work   laptop ")
    page = staff.get("/staff/campaigns/test-devices").text
    assert "This browser is registered as “Work laptop”" in page
    assert 'data-label="Name">Work laptop <span' in page
    assert "Never tested" in page
    (row,) = all_rows(engine, "staff_test_device")
    # Kept as a push subscription is: the endpoint, its hash, the auth secret sealed.
    assert row["endpoint"] == sub.endpoint
    assert len(row["endpoint_hash"]) == 32
    assert sub.auth not in bytes(row["auth_sealed"])
    assert row["p256dh"] == sub.p256dh
    # Not a subscriber: no subscription, person or consent event came of it.
    assert count_rows(engine, "push_subscription") == 0
    assert count_rows(engine, "subscriber") == 0
    assert count_rows(engine, "consent_event") == 0

    (device_id,) = device_ids(app).values()
    renamed = staff.post(f"/staff/campaigns/test-devices/{device_id}/rename", {"name": "Phone"})
    assert renamed.status_code == 303
    assert "“Work laptop” is now “Phone”" in staff.get("/staff/campaigns/test-devices").text

    # The same browser again keeps its row and its name.
    register(staff, fake_push, "Another name", sub=sub)
    assert device_ids(app) == {"Phone": device_id}
    assert "registered already, as “Phone”" in staff.get("/staff/campaigns/test-devices").text

    removed = staff.post(f"/staff/campaigns/test-devices/{device_id}/remove")
    assert removed.status_code == 303
    assert "“Phone” is removed" in staff.get("/staff/campaigns/test-devices").text
    assert device_ids(app) == {}
    with db.begin(app) as session:
        actions = [
            (a.action, a.target)
            for a in session.scalars(
                sa.select(StaffAudit)
                .where(StaffAudit.action.like("test_device.%"))
                .order_by(StaffAudit.id)
            )
        ]
    target = f"test-device:{device_id}"
    assert actions == [
        ("test_device.registered", target),
        ("test_device.renamed", target),
        ("test_device.registered", target),
        ("test_device.removed", target),
    ]


@pytest.mark.parametrize(
    ("name", "subscription", "message"),
    [
        ("Laptop", "", "This browser gave no push subscription"),
        ("Laptop", "{not json", "could not be read"),
        ("Laptop", json.dumps({"endpoint": "https://evil.example/push/x"}), "was refused"),
        ("", None, "Enter a name for this device"),
        ("x" * 61, None, "60 characters or fewer"),
        ("Bell\u0007", None, "a character that cannot be shown"),
        ("LAPTOP", None, "named “LAPTOP” already"),
    ],
    ids=["no-subscription", "not-json", "bad-subscription", "empty", "long", "control", "taken"],
)
def test_a_refused_registration_says_why_and_changes_nothing(
    app, staff, fake_push, engine, name, subscription, message
):
    register(staff, fake_push, "Laptop")
    before = snapshot(engine)
    if subscription is None:
        subscription = json.dumps(fake_push.subscribe().to_json())
    response = staff.post(
        "/staff/campaigns/test-devices", {"name": name, "subscription": subscription}
    )
    assert response.status_code == 422
    assert message in response.text
    assert "There is a problem" in response.text
    assert snapshot(engine) == before


def test_another_persons_device_cannot_be_renamed_or_removed(
    app, staff, sign_in, fake_push, engine
):
    register(staff, fake_push, "Mine")
    (device_id,) = device_ids(app).values()
    other = sign_in(app, "other@example.test")
    assert "Mine" not in other.get("/staff/campaigns/test-devices").text
    before = snapshot(engine)
    for action, data in (("rename", {"name": "Taken over"}), ("remove", {})):
        response = other.post(f"/staff/campaigns/test-devices/{device_id}/{action}", data)
        assert response.status_code == 404
        assert "That test device" in response.text
        missing = other.post(f"/staff/campaigns/test-devices/999999/{action}", data)
        assert missing.status_code == 404
    assert snapshot(engine) == before


def test_a_rename_to_a_taken_name_is_refused(app, staff, fake_push, engine):
    register(staff, fake_push, "Laptop")
    register(staff, fake_push, "Phone")
    before = snapshot(engine)
    response = staff.post(
        f"/staff/campaigns/test-devices/{device_ids(app)['Phone']}/rename", {"name": "laptop"}
    )
    assert response.status_code == 422
    assert "named “laptop” already" in response.text
    assert snapshot(engine) == before


# -- sending ------------------------------------------------------------------------------


def test_a_test_goes_to_the_chosen_devices_only_with_the_exact_message(
    app, staff, fake_push, engine, dispatcher
):
    laptop = register(staff, fake_push, "Laptop")
    phone = register(staff, fake_push, "Phone")
    tablet = register(staff, fake_push, "Tablet")
    ids = device_ids(app)
    with db.begin(app) as session:
        audience = audience_breakdown(session, topic_by_slug(session, "weekly-digest").id)

    review = staff.post("/staff/campaigns/new", {**form_data(**RICH), "action": "review"}).text
    assert "Which of your test devices" in review
    launch_id = re.search(r'name="campaign_id" value="([0-9a-f-]{36})"', review).group(1)
    response = send(staff, [ids["Laptop"], ids["Tablet"]], campaign_id=launch_id, **RICH)
    assert response.status_code == 303
    page = staff.get(response.headers["Location"])
    assert page.status_code == 200
    assert "2 of 2 accepted by the push service" in page.text
    assert "Nothing was launched, and no subscriber got it" in page.text
    assert page.text.count("Accepted by the push service (201)") == 2
    # The form as it was sent, ready to launch.
    assert f'<input type="hidden" name="campaign_id" value="{launch_id}">' in page.text
    assert '<input type="hidden" name="action1_title" value="Shop now">' in page.text

    for sub in (laptop, tablet):
        (message,) = fake_push.plaintexts(sub)
        assert json.loads(message) == {
            "campaignId": launch_id,
            "title": "Monday digest",
            "body": "Five things this week",
            "tag": f"campaign-{launch_id}",
            "url": "/news",
            "image": "/static/img/sale.png",
            "badge": "/static/img/badge.png",
            "actions": [
                {"action": "action-1", "title": "Shop now", "url": "/shop"},
                {"action": "action-2", "title": "Later", "url": "/later"},
            ],
            "requireInteraction": True,
        }
        (received,) = fake_push.received(sub)
        assert received.headers["ttl"] == "86400"
    assert fake_push.received(phone) == []

    # Not a campaign, not a delivery, not consent: nothing to dispatch, count or export.
    dispatcher.tick()
    assert len(fake_push.received()) == 2
    for table in ("campaign", "delivery", "consent_event", "push_subscription"):
        assert count_rows(engine, table) == 0, table
    with db.begin(app) as session:
        assert audience_breakdown(session, topic_by_slug(session, "weekly-digest").id) == audience
        (audit,) = session.scalars(
            sa.select(StaffAudit).where(StaffAudit.action == "campaign.device_test_sent")
        ).all()
        assert audit.detail["devices"] == ["Laptop: sent", "Tablet: sent"]
        (sent,) = session.scalars(sa.select(TestSend)).all()
        assert audit.target == f"test-send:{sent.id}"
    # A reload shows the same answer and sends nothing.
    assert "2 of 2 accepted" in staff.get(response.headers["Location"]).text
    assert len(fake_push.received()) == 2
    devices = staff.get("/staff/campaigns/test-devices").text
    assert devices.count("Sent (201)") == 2


def test_a_gone_device_is_marked_gone_and_an_error_is_said_honestly(app, staff, fake_push, engine):
    gone = register(staff, fake_push, "Old phone")
    failing = register(staff, fake_push, "Laptop")
    fine = register(staff, fake_push, "Tablet")
    fake_push.script(gone, 410)
    fake_push.script(failing, 500)
    ids = device_ids(app)
    response = send(staff, [ids["Old phone"], ids["Laptop"], ids["Tablet"]])
    assert response.status_code == 303
    page = staff.get(response.headers["Location"]).text
    assert "1 of 3 accepted by the push service, 1 gone, 1 not sent" in page
    assert "The push service no longer knows this browser (410)" in page
    assert "The push service refused the message (500)" in page
    assert "Gone, so not offered: “Old phone”" in page
    assert len(fake_push.plaintexts(fine)) == 1
    with db.begin(app) as session:
        states = {
            d.name: (d.last_result, d.last_status, d.gone_at is not None)
            for d in session.scalars(sa.select(TestDevice))
        }
    assert states == {
        "Old phone": ("gone", 410, True),
        "Laptop": ("error", 500, False),
        "Tablet": ("sent", 201, False),
    }
    # A gone device cannot be chosen again.
    before = snapshot(engine)
    again = send(staff, [ids["Old phone"]])
    assert again.status_code == 422
    assert "“Old phone” is gone" in again.text
    assert snapshot(engine) == before
    # Until the browser registers again (the same subscription, renewed).
    register(staff, fake_push, "ignored", sub=gone)
    assert send(staff, [ids["Old phone"]]).status_code == 303


def test_a_device_that_does_not_answer_is_an_error_not_a_send(app, staff, fake_push):
    from tests.fakepush import Answer

    sub = register(staff, fake_push, "Laptop")
    fake_push.script(sub, Answer.connection_reset(), Answer.connection_reset())
    response = send(staff, list(device_ids(app).values()))
    assert response.status_code == 303
    page = staff.get(response.headers["Location"]).text
    assert "0 of 1 accepted by the push service, 1 not sent" in page
    assert "No answer from the push service" in page


@pytest.fixture
def attacker_world(app, staff, sign_in, fake_push):
    """Ann (signed in as ``staff``) has a device; Bob has one, and a gone one."""
    register(staff, fake_push, "Ann's laptop")
    bob = sign_in(app, "bob@example.test")
    register(bob, fake_push, "Bob's phone")
    gone = register(staff, fake_push, "Ann's old phone")
    fake_push.script(gone, 404)
    assert send(staff, [device_ids(app)["Ann's old phone"]]).status_code == 303
    return device_ids(app)


@pytest.mark.parametrize(
    ("choice", "status", "message"),
    [
        (lambda ids: [], 422, "Choose at least one test device"),
        (lambda ids: [ids["Bob's phone"]], 422, "one of those is not yours"),
        (lambda ids: [ids["Ann's laptop"], ids["Bob's phone"]], 422, "one of those is not yours"),
        (lambda ids: [999999], 422, "one of those is not yours"),
        (lambda ids: [ids["Ann's old phone"]], 422, "“Ann&#39;s old phone” is gone"),
        (lambda ids: list(range(1, 51)), 422, "Choose at most 10 test devices"),
        (lambda ids: ["laptop"], 422, "not a device number"),
        (lambda ids: ["1.5"], 422, "not a device number"),
        (lambda ids: ["-1"], 422, "not a device number"),
        (lambda ids: ["0"], 422, "not a device number"),
        (lambda ids: ["９"], 422, "not a device number"),  # a full-width digit
        (lambda ids: ["9" * 40], 422, "not a device number"),
        # Leading zeros: short enough at the front, too big whole (once a database error).
        (lambda ids: ["0000000000019999999999999999999"], 422, "not a device number"),
        (lambda ids: ["000000000001" + "0" * 5000], 422, "not a device number"),
        (lambda ids: [f"{2**31}"], 422, "not a device number"),
        (lambda ids: ["019a0b6e-5f2c-7c1e-9a3d-1234567890ab"], 422, "not a device number"),
    ],
    ids=[
        "empty",
        "another-persons",
        "mine-and-another-persons",
        "no-such-device",
        "gone",
        "fifty",
        "word",
        "decimal",
        "negative",
        "zero",
        "full-width",
        "huge",
        "leading-zeros-then-huge",
        "more-digits-than-int-reads",
        "one-past-the-largest-id",
        "a-uuid-from-another-table",
    ],
)
def test_a_bad_choice_is_refused_and_nothing_is_sent(
    app, staff, fake_push, engine, attacker_world, choice, status, message
):
    before = snapshot(engine)
    received = len(fake_push.received())
    response = send(staff, choice(attacker_world))
    assert response.status_code == status
    assert message in response.text
    assert "Which of your test devices" in response.text  # the review page, to choose again
    assert snapshot(engine) == before
    assert len(fake_push.received()) == received


def test_an_integer_from_another_table_names_no_device(app, staff, fake_push, engine):
    """A staff audit row's id, a delivery's: numbers, but no device of this person."""
    register(staff, fake_push, "Laptop")
    with db.begin(app) as session:
        audit_ids = list(session.scalars(sa.select(StaffAudit.id)))
    before = snapshot(engine)
    mine = set(device_ids(app).values())
    others = [i for i in audit_ids if i not in mine][:3]
    assert others
    response = send(staff, others)
    assert response.status_code == 422
    assert "one of those is not yours" in response.text
    assert snapshot(engine) == before


def test_staff_without_the_campaigns_role_cannot_register_or_send(
    app, staff, sign_in, fake_push, engine
):
    register(staff, fake_push, "Laptop")
    (device_id,) = device_ids(app).values()
    people = [
        sign_in(app, f"{role.value}@example.test", role) for role in (Role.ADMIN, Role.COMPLIANCE)
    ]
    before = snapshot(engine)
    for person in people:
        assert person.get("/staff/campaigns/test-devices").status_code == 403
        for url, data in (
            ("/staff/campaigns/test-devices", {"name": "x", "subscription": "{}"}),
            (f"/staff/campaigns/test-devices/{device_id}/rename", {"name": "x"}),
            (f"/staff/campaigns/test-devices/{device_id}/remove", {}),
            ("/staff/campaigns/device-test", {**form_data(), "device": [str(device_id)]}),
        ):
            assert person.post(url, data).status_code == 403
    assert snapshot(engine) == before
    assert fake_push.received() == []


def test_an_invalid_draft_is_refused_before_any_device_is_chosen(app, staff, fake_push, engine):
    register(staff, fake_push, "Laptop")
    before = snapshot(engine)
    response = send(staff, list(device_ids(app).values()), title="")
    assert response.status_code == 422
    assert "Enter a title" in response.text
    assert snapshot(engine) == before
    assert fake_push.received() == []


def test_test_sends_are_rate_limited_per_person(app, staff, sign_in, fake_push, clock, engine):
    register(staff, fake_push, "Laptop")
    ids = list(device_ids(app).values())
    for _ in range(SENDS_PER_WINDOW):
        assert send(staff, ids).status_code == 303
        clock.advance(seconds=1)
    before = snapshot(engine)
    refused = send(staff, ids)
    assert refused.status_code == 429
    # The first of the ten went 10 seconds ago: the next may go 10 minutes after it.
    assert refused.headers["Retry-After"] == str(10 * 60 - SENDS_PER_WINDOW)
    assert f"You have sent {SENDS_PER_WINDOW} tests in the last 10 minutes" in refused.text
    assert snapshot(engine) == before
    assert len(fake_push.received()) == SENDS_PER_WINDOW
    # Someone else is not held back by it.
    other = sign_in(app, "other@example.test")
    register(other, fake_push, "Other laptop")
    assert send(other, [device_ids(app)["Other laptop"]]).status_code == 303
    clock.advance(dt.timedelta(minutes=10))
    assert send(staff, ids).status_code == 303


def test_a_persons_old_answer_pages_go_when_they_send_again(
    app, staff, sign_in, fake_push, clock, monkeypatch
):
    # Thirty days in production; minutes here, so the staff sessions stay open.
    monkeypatch.setattr(testdevices, "SEND_KEPT", dt.timedelta(minutes=5))
    register(staff, fake_push, "Laptop")
    ids = list(device_ids(app).values())
    old = send(staff, ids).headers["Location"]
    other = sign_in(app, "other@example.test")
    register(other, fake_push, "Other laptop")
    others = send(other, [device_ids(app)["Other laptop"]]).headers["Location"]
    clock.advance(dt.timedelta(minutes=5, seconds=1))
    assert staff.get(old).status_code == 200  # kept until the next send
    new = send(staff, ids).headers["Location"]
    assert staff.get(old).status_code == 404
    assert staff.get(new).status_code == 200
    assert other.get(others).status_code == 200  # someone else's are theirs to keep


def test_the_answer_page_is_the_senders_alone(app, staff, sign_in, fake_push):
    register(staff, fake_push, "Laptop")
    location = send(staff, list(device_ids(app).values())).headers["Location"]
    other = sign_in(app, "other@example.test")
    assert other.get(location).status_code == 404
    assert staff.get(location).status_code == 200
    assert (
        staff.get("/staff/campaigns/device-test/019a0b6e-5f2c-7c1e-9a3d-1234567890ab").status_code
        == 404
    )


def test_the_review_page_without_devices_says_how_to_get_one(app, staff):
    html = staff.post("/staff/campaigns/new", {**form_data(), "action": "review"}).text
    assert "You have no test devices yet" in html
    assert (
        '<a href="/staff/campaigns/test-devices" target="_blank" rel="noopener">'
        "Register this browser as a test device (opens in a new tab)</a>"
    ) in html
    assert "Which of your test devices" not in html


def test_a_draft_reviewed_from_its_page_can_be_tested_without_being_launched(
    app, staff, fake_push, engine
):
    sub = register(staff, fake_push, "Laptop")
    saved = staff.post("/staff/campaigns/new", {**form_data(), "action": "save_draft"})
    assert saved.status_code == 303
    (draft,) = all_rows(engine, "campaign_draft")
    fields = {**form_data(), "draft_id": str(draft["id"]), "draft_version": "1"}
    review = staff.post("/staff/campaigns/new", {**fields, "action": "review"}).text
    assert "Which of your test devices" in review
    response = staff.post(
        "/staff/campaigns/device-test",
        {**fields, "device": list(map(str, device_ids(app).values()))},
    )
    assert response.status_code == 303
    page = staff.get(response.headers["Location"]).text
    assert f'<input type="hidden" name="draft_id" value="{draft["id"]}">' in page
    assert len(fake_push.plaintexts(sub)) == 1
    (still,) = all_rows(engine, "campaign_draft")
    assert still["launched_campaign_id"] is None and still["version"] == 1
    assert count_rows(engine, "campaign") == 0


# -- the browser keeps it -----------------------------------------------------------------


def test_the_heartbeat_leaves_a_test_devices_subscription_alone(app, staff, fake_push):
    sub = register(staff, fake_push, "Laptop")
    browser = app.test_client()
    kept = browser.post(
        "/api/push/heartbeat", json={"endpoint": sub.endpoint, "auth": sub.auth_b64}
    )
    assert kept.status_code == 200
    assert kept.json["action"] == "none"
    status = browser.post("/api/push/status", json={"endpoint": sub.endpoint, "auth": sub.auth_b64})
    assert (status.json["status"], status.json["action"]) == ("unknown", "none")
    # Without its secret the endpoint proves nothing: the usual answer for a stranger.
    stranger = browser.post("/api/push/heartbeat", json={"endpoint": sub.endpoint})
    assert stranger.json["action"] == "unsubscribe"
    # A gone device is let go of.
    fake_push.script(sub, 410)
    send(staff, list(device_ids(app).values()))
    gone = browser.post(
        "/api/push/heartbeat", json={"endpoint": sub.endpoint, "auth": sub.auth_b64}
    )
    assert gone.json["action"] == "unsubscribe"


@pytest.mark.parametrize(
    "path",
    ["/staff/campaigns/test-devices", "rename", "remove", "/staff/campaigns/device-test"],
)
def test_every_test_device_form_needs_its_csrf_token(app, staff, fake_push, engine, path):
    register(staff, fake_push, "Laptop")
    (device_id,) = device_ids(app).values()
    if not path.startswith("/"):
        path = f"/staff/campaigns/test-devices/{device_id}/{path}"
    before = snapshot(engine)
    data = {
        **form_data(),
        "name": "Renamed",
        "device": [str(device_id)],
        "subscription": json.dumps(fake_push.subscribe().to_json()),
    }
    for token in (None, "forged"):
        response = staff.client.post(
            path, data={**data, **({"csrf_token": token} if token else {})}
        )
        assert response.status_code == 400
        assert "This form has expired" in response.text
    assert snapshot(engine) == before
    assert fake_push.received() == []


def test_the_audit_page_lists_test_device_actions(app, staff, sign_in, fake_push):
    register(staff, fake_push, "Laptop")
    (device_id,) = device_ids(app).values()
    location = send(staff, [device_id]).headers["Location"]
    send_id = location.rsplit("/", 1)[1]
    admin = sign_in(app, "admin@example.test", Role.ADMIN)
    page = admin.get("/staff/admin/audit?action=test_device.registered")
    assert page.status_code == 200
    assert "Test device registered" in page.text
    assert f"test-device:{device_id}" in page.text
    sent = admin.get("/staff/admin/audit?action=campaign.device_test_sent")
    assert "Campaign test sent to test devices" in sent.text
    assert f"test-send:{send_id}" in sent.text
    assert "Laptop: sent" in sent.text


def test_an_only_device_is_chosen_already_and_several_are_not(app, staff, fake_push):
    register(staff, fake_push, "Laptop")
    (only,) = device_ids(app).values()
    html = staff.post("/staff/campaigns/new", {**form_data(), "action": "review"}).text
    assert f'name="device" value="{only}" checked>' in html
    register(staff, fake_push, "Phone")
    html = staff.post("/staff/campaigns/new", {**form_data(), "action": "review"}).text
    assert 'name="device" value="' in html
    assert "checked>" not in html.split("Which of your test devices")[1].split("</fieldset>")[0]
