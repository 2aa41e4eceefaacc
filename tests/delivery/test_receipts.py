"""POST /api/push/receipt: the service worker's display and click reports.

A receipt is accepted only for a delivery of ours that went to the calling browser: its
device cookie names the delivery's subscription, or it shows that subscription's auth
secret. Anything else — an id that is not a delivery, someone else's delivery, one never
sent — gets the same refusal and writes nothing.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass

import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from portal.db import db
from tests.factories import BrowserSubscription
from tests.helpers import all_rows, count_rows, record_delivery, subscribe_browser

URL = "/api/push/receipt"
REFUSAL = {
    "error": {
        "code": "not_your_delivery",
        "message": "no delivery to this browser has this id",
        "field": "deliveryId",
    }
}


@dataclass
class Browser:
    client: FlaskClient
    sub: BrowserSubscription
    delivery_id: str
    subscription_id: uuid.UUID


@pytest.fixture
def browser(app, clock, subscriptions) -> Browser:
    """A subscribed browser (its cookies in the client) and one delivery sent to it."""
    client = app.test_client()
    sub = subscriptions()
    subscription_id = subscribe_browser(app, client, sub)
    with db.begin(app) as session:
        delivery_id = record_delivery(session, subscription_id, now=clock.now())
    return Browser(client, sub, delivery_id, subscription_id)


def test_a_shown_receipt_from_the_browser_it_went_to_is_recorded_once(browser, engine):
    body = {"deliveryId": browser.delivery_id, "event": "shown", "endpoint": browser.sub.endpoint}
    first = browser.client.post(URL, json=body)
    assert first.status_code == 201
    assert first.json == {"deliveryId": browser.delivery_id, "event": "shown", "recorded": True}
    again = browser.client.post(URL, json=body)
    assert again.status_code == 200
    assert again.json["recorded"] is False
    (row,) = all_rows(engine, "delivery_receipt")
    assert row["delivery_id"] == browser.delivery_id
    assert row["event"] == "shown"
    assert bytes(row["endpoint_hash"]) == hashlib.sha256(browser.sub.endpoint.encode()).digest()


def test_shown_and_clicked_are_separate_facts(browser, engine):
    for event in ("shown", "clicked", "clicked"):
        answer = browser.client.post(URL, json={"deliveryId": browser.delivery_id, "event": event})
        assert answer.status_code in (200, 201)
    rows = all_rows(engine, "delivery_receipt")
    assert sorted(r["event"] for r in rows) == ["clicked", "shown"]
    assert all(r["endpoint_hash"] is None for r in rows)


def _delivery_with_buttons(app, browser, clock, count: int) -> str:
    buttons = [{"action": f"action-{n}", "title": f"Button {n}", "url": "/"} for n in (1, 2)]
    with db.begin(app) as session:
        return record_delivery(
            session, browser.subscription_id, now=clock.now(), actions=buttons[:count] or None
        )


def test_each_button_click_is_a_receipt_of_its_own(app, browser, engine, clock):
    delivery_id = _delivery_with_buttons(app, browser, clock, 2)
    for event in ("shown", "action-1", "action-2", "action-1", "clicked"):
        answer = browser.client.post(URL, json={"deliveryId": delivery_id, "event": event})
        assert answer.status_code in (200, 201)
    rows = all_rows(engine, "delivery_receipt")
    assert sorted(r["event"] for r in rows) == ["action-1", "action-2", "clicked", "shown"]


@pytest.mark.parametrize(("buttons", "refused"), [(0, ["action-1", "action-2"]), (1, ["action-2"])])
def test_a_click_on_a_button_the_notification_never_had_is_refused(
    app, browser, engine, clock, buttons, refused
):
    """Only the browser the delivery went to can report it, and it can report only the
    buttons its notification showed: the funnel never counts a click on a button the
    campaign does not have."""
    delivery_id = _delivery_with_buttons(app, browser, clock, buttons)
    for event in refused:
        answer = browser.client.post(URL, json={"deliveryId": delivery_id, "event": event})
        assert answer.status_code == 422
        assert answer.json["error"] == {
            "code": "no_such_button",
            "message": f"this notification had no button {event}",
            "field": "event",
        }
    assert count_rows(engine, "delivery_receipt") == 0
    if buttons:
        answer = browser.client.post(URL, json={"deliveryId": delivery_id, "event": "action-1"})
        assert answer.status_code == 201


def test_a_receipt_after_its_person_was_erased_is_refused_and_stores_nothing(
    app, browser, engine, clock
):
    """Erasure ends what is collected about the person at once: the browser still holds
    the notification, but its reports are refused like anyone else's."""
    from portal.retention.services import erase_subscriber
    from portal.subscriptions.models import Subscriber

    with db.begin(app) as session:
        (person,) = session.scalars(sa.select(Subscriber.id))
        erase_subscriber(session, person, now=clock.now())
    for event in ("shown", "clicked"):
        for body in (
            {"deliveryId": browser.delivery_id, "event": event},
            {"deliveryId": browser.delivery_id, "event": event, "auth": browser.sub.auth_b64},
        ):
            answer = browser.client.post(URL, json=body)
            assert (answer.status_code, answer.json) == (403, REFUSAL)
    assert count_rows(engine, "delivery_receipt") == 0


