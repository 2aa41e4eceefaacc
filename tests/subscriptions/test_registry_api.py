"""Heartbeat, endpoint change and unsubscribe."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from tests.helpers import all_rows

SUBSCRIBE = "/api/push/subscribe"


def _rows(engine):
    return {r["endpoint"]: r for r in all_rows(engine, "push_subscription")}


def test_heartbeat_throttles_last_seen_to_once_an_hour(client, engine, subscriptions, clock):
    sub = subscriptions()
    client.post(SUBSCRIBE, json={"subscription": sub.to_json()})
    first_seen = _rows(engine)[sub.endpoint]["last_seen_at"]

    clock.advance(minutes=59)
    response = client.post("/api/push/heartbeat", json={"endpoint": sub.endpoint})
    assert response.json == {"state": "pending", "action": "none"}
    assert _rows(engine)[sub.endpoint]["last_seen_at"] == first_seen

    clock.advance(minutes=2)
    client.post("/api/push/heartbeat", json={"endpoint": sub.endpoint})
    assert _rows(engine)[sub.endpoint]["last_seen_at"] != first_seen


def test_heartbeat_actions(client, engine, subscriptions, clock):
    sub = subscriptions()
    client.post(SUBSCRIBE, json={"subscription": sub.to_json()})

    def beat():
        return client.post("/api/push/heartbeat", json={"endpoint": sub.endpoint}).json

    def set_row(**values):
        with engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE push_subscription SET " + ", ".join(f"{k} = :{k}" for k in values)),
                values,
            )

    set_row(state="stale")
    assert beat() == {"state": "pending", "action": "none"}  # a sign of life revives it
    set_row(state="stale", last_success_at=clock.now())
    assert beat() == {"state": "active", "action": "none"}
    set_row(expiration_time=clock.now() - dt.timedelta(seconds=1))
    assert beat() == {"state": "expired", "action": "resubscribe"}
    set_row(expiration_time=None, state="expired")
    assert beat() == {"state": "expired", "action": "resubscribe"}
    set_row(state="revoked")
    assert beat() == {"state": "revoked", "action": "unsubscribe"}
    set_row(state="revoked", endpoint=None, p256dh=None, auth_sealed=None, deleted_at=clock.now())
    # A tombstone keeps only the hash: enough to tell the browser to unsubscribe.
    assert beat() == {"state": "revoked", "action": "unsubscribe"}
    unknown = client.post("/api/push/heartbeat", json={"endpoint": subscriptions().endpoint})
    assert unknown.json == {"state": "unknown", "action": "resubscribe"}


def test_heartbeat_refuses_bad_input(client):
    assert client.post("/api/push/heartbeat", json={}).status_code == 400
    assert client.post("/api/push/heartbeat", json={"endpoint": 5}).status_code == 400
    long = client.post("/api/push/heartbeat", json={"endpoint": "https://x/" + "a" * 5000})
    assert long.status_code == 422


def test_change_moves_the_subscriber_and_ends_the_old_endpoint(app, engine, subscriptions):
    browser = app.test_client()
    old = subscriptions()
    browser.post(SUBSCRIBE, json={"subscription": old.to_json()})
    new = subscriptions()
    # The service worker's request, without cookies: the old subscription's auth secret
    # (from event.oldSubscription) proves it holds the old endpoint.
    body = {"oldEndpoint": old.endpoint, "oldAuth": old.auth_b64, "subscription": new.to_json()}
    response = app.test_client().post("/api/push/change", json=body)
    assert response.status_code == 201
    assert response.json["moved"] is True
    rows = _rows(engine)
    assert rows[new.endpoint]["subscriber_id"] == rows[old.endpoint]["subscriber_id"]
    assert rows[old.endpoint]["state"] == "revoked"
    assert rows[old.endpoint]["end_reason"] == "rotated"
    assert rows[old.endpoint]["revoked_at"] is not None
    assert rows[new.endpoint]["state"] == "pending"

    repeat = app.test_client().post("/api/push/change", json=body)
    assert repeat.status_code == 200  # idempotent: same row, same subscriber
    assert repeat.json["id"] == response.json["id"]
    assert len(_rows(engine)) == 2


def test_change_is_one_transaction(app, engine, subscriptions, monkeypatch):
    """A failure after the new row is written but before the old one ends leaves both
    as they were: never both endpoints carrying the subscriber, never neither."""
    from portal.subscriptions import services

    old = subscriptions()
    app.test_client().post(SUBSCRIBE, json={"subscription": old.to_json()})
    before = {t: all_rows(engine, t) for t in ("push_subscription", "subscriber", "consent_event")}

    def broken(*_args, **_kwargs):
        raise RuntimeError("the process died half-way")

    monkeypatch.setattr(services, "end_subscriptions", broken)
    new = subscriptions()
    app.config["PROPAGATE_EXCEPTIONS"] = False
    body = {"oldEndpoint": old.endpoint, "oldAuth": old.auth_b64, "subscription": new.to_json()}
    response = app.test_client().post("/api/push/change", json=body)
    assert response.status_code == 500
    assert before == {t: all_rows(engine, t) for t in before}

    monkeypatch.undo()
    response = app.test_client().post("/api/push/change", json=body)
    assert (response.status_code, response.json["moved"]) == (201, True)


def test_change_from_an_unknown_endpoint_is_refused_and_registers_nothing(
    client, engine, subscriptions
):
    """Answered like an old endpoint this browser cannot prove; the worker then registers
    the new subscription on its own (/api/push/subscribe)."""
    new = subscriptions()
    response = client.post(
        "/api/push/change",
        json={
            "oldEndpoint": "https://fcm.googleapis.com/fcm/send/gone",
            "subscription": new.to_json(),
        },
    )
    assert response.status_code == 403
    assert response.json["error"]["code"] == "not_your_subscription"
    assert _rows(engine) == {}


def test_change_with_a_bad_new_subscription_changes_nothing(client, engine, subscriptions):
    old = subscriptions()
    client.post(SUBSCRIBE, json={"subscription": old.to_json()})
    bad = subscriptions().to_json()
    bad["keys"]["auth"] = "short"
    response = client.post(
        "/api/push/change", json={"oldEndpoint": old.endpoint, "subscription": bad}
    )
    assert response.status_code == 422
    assert response.json["error"]["field"] == "subscription.keys.auth"
    rows = _rows(engine)
    assert list(rows) == [old.endpoint]
    assert rows[old.endpoint]["state"] == "pending"


def _end_by_erasure(app, engine, clock):
    from portal.db import db
    from portal.retention.services import erase_subscriber
    from portal.subscriptions.models import Subscriber

    with db.begin(app) as session:
        (person,) = session.scalars(sa.select(Subscriber.id))
        erase_subscriber(session, person, now=clock.now())


def _end_by_unsubscribe(client, old):
    assert client.post("/api/push/unsubscribe", json={"endpoint": old.endpoint}).status_code == 200


@pytest.mark.parametrize("ending", ["unsubscribed", "erased", "erased after a technical end"])
def test_a_subscription_its_person_ended_is_not_brought_back_by_a_rotation(
    app, client, engine, subscriptions, clock, ending
):
    """The browser still holds the old push subscription (the person ended it from another
    device, or was erased, even after its push service had ended it and it became a
    tombstone); its push service rotates it and the worker asks to move it. Nobody chose
    the new one: 410, and nothing is registered or logged."""
    old = subscriptions()
    subscribed = client.post(SUBSCRIBE, json={"subscription": old.to_json()})
    assert subscribed.status_code == 201
    if ending == "erased after a technical end":
        with engine.begin() as connection:
            connection.execute(
                sa.text(
                    "UPDATE push_subscription SET state = 'revoked', "
                    "end_reason = 'revoked_by_push_service', deleted_at = created_at"
                )
            )
    if ending.startswith("erased"):
        _end_by_erasure(app, engine, clock)
    else:
        _end_by_unsubscribe(client, old)
    clock.advance(seconds=3600)
    before = {t: all_rows(engine, t) for t in ("push_subscription", "subscriber", "consent_event")}
    new = subscriptions()
    for body in (
        {"oldEndpoint": old.endpoint, "subscription": new.to_json()},  # the device cookie
        {"oldEndpoint": old.endpoint, "oldAuth": old.auth_b64, "subscription": new.to_json()},
    ):
        response = client.post("/api/push/change", json=body)
        assert response.status_code == 410, response.json
        assert response.json["error"] == {
            "code": "subscription_ended",
            "message": "this subscription was ended by its person: only their own choice "
            "subscribes again",
            "field": "oldEndpoint",
        }
        assert "Set-Cookie" not in response.headers
    assert before == {t: all_rows(engine, t) for t in before}


@pytest.mark.parametrize("ending", ["unsubscribed", "erased"])
def test_the_worker_cannot_register_anew_a_browser_whose_subscription_its_person_ended(
    app, client, engine, subscriptions, clock, ending
):
    """No old subscription to move (some browsers give none): the worker registers the
    new one alone, with the browser's cookies. When the device cookie names a
    subscription its person ended, that is refused too (410) and nothing is written;
    the person's own subscribe on the page still works."""
    old = subscriptions()
    assert client.post(SUBSCRIBE, json={"subscription": old.to_json()}).status_code == 201
    if ending == "erased":
        _end_by_erasure(app, engine, clock)
    else:
        _end_by_unsubscribe(client, old)
    before = {t: all_rows(engine, t) for t in ("push_subscription", "subscriber", "consent_event")}
    new = subscriptions()
    body = {"subscription": new.to_json(), "source": "service-worker"}
    refused = client.post(SUBSCRIBE, json=body)
    assert refused.status_code == 410
    assert refused.json["error"]["code"] == "subscription_ended"
    assert before == {t: all_rows(engine, t) for t in before}
    chosen = client.post(SUBSCRIBE, json={"subscription": new.to_json()})
    assert chosen.status_code == 201


