"""Spellings of one push resource at the API: stored once, in canonical form, and every
route that names an endpoint finds that one row whichever spelling it is given."""

from __future__ import annotations

import hashlib
import uuid

import sqlalchemy as sa

from portal.db import db
from portal.subscriptions.validation import endpoint_hash
from tests.helpers import all_rows, record_delivery

SUBSCRIBE = "/api/push/subscribe"
TOKEN = "dGVzdC10b2tlbi1vbmU:APA91bHk-x_y"
CANONICAL = f"https://fcm.googleapis.com/fcm/send/{TOKEN}"
# Issue 13, item 2: each of these registered a subscription of its own.
FIVE = [
    f"HTTPS://FCM.GoogleAPIs.com/fcm/send/{TOKEN}",
    f"https://fcm.googleapis.com:443/fcm/send/{TOKEN}",
    f"https://fcm.googleapis.com:0443/fcm/send/{TOKEN}",
    f"https://fcm.googleapis.com/fcm/send/{TOKEN}?",
    f"https://fcm.googleapis.com/fcm/send/{TOKEN}#fragment",
]
LOOKUP = f"HTTPS://fcm.GOOGLEAPIS.com.:443/fcm/send/{TOKEN}#f"


def _subscription(subscriptions, endpoint):
    sub = subscriptions()
    sub.endpoint = endpoint
    return sub


def _live_rows(engine):
    return [r for r in all_rows(engine, "push_subscription") if r["deleted_at"] is None]


def test_five_spellings_of_one_resource_are_one_subscription(client, engine, subscriptions):
    answers = [
        client.post(SUBSCRIBE, json={"subscription": _subscription(subscriptions, e).to_json()})
        for e in FIVE
    ]
    assert [a.status_code for a in answers] == [201, 200, 200, 200, 200]
    assert len({a.json["id"] for a in answers}) == 1
    (row,) = _live_rows(engine)
    assert row["endpoint"] == CANONICAL
    assert bytes(row["endpoint_hash"]) == endpoint_hash(CANONICAL)
    assert bytes(row["endpoint_hash"]) == hashlib.sha256(CANONICAL.encode()).digest()
    assert row["push_service"] == "fcm"


def test_every_route_naming_an_endpoint_finds_the_row_by_any_spelling(
    app, client, engine, subscriptions, catalogue_ready, clock
):
    sub = _subscription(subscriptions, CANONICAL)
    subscribed = client.post(SUBSCRIBE, json={"subscription": sub.to_json()})
    assert subscribed.status_code == 201
    with db.begin(app) as session:
        delivery_id = record_delivery(session, uuid.UUID(subscribed.json["id"]), now=clock.now())

    beat = client.post("/api/push/heartbeat", json={"endpoint": LOOKUP})
    assert beat.json == {"state": "pending", "action": "none"}

    saved = client.post(
        "/api/push/preferences",
        json={
            "endpoint": LOOKUP,
            "decisions": [{"slug": "weekly-digest", "state": "opt_out"}],
            "policyVersion": "v1",
            "decidedAt": clock.now().isoformat(),
        },
    )
    assert saved.status_code == 200, saved.json
    assert {p["slug"]: p["state"] for p in saved.json["preferences"]}["weekly-digest"] == "opt_out"

    receipt = client.post(
        "/api/push/receipt", json={"deliveryId": delivery_id, "event": "shown", "endpoint": LOOKUP}
    )
    assert receipt.status_code == 201
    (stored,) = all_rows(engine, "delivery_receipt")
    assert bytes(stored["endpoint_hash"]) == endpoint_hash(CANONICAL)

    gone = client.post("/api/push/unsubscribe", json={"endpoint": LOOKUP})
    assert gone.status_code == 200, gone.json
    (row,) = _live_rows(engine)
    assert (row["state"], row["end_reason"]) == ("revoked", "unsubscribed")


def test_change_finds_the_old_endpoint_by_any_spelling(client, engine, subscriptions):
    old = _subscription(subscriptions, CANONICAL)
    assert client.post(SUBSCRIBE, json={"subscription": old.to_json()}).status_code == 201
    new = subscriptions()
    changed = client.post(
        "/api/push/change", json={"oldEndpoint": LOOKUP, "subscription": new.to_json()}
    )
    assert changed.status_code == 201, changed.json
    assert changed.json["moved"] is True
    rows = {r["endpoint"]: r for r in all_rows(engine, "push_subscription")}
    assert set(rows) == {CANONICAL, new.endpoint}
    assert rows[CANONICAL]["end_reason"] == "rotated"
    assert rows[new.endpoint]["subscriber_id"] == rows[CANONICAL]["subscriber_id"]


def test_a_new_subscription_spelled_differently_is_stored_canonical(client, engine, subscriptions):
    sub = _subscription(subscriptions, FIVE[0])
    assert client.post(SUBSCRIBE, json={"subscription": sub.to_json()}).status_code == 201
    with engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT endpoint FROM push_subscription")).scalar_one()
    assert stored == CANONICAL


def test_a_row_stored_before_endpoints_were_canonical_is_still_found_by_its_text(
    client, engine, subscriptions, clock
):
    """A tombstone keeps the hash of the exact text it was stored with: the browser that
    still holds that endpoint is told to drop it, never to subscribe again."""
    legacy = "https://wns2-by3p.notify.windows.com/w/?token=BQYAAAB%2bq%2fz%3d"
    sub = _subscription(subscriptions, legacy)
    assert client.post(SUBSCRIBE, json={"subscription": sub.to_json()}).status_code == 201
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE push_subscription SET endpoint = NULL, p256dh = NULL, "
                "auth_sealed = NULL, state = 'revoked', end_reason = 'erased', "
                "deleted_at = :now, endpoint_hash = :h"
            ),
            {"now": clock.now(), "h": hashlib.sha256(legacy.encode()).digest()},
        )
    beat = client.post("/api/push/heartbeat", json={"endpoint": legacy})
    assert beat.json == {"state": "revoked", "action": "unsubscribe"}