def test_a_browser_whose_cookies_were_cleared_proves_it_with_its_auth(app, browser, engine):
    cleared = app.test_client()
    body = {"deliveryId": browser.delivery_id, "event": "shown", "auth": browser.sub.auth_b64}
    assert cleared.post(URL, json=body).status_code == 201
    assert count_rows(engine, "delivery_receipt") == 1


@pytest.mark.parametrize(
    "who",
    ["nobody", "wrong-auth", "other-browser", "unknown-id", "not-a-number", "huge-number"],
)
def test_a_receipt_for_a_delivery_not_sent_to_the_caller_is_refused_alike(
    app, browser, engine, subscriptions, who
):
    caller = app.test_client()
    body = {"deliveryId": browser.delivery_id, "event": "shown"}
    if who == "wrong-auth":
        body["auth"] = subscriptions().auth_b64
    elif who == "other-browser":
        # A browser of its own (its own device cookie), reporting someone else's delivery.
        caller.post("/api/push/subscribe", json={"subscription": subscriptions().to_json()})
        body["endpoint"] = browser.sub.endpoint
    elif who == "unknown-id":
        caller = browser.client
        body["deliveryId"] = str(int(browser.delivery_id) + 1000)
    elif who == "not-a-number":
        caller = browser.client
        body["deliveryId"] = "d-1"
    elif who == "huge-number":
        caller = browser.client
        body["deliveryId"] = "9" * 40
    response = caller.post(URL, json=body)
    assert response.status_code == 403
    assert response.json == REFUSAL
    assert count_rows(engine, "delivery_receipt") == 0


@pytest.mark.parametrize(
    ("status", "answer"),
    [
        ("skipped", 403),  # never sent: over a cap, keys unreadable
        ("revoked", 403),  # never sent: consent ended first, or the service said gone
        ("queued", 201),  # sent once, its answer lost: queued again
        ("sending", 201),  # the push can arrive before the answer is written
        ("failed", 201),  # a timeout after the service took it
        ("accepted", 201),
    ],
)
def test_a_receipt_for_a_delivery_never_sent_is_refused(app, browser, engine, status, answer):
    """No browser can have shown a delivery that was never sent: the funnel would count it
    where nothing could show."""
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE delivery SET status = :status WHERE id = :id"),
            {"status": status, "id": int(browser.delivery_id)},
        )
    response = browser.client.post(URL, json={"deliveryId": browser.delivery_id, "event": "shown"})
    assert response.status_code == answer
    if answer == 403:
        assert response.json == REFUSAL
    assert count_rows(engine, "delivery_receipt") == (answer == 201)


