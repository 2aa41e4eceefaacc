"""Re-registration never downgrades a subscription's state (seed 000 §6)."""

from __future__ import annotations

import datetime as dt
import os

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric import ec

from portal.seams import current_portal
from tests.helpers import all_rows

URL = "/api/push/subscribe"
STATES = ["pending", "active", "stale", "expired", "revoked"]


def _expected(stored: str, *, had_success: bool) -> str:
    if stored in ("revoked", "expired"):
        return "pending"
    if stored == "stale":
        return "active" if had_success else "pending"
    return stored


def _set(engine, **values):
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE push_subscription SET " + ", ".join(f"{k} = :{k}" for k in values)),
            values,
        )


REREGISTRATIONS = [
    "same-keys",
    "new-keys",
    "after-success",
    "from-tombstone",
    "other-browser-identity",
]


@pytest.mark.parametrize("stored", STATES)
@pytest.mark.parametrize("reregistration", REREGISTRATIONS)
def test_reregistration_never_downgrades(app, engine, subscriptions, clock, stored, reregistration):
    client = app.test_client()
    sub = subscriptions()
    first = client.post(URL, json={"subscription": sub.to_json()})
    assert first.status_code == 201
    had_success = reregistration == "after-success"
    when = clock.now() - dt.timedelta(days=3)
    _set(
        engine,
        state=stored,
        consecutive_failures=2,
        last_success_at=when if had_success else None,
        revoked_at=when if stored == "revoked" else None,
        deleted_at=when if reregistration == "from-tombstone" else None,
    )
    if reregistration == "new-keys":
        sub.auth = os.urandom(16)
    if reregistration == "other-browser-identity":
        client = app.test_client()  # no cookie: a different browser profile's request
    clock.advance(hours=2)

    again = client.post(URL, json={"subscription": sub.to_json()})

    assert again.status_code == 200
    assert again.json["inserted"] is False
    assert again.json["id"] == first.json["id"]
    expected = _expected(stored, had_success=had_success)
    assert again.json["state"] == expected
    (row,) = all_rows(engine, "push_subscription")
    assert row["state"] == expected
    assert row["consecutive_failures"] == 0
    assert row["deleted_at"] is None  # a tombstone is resurrected, never collided with
    assert row["revoked_at"] is None
    assert row["auth_sealed"] is not None


def test_reregistration_refreshes_keys_and_last_seen(app, engine, subscriptions, clock):
    client = app.test_client()
    sub = subscriptions()
    client.post(URL, json={"subscription": sub.to_json()})
    (before,) = all_rows(engine, "push_subscription")
    clock.advance(hours=5)
    sub.auth = os.urandom(16)
    sub.private_key = ec.generate_private_key(ec.SECP256R1())  # a new p256dh as well
    client.post(URL, json={"subscription": sub.to_json()}, headers={"User-Agent": "Firefox/140"})
    (after,) = all_rows(engine, "push_subscription")
    assert bytes(after["auth_sealed"]) != bytes(before["auth_sealed"])
    assert after["p256dh"] == sub.p256dh != before["p256dh"]
    assert after["user_agent"] == "Firefox/140"
    assert str(after["last_seen_at"]) > str(before["last_seen_at"])
    portal = current_portal(app)
    assert portal.keys.open(bytes(after["auth_sealed"]), after["auth_key_version"]) == sub.auth


def test_existing_subscriber_is_kept_when_none_is_given(app, engine, subscriptions):
    sub = subscriptions()
    app.test_client().post(URL, json={"subscription": sub.to_json()})
    (first,) = all_rows(engine, "push_subscription")
    app.test_client().post(URL, json={"subscription": sub.to_json()})  # no cookie
    (second,) = all_rows(engine, "push_subscription")
    assert second["subscriber_id"] == first["subscriber_id"]
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM subscriber")).scalar_one() == 1


def test_an_erased_subscriber_is_never_inherited(app, engine, subscriptions, clock):
    client = app.test_client()
    sub = subscriptions()
    client.post(URL, json={"subscription": sub.to_json()})
    (row,) = all_rows(engine, "push_subscription")
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE subscriber SET erased_at = :t"), {"t": clock.now()})
        conn.execute(
            sa.text(
                "UPDATE push_subscription SET endpoint = NULL, p256dh = NULL, auth_sealed = NULL, "
                "user_agent = NULL, locale = NULL, state = 'revoked', deleted_at = :t"
            ),
            {"t": clock.now()},
        )
    again = client.post(URL, json={"subscription": sub.to_json()})  # still holds the old cookie
    assert again.status_code == 200
    (after,) = all_rows(engine, "push_subscription")
    assert after["subscriber_id"] != row["subscriber_id"]
    assert after["endpoint"] == sub.endpoint
    assert after["state"] == "pending"
