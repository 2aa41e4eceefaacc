"""An endpoint is an address, not a password (SPEC §4).

Every endpoint-keyed route acts only for the browser that holds the subscription: the
device cookie naming its row, or the subscription's own auth secret. Someone who knows
an endpoint and nothing else is refused, learns nothing (the same answer as for an
endpoint nobody registered) and changes nothing.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa

from tests.factories import BrowserSubscription
from tests.helpers import all_rows, csrf_token
from tests.subscriptions.support import (
    SUBSCRIBE,
    WRONG_AUTH,
    Holder,
    put_in_state,
    set_subscription,
    snapshot,
)


@pytest.fixture
def victim(holder: Holder) -> Holder:
    """A person who subscribed from their browser and chose a topic."""
    return holder


def _other_keys(sub: BrowserSubscription, subscriptions) -> dict[str, Any]:
    """The victim's endpoint with keys of the attacker's own."""
    mine = subscriptions()
    return {**mine.to_json(), "endpoint": sub.endpoint}


def _assert_refused(response, field: str) -> None:
    assert response.status_code == 403, response.json
    assert response.json == {
        "error": {
            "code": "not_your_subscription",
            "message": "this browser has not shown that it holds this subscription",
            "field": field,
        }
    }
    assert response.headers.getlist("Set-Cookie") == []


# --- subscribe ------------------------------------------------------------------------


def test_a_cookieless_subscribe_naming_a_known_endpoint_with_other_keys_is_refused(
    app, engine, victim, subscriptions
):
    before = snapshot(engine)
    attacker = app.test_client()
    response = attacker.post(
        SUBSCRIBE, json={"subscription": _other_keys(victim.sub, subscriptions)}
    )
    _assert_refused(response, "subscription.endpoint")
    assert snapshot(engine) == before  # keys, subscriber, state: all as they were
    # And nothing of the person is reachable with what the attacker holds.
    assert "Weekly Digest" not in attacker.get("/preferences").text


def test_a_subscribe_naming_a_known_endpoint_cannot_move_it_to_another_subscriber(
    app, engine, victim, subscriptions
):
    attacker = app.test_client()
    assert (
        attacker.post(SUBSCRIBE, json={"subscription": subscriptions().to_json()}).status_code
        == 201
    )
    before = snapshot(engine)
    response = attacker.post(
        SUBSCRIBE, json={"subscription": _other_keys(victim.sub, subscriptions)}
    )
    _assert_refused(response, "subscription.endpoint")
    assert snapshot(engine) == before


def test_a_subscribe_with_only_the_endpoint_and_no_device_cookie_cannot_revive_a_tombstone(
    app, engine, victim, subscriptions, clock
):
    """A tombstone keeps no auth secret: only its own browser's device cookie speaks for it."""
    page = victim.client.get("/preferences/erase")
    victim.client.post(
        "/preferences/erase", data={"csrf_token": csrf_token(page.text), "confirm": "yes"}
    )
    before = snapshot(engine)
    response = app.test_client().post(
        SUBSCRIBE, json={"subscription": _other_keys(victim.sub, subscriptions)}
    )
    _assert_refused(response, "subscription.endpoint")
    assert snapshot(engine) == before


def test_the_same_browser_after_clearing_its_cookies_proves_itself_with_its_auth(
    app, engine, victim
):
    """A re-subscribe with the subscription's own keys is its browser: it gets the same
    row, the same subscriber and its cookies back."""
    cleared = app.test_client()
    response = cleared.post(SUBSCRIBE, json={"subscription": victim.sub.to_json()})
    assert response.status_code == 200
    assert {c.split("=", 1)[0] for c in response.headers.getlist("Set-Cookie")} == {
        "portal_subscriber",
        "portal_device",
    }
    (row,) = all_rows(engine, "push_subscription")
    assert str(row["id"]).replace("-", "") == response.json["id"].replace("-", "")
    assert len(all_rows(engine, "subscriber")) == 1
    assert "Weekly Digest" in cleared.get("/preferences").text


def test_the_device_cookie_lets_its_browser_register_new_keys_for_its_endpoint(
    engine, victim, subscriptions
):
    renewed = _other_keys(victim.sub, subscriptions)
    response = victim.client.post(SUBSCRIBE, json={"subscription": renewed})
    assert response.status_code == 200
    (row,) = all_rows(engine, "push_subscription")
    assert row["p256dh"] == renewed["keys"]["p256dh"]