def test_a_subscription_its_push_service_ended_still_moves_to_the_new_endpoint(
    app, client, engine, subscriptions
):
    """A technical end (the push service answered 410 for the old endpoint) is not the
    person's choice: the rotation that follows it carries the person over."""
    old = subscriptions()
    client.post(SUBSCRIBE, json={"subscription": old.to_json()})
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "UPDATE push_subscription SET state = 'revoked', "
                "end_reason = 'revoked_by_push_service'"
            )
        )
    new = subscriptions()
    response = client.post(
        "/api/push/change", json={"oldEndpoint": old.endpoint, "subscription": new.to_json()}
    )
    assert (response.status_code, response.json["moved"]) == (201, True)
    rows = _rows(engine)
    assert rows[new.endpoint]["subscriber_id"] == rows[old.endpoint]["subscriber_id"]
    assert rows[new.endpoint]["state"] == "pending"


def test_unsubscribe(client, engine, subscriptions):
    sub = subscriptions()
    client.post(SUBSCRIBE, json={"subscription": sub.to_json()})
    response = client.post("/api/push/unsubscribe", json={"endpoint": sub.endpoint})
    assert response.status_code == 200
    assert response.json["state"] == "revoked"
    row = _rows(engine)[sub.endpoint]
    assert row["end_reason"] == "unsubscribed"
    assert client.post("/api/push/unsubscribe", json={"endpoint": sub.endpoint}).status_code == 200
    missing = client.post("/api/push/unsubscribe", json={"endpoint": subscriptions().endpoint})
    assert missing.status_code == 403
    assert missing.json["error"]["code"] == "not_your_subscription"
    # Subscribing again later brings it back to pending (never left revoked by mistake).
    assert client.post(SUBSCRIBE, json={"subscription": sub.to_json()}).json["state"] == "pending"