@pytest.mark.parametrize("campaign_status", ["cancelled", "expired"])
def test_a_receipt_for_a_delivery_its_ended_campaign_left_queued_is_refused(
    app, browser, engine, campaign_status
):
    """Queued when its campaign was cancelled (or expired) and never sent: refused at
    once, as it is once the dispatcher has marked it skipped (portal/campaigns/unsent.py)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE delivery SET status = 'queued', attempts = 0 WHERE id = :id"),
            {"id": int(browser.delivery_id)},
        )
        conn.execute(
            sa.text(
                "UPDATE campaign SET status = :status WHERE id = "
                "(SELECT campaign_id FROM delivery WHERE id = :id)"
            ),
            {"status": campaign_status, "id": int(browser.delivery_id)},
        )
    response = browser.client.post(URL, json={"deliveryId": browser.delivery_id, "event": "shown"})
    assert (response.status_code, response.json) == (403, REFUSAL)
    assert count_rows(engine, "delivery_receipt") == 0


def test_the_first_receipt_is_the_real_one(app, browser, engine, subscriptions):
    """Nobody can take a receipt's place before the browser sends it."""
    intruder = app.test_client()
    intruder.post("/api/push/subscribe", json={"subscription": subscriptions().to_json()})
    for event in ("shown", "clicked"):
        refused = intruder.post(URL, json={"deliveryId": browser.delivery_id, "event": event})
        assert refused.status_code == 403
    real = browser.client.post(URL, json={"deliveryId": browser.delivery_id, "event": "shown"})
    assert (real.status_code, real.json["recorded"]) == (201, True)


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"event": "shown"}, 400, "deliveryId"),
        ({"deliveryId": 7, "event": "shown"}, 400, "deliveryId"),
        ({"deliveryId": "not an id!", "event": "shown"}, 422, "deliveryId"),
        ({"deliveryId": "x" * 65, "event": "shown"}, 422, "deliveryId"),
        ({"deliveryId": "1"}, 400, "event"),
        ({"deliveryId": "1", "event": "accepted"}, 422, "event"),
        ({"deliveryId": "1", "event": "action-3"}, 422, "event"),
        ({"deliveryId": "1", "event": "shown", "endpoint": 3}, 400, "endpoint"),
        ({"deliveryId": "1", "event": "shown", "endpoint": "e" * 5000}, 422, "endpoint"),
        ({"deliveryId": "1", "event": "shown", "auth": "short"}, 422, "auth"),
    ],
)
def test_bad_receipts_are_refused_and_write_nothing(browser, engine, body, status, field):
    response = browser.client.post(URL, json=body)
    assert response.status_code == status
    assert response.json["error"]["field"] == field
    assert count_rows(engine, "delivery_receipt") == 0


def test_receipts_obey_the_api_rules(browser, engine, settings):
    client = browser.client
    not_json = client.post(URL, data="deliveryId=1", content_type="text/plain")
    assert not_json.status_code == 415
    big = "x" * (settings.api_max_body_bytes + 1)
    too_big = client.post(URL, data=big, content_type="application/json")
    assert too_big.status_code == 413
    cross = client.post(
        URL,
        json={"deliveryId": browser.delivery_id, "event": "shown"},
        headers={"Origin": "https://elsewhere.example"},
    )
    assert cross.status_code == 403
    assert count_rows(engine, "delivery_receipt") == 0


def test_one_write_transaction_per_receipt_and_none_for_a_refusal(app, browser, engine):
    commits: list[int] = []

    def count(_connection: object) -> None:
        commits.append(1)

    sa.event.listen(engine, "commit", count)
    try:
        body = {"deliveryId": browser.delivery_id, "event": "shown"}
        assert browser.client.post(URL, json=body).status_code == 201
        assert len(commits) == 1
        assert app.test_client().post(URL, json=body).status_code == 403
        assert len(commits) == 1
    finally:
        sa.event.remove(engine, "commit", count)