def test_a_device_cookie_for_another_row_proves_nothing(app, engine, victim, subscriptions):
    attacker = app.test_client()
    attacker.post(SUBSCRIBE, json={"subscription": subscriptions().to_json()})
    before = snapshot(engine)
    response = attacker.post("/api/push/unsubscribe", json={"endpoint": victim.sub.endpoint})
    _assert_refused(response, "endpoint")
    assert snapshot(engine) == before


# --- change, preferences, unsubscribe: refused alike for unknown and unproven ----------


def _preferences(endpoint: str, **extra: Any) -> dict[str, Any]:
    return {
        "endpoint": endpoint,
        "decisions": [{"slug": "offers", "state": "opt_in"}],
        "policyVersion": "v1",
        "decidedAt": "2025-12-31T23:00:00Z",
        **extra,
    }


def _requests(endpoint: str, subscriptions) -> dict[str, tuple[str, dict[str, Any], str]]:
    fresh = subscriptions().to_json()
    return {
        "change": (
            "/api/push/change",
            {"oldEndpoint": endpoint, "subscription": fresh},
            "oldEndpoint",
        ),
        "preferences": ("/api/push/preferences", _preferences(endpoint), "endpoint"),
        "unsubscribe": ("/api/push/unsubscribe", {"endpoint": endpoint}, "endpoint"),
    }


ROUTES = ["change", "preferences", "unsubscribe"]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("auth", [None, WRONG_AUTH], ids=["no-proof", "wrong-auth"])
def test_knowing_the_endpoint_alone_is_refused_and_changes_nothing(
    app, engine, victim, subscriptions, route, auth
):
    url, body, field = _requests(victim.sub.endpoint, subscriptions)[route]
    if auth is not None:
        body["oldAuth" if route == "change" else "auth"] = auth
    before = snapshot(engine)
    response = app.test_client().post(url, json=body)
    _assert_refused(response, field)
    assert snapshot(engine) == before


@pytest.mark.parametrize("route", ROUTES)
def test_an_unproven_endpoint_answers_as_one_nobody_registered(
    app, engine, victim, subscriptions, route
):
    known = _requests(victim.sub.endpoint, subscriptions)[route]
    unknown = _requests(subscriptions().endpoint, subscriptions)[route]
    before = snapshot(engine)
    first = app.test_client().post(known[0], json=known[1])
    second = app.test_client().post(unknown[0], json=unknown[1])
    assert (first.status_code, first.json) == (second.status_code, second.json)
    assert first.status_code == 403
    assert snapshot(engine) == before


@pytest.mark.parametrize("route", ROUTES)
def test_the_browser_that_holds_the_subscription_is_served(
    app, engine, victim, subscriptions, route
):
    url, body, _field = _requests(victim.sub.endpoint, subscriptions)[route]
    # Its device cookie...
    assert victim.client.post(url, json=body).status_code in (200, 201)


@pytest.mark.parametrize("route", ROUTES)
def test_a_browser_whose_cookies_were_cleared_is_served_on_its_auth(
    app, engine, victim, subscriptions, route
):
    url, body, _field = _requests(victim.sub.endpoint, subscriptions)[route]
    body["oldAuth" if route == "change" else "auth"] = victim.sub.auth_b64
    assert app.test_client().post(url, json=body).status_code in (200, 201)


@pytest.mark.parametrize("route", ROUTES)
def test_a_malformed_auth_is_refused_for_what_it_is(app, victim, subscriptions, route):
    url, body, _field = _requests(victim.sub.endpoint, subscriptions)[route]
    name = "oldAuth" if route == "change" else "auth"
    body[name] = "not base64url!"
    response = app.test_client().post(url, json=body)
    assert response.status_code == 422
    assert response.json["error"]["field"] == name


def test_a_refused_change_registers_nothing_and_ends_nothing(app, engine, victim, subscriptions):
    fresh = subscriptions()
    response = app.test_client().post(
        "/api/push/change",
        json={"oldEndpoint": victim.sub.endpoint, "subscription": fresh.to_json()},
    )
    _assert_refused(response, "oldEndpoint")
    rows = all_rows(engine, "push_subscription")
    assert [r["endpoint"] for r in rows] == [victim.sub.endpoint]
    assert rows[0]["state"] == "pending"