def test_unsubscribe_records_the_screen_it_came_from_and_only_those_that_call_it(
    client, engine, subscriptions
):
    sub = subscriptions()
    client.post(SUBSCRIBE, json={"subscription": sub.to_json()})
    for source in ("service-worker", "preference-centre", "staff"):
        refused = client.post(
            "/api/push/unsubscribe", json={"endpoint": sub.endpoint, "source": source}
        )
        assert refused.status_code == 422
        assert refused.json["error"]["field"] == "source"
    assert _rows(engine)[sub.endpoint]["state"] == "pending"
    answer = client.post(
        "/api/push/unsubscribe", json={"endpoint": sub.endpoint, "source": "subscribe-page"}
    )
    assert answer.status_code == 200
    with engine.connect() as conn:
        recorded = conn.execute(
            sa.text("SELECT source FROM consent_event WHERE kind = 'unsubscribed'")
        ).scalar_one()
    assert recorded == "subscribe-page"


def test_text_no_column_can_hold_is_refused_as_invalid_text(client, engine, catalogue_ready):
    """JSON may carry "\\ud800" and "\\u0000"; both are refused, naming the field, and
    nothing is written (an unpaired surrogate cannot even be hashed)."""
    endpoint = "https://fcm.googleapis.com/fcm/send/a"
    cases = [
        ("/api/push/heartbeat", {"endpoint": endpoint + "\ud800"}, "endpoint"),
        ("/api/push/unsubscribe", {"endpoint": endpoint + "\udfff"}, "endpoint"),
        ("/api/push/unsubscribe", {"endpoint": endpoint + "\x00"}, "endpoint"),
        (
            "/api/push/receipt",
            {"deliveryId": "d", "event": "shown", "endpoint": "\ud800"},
            "endpoint",
        ),
        (
            "/api/push/preferences",
            {
                "endpoint": endpoint,
                "decisions": [{"slug": "offers", "state": "opt_in"}],
                "policyVersion": "v1\x00",
                "decidedAt": "2025-12-31T00:00:00Z",
            },
            "policyVersion",
        ),
    ]
    before = {
        t: all_rows(engine, t) for t in ("push_subscription", "consent_event", "delivery_receipt")
    }
    for url, body, field in cases:
        response = client.post(url, json=body)
        assert response.status_code == 422, (url, response.json)
        assert response.json["error"] == {
            "code": "invalid_text",
            "message": f"{field} has a NUL or an unpaired surrogate character",
            "field": field,
        }
    assert before == {t: all_rows(engine, t) for t in before}
