"""``POST /api/push/status``: what the server holds for this browser's subscription.

A page asks it on load to say the truth (receiving, stopped, erased, expired, unknown).
Only the browser that holds the subscription hears its state; someone who knows the
endpoint and nothing else hears ``unknown``, as for an endpoint nobody registered, and
changes nothing. No answer ever names a person or a topic.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa

from portal.identity import preference_link_token
from tests.helpers import all_rows, csrf_token
from tests.subscriptions.support import (
    SUBSCRIBE,
    WRONG_AUTH,
    put_in_state,
    set_subscription,
    snapshot,
)

STATUS = "/api/push/status"


@pytest.fixture
def subscribed(client, subscriptions, catalogue_ready):
    """The test client as a browser that subscribed (cookies set)."""
    sub = subscriptions()
    assert client.post(SUBSCRIBE, json={"subscription": sub.to_json()}).status_code == 201
    return sub


def test_the_holder_hears_each_state_of_its_subscription(engine, holder, clock):
    browser, sub = holder.client, holder.sub

    def status(**body: Any) -> dict[str, Any]:
        response = browser.post(STATUS, json={"endpoint": sub.endpoint, **body})
        assert response.status_code == 200, response.json
        assert response.headers["Cache-Control"] == "no-store"
        return response.json

    assert status() == {"status": "receiving", "action": "none"}
    assert status(auth=sub.auth_b64) == {"status": "receiving", "action": "none"}
    set_subscription(engine, state="stale")
    assert status() == {"status": "receiving", "action": "none"}  # a sign of life revives it
    (row,) = all_rows(engine, "push_subscription")
    assert row["state"] == "pending"
    set_subscription(engine, expiration_time=clock.now() - dt.timedelta(seconds=1))
    assert status() == {"status": "expired", "action": "resubscribe"}
    set_subscription(
        expiration_time=None, state="revoked", end_reason="unsubscribed", engine=engine
    )
    assert status() == {"status": "stopped", "action": "unsubscribe"}
    (row,) = all_rows(engine, "push_subscription")
    assert row["browser_told_at"] is not None  # the browser was told to let go
    set_subscription(
        engine,
        state="revoked",
        end_reason="erased",
        endpoint=None,
        p256dh=None,
        auth_sealed=None,
        deleted_at=clock.now(),
    )
    # A tombstone keeps no auth secret: its device cookie alone speaks for it.
    assert status() == {"status": "erased", "action": "unsubscribe"}


def test_stopping_this_device_in_the_preference_centre_is_said_at_once(client, engine, subscribed):
    html = client.get("/preferences").text
    assert 'data-device-status="receiving"' in html
    assert client.post(STATUS, json={"endpoint": subscribed.endpoint}).json["status"] == (
        "receiving"
    )
    client.post("/preferences/stop-device", data={"csrf_token": csrf_token(html)})
    answer = client.post(STATUS, json={"endpoint": subscribed.endpoint})
    assert answer.json == {"status": "stopped", "action": "unsubscribe"}
    # Without JavaScript the pages say it too, from the device cookie.
    assert 'data-device-status="not-receiving"' in client.get("/preferences").text
    index = client.get("/").text
    assert 'data-server-status="stopped"' in index
    assert "Notifications are stopped in this browser" in index


def test_erasure_is_said_at_once_and_the_answer_page_tells_the_browser(client, engine, subscribed):
    page = client.get("/preferences/erase").text
    answer = client.post(
        "/preferences/erase", data={"csrf_token": csrf_token(page), "confirm": "yes"}
    )
    assert (answer.status_code, answer.location) == (303, "/preferences/erased")
    erased = client.get(answer.location)
    assert erased.status_code == 200
    assert 'data-device-status="not-receiving"' in erased.text
    assert "We send nothing to this browser any more." in erased.text
    # The device cookie stays and names the tombstone.
    answer = client.post(STATUS, json={"endpoint": subscribed.endpoint})
    assert answer.json == {"status": "erased", "action": "unsubscribe"}
    index = client.get("/").text
    assert 'data-server-status="erased"' in index
    assert "Your data was erased" in index


@pytest.mark.parametrize("state", ["pending", "stale", "revoked", "tombstone"])
@pytest.mark.parametrize("caller", ["stranger", "subscriber"])
def test_an_endpoint_alone_learns_nothing_and_changes_nothing(
    app, engine, holder, subscriptions, clock, state, caller
):
    """The attacker who knows an endpoint: with no proof, a wrong auth secret, or a
    device cookie of their own, the answer is the one for an endpoint nobody registered,
    and not a byte of the database changes (nothing revived, seen or marked as told)."""
    sub = holder.sub
    attacker = app.test_client()
    if caller == "subscriber":  # someone with a subscription (and cookies) of their own
        attacker.post(SUBSCRIBE, json={"subscription": subscriptions().to_json()})
    put_in_state(engine, state, clock.now() - dt.timedelta(days=40), end_reason="erased")
    before = snapshot(engine)
    nobody = attacker.post(STATUS, json={"endpoint": subscriptions().endpoint})
    for body in (
        {"endpoint": sub.endpoint},
        {"endpoint": sub.endpoint, "auth": WRONG_AUTH},
    ):
        answer = attacker.post(STATUS, json=body)
        assert answer.status_code == 200
        assert answer.json == nobody.json == {"status": "unknown", "action": "unsubscribe"}
        text = answer.get_data(as_text=True)
        assert "weekly-digest" not in text
        for row in before["subscriber"]:
            assert str(row["id"]) not in text
        assert answer.headers.getlist("Set-Cookie") == []
    assert snapshot(engine) == before


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({}, 400, "endpoint"),
        ({"endpoint": 5}, 400, "endpoint"),
        ({"endpoint": None}, 400, "endpoint"),
        ({"endpoint": "https://fcm.googleapis.com/x", "auth": 7}, 400, "auth"),
        ({"endpoint": "https://fcm.googleapis.com/x", "auth": "not base64!"}, 422, "auth"),
        ({"endpoint": "https://fcm.googleapis.com/x", "auth": "AAAA"}, 422, "auth"),
        ({"endpoint": "https://x/" + "a" * 5000}, 422, "endpoint"),
        ({"endpoint": "https://fcm.googleapis.com/\u0000"}, 422, "endpoint"),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(client, engine, holder, body, status, field):
    before = snapshot(engine)
    response = client.post(STATUS, json=body)
    assert response.status_code == status, response.json
    assert response.json["error"]["field"] == field
    assert snapshot(engine) == before


def test_not_json_and_cross_site_are_refused(client):
    assert client.post(STATUS, data="endpoint=x").status_code == 415
    assert client.post(STATUS, data="{", content_type="application/json").status_code == 400
    cross = client.post(
        STATUS, json={"endpoint": "https://fcm.googleapis.com/x"}, headers={"Origin": "null"}
    )
    assert cross.status_code == 403
    assert client.get(STATUS).status_code == 405


def test_a_preference_link_in_someone_elses_browser_does_not_show_that_browser_as_theirs(
    app, engine, subscribed, subscriptions
):
    """The browser holds a subscription of its own person; the link's person is shown
    their choices, but this browser's subscription is neither said to be theirs nor
    asked about for them."""
    with engine.connect() as conn:
        (person,) = conn.execute(sa.text("SELECT id FROM subscriber")).scalars()
    other = app.test_client()
    own = subscriptions()
    assert other.post(SUBSCRIBE, json={"subscription": own.to_json()}).status_code == 201
    with app.test_request_context():
        token = preference_link_token(person)
    other.get(f"/preferences?token={token}")
    html = other.get("/preferences").text
    assert "topic-offers" in html  # the link's person's centre
    assert "data-device-status" not in html
    assert "This device does not get your notifications" in html
    assert '<div data-device-says="receiving" hidden>' in html  # no stop offered