def test_a_change_to_an_endpoint_someone_else_holds_is_refused(app, engine, victim, subscriptions):
    """Proving the old subscription does not make the caller the holder of the new one."""
    attacker = app.test_client()
    mine = subscriptions()
    attacker.post(SUBSCRIBE, json={"subscription": mine.to_json()})
    before = snapshot(engine)
    response = attacker.post(
        "/api/push/change",
        json={
            "oldEndpoint": mine.endpoint,
            "subscription": _other_keys(victim.sub, subscriptions),
        },
    )
    _assert_refused(response, "subscription.endpoint")
    assert snapshot(engine) == before


def test_the_preferences_answer_reveals_nothing_without_proof(app, victim):
    response = app.test_client().post(
        "/api/push/preferences", json=_preferences(victim.sub.endpoint)
    )
    assert "preferences" not in response.json
    assert "weekly-digest" not in response.get_data(as_text=True)


# --- heartbeat --------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["stale", "revoked", "tombstone"])
@pytest.mark.parametrize(
    ("caller", "action"), [("stranger", "unsubscribe"), ("subscriber", "resubscribe")]
)
def test_a_heartbeat_without_proof_neither_reveals_nor_changes_the_subscription(
    app, engine, victim, subscriptions, clock, state, caller, action
):
    """The answer depends on the caller's own cookies, never on the endpoint: a browser
    of someone the portal knows is told to renew, any other to let go."""
    attacker = app.test_client()
    if caller == "subscriber":  # a person with a subscription of their own
        attacker.post(SUBSCRIBE, json={"subscription": subscriptions().to_json()})
    put_in_state(engine, state, clock.now() - dt.timedelta(days=40))
    before = snapshot(engine)
    answer = attacker.post("/api/push/heartbeat", json={"endpoint": victim.sub.endpoint})
    guessed = attacker.post(
        "/api/push/heartbeat", json={"endpoint": victim.sub.endpoint, "auth": WRONG_AUTH}
    )
    nobody = attacker.post("/api/push/heartbeat", json={"endpoint": subscriptions().endpoint})
    assert answer.status_code == guessed.status_code == nobody.status_code == 200
    assert answer.json == guessed.json == nobody.json == {"state": "unknown", "action": action}
    # Not revived, not seen, not marked as told: the person's state is theirs.
    assert snapshot(engine) == before


def test_a_heartbeat_with_proof_gets_the_real_answer(app, engine, victim, clock):
    long_ago = clock.now() - dt.timedelta(days=40)
    set_subscription(engine, state="stale", last_seen_at=long_ago)
    by_auth = app.test_client().post(
        "/api/push/heartbeat", json={"endpoint": victim.sub.endpoint, "auth": victim.sub.auth_b64}
    )
    assert by_auth.json == {"state": "pending", "action": "none"}
    set_subscription(engine, state="revoked")
    by_cookie = victim.client.post("/api/push/heartbeat", json={"endpoint": victim.sub.endpoint})
    assert by_cookie.json == {"state": "revoked", "action": "unsubscribe"}
    (row,) = all_rows(engine, "push_subscription")
    assert row["browser_told_at"] is not None


# --- erasure ----------------------------------------------------------------------------


def test_knowing_an_endpoint_does_not_let_anyone_erase_the_person(
    app, engine, victim, subscriptions
):
    attacker = app.test_client()
    attacker.post(SUBSCRIBE, json={"subscription": _other_keys(victim.sub, subscriptions)})
    page = attacker.get("/preferences/erase")
    response = attacker.post(
        "/preferences/erase",
        data={
            "csrf_token": csrf_token(page.text) if "csrf_token" in page.text else "",
            "confirm": "yes",
        },
    )
    assert response.status_code in (400, 403)
    with engine.connect() as conn:
        erased = conn.execute(sa.text("SELECT erased_at FROM subscriber")).scalars().all()
    assert erased == [None]
    assert victim.client.get("/preferences").status_code == 200
    assert "Weekly Digest" in victim.client.get("/preferences").text


def test_an_erased_browser_keeps_its_device_cookie_and_is_told_to_drop_its_subscription(
    app, engine, victim
):
    page = victim.client.get("/preferences/erase")
    done = victim.client.post(
        "/preferences/erase", data={"csrf_token": csrf_token(page.text), "confirm": "yes"}
    )
    assert done.status_code == 303
    beat = victim.client.post("/api/push/heartbeat", json={"endpoint": victim.sub.endpoint})
    assert beat.json == {"state": "revoked", "action": "unsubscribe"}
    (row,) = all_rows(engine, "push_subscription")
    assert row["browser_told_at"] is not None
