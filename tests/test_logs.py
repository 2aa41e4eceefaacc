"""Secrets never reach the logs: a whole flow run with every logger at DEBUG.

Subscribing, changing preferences (API and preference centre), a wrong and a right staff
sign-in, a campaign sent to the fake push service, an export and a crash are run while
every record is captured; then each record (message, arguments, formatted text with any
traceback) is searched for every secret in every encoding it is kept in.
"""

from __future__ import annotations

import base64
import logging
import re

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from portal.config import b64url_decode
from portal.seams import current_portal
from tests.campaigns.conftest import (  # noqa: F401 - fixtures shared with the campaign tests
    dispatcher,
    fake_push,
    form_data,
    push_app,
    push_transport,
    settings,
    sign_in,
)
from tests.conftest import EXPORT_SIGNING_KEY, KEY_V1, VAPID_PRIVATE
from tests.staff.conftest import PASSWORD, csrf_from

WRONG_PASSWORD = "not the right password at all"
CRASH_SECRET = "crash-detail-4c1f"


def _encodings(raw: bytes) -> set[str]:
    return {
        raw.hex(),
        raw.hex().upper(),
        base64.b64encode(raw).decode(),
        base64.b64encode(raw).decode().rstrip("="),
        base64.urlsafe_b64encode(raw).decode().rstrip("="),
        repr(raw)[2:-1],  # as bytes print: b'...'
    }


def _pem_and_der(key: ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey) -> set[str]:
    found: set[str] = set()
    for fmt in (serialization.PrivateFormat.PKCS8, serialization.PrivateFormat.TraditionalOpenSSL):
        if (
            isinstance(key, ed25519.Ed25519PrivateKey)
            and fmt is not serialization.PrivateFormat.PKCS8
        ):
            continue
        pem = key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption())
        der = key.private_bytes(serialization.Encoding.DER, fmt, serialization.NoEncryption())
        body = "".join(pem.decode().splitlines()[1:-1])
        found |= {body, *pem.decode().splitlines()[1:-1]} | _encodings(der)
    return found


def _secrets(app, people) -> dict[str, set[str]]:
    config = current_portal(app).settings
    vapid_raw = b64url_decode(VAPID_PRIVATE)
    vapid_key = ec.derive_private_key(int.from_bytes(vapid_raw, "big"), ec.SECP256R1())
    export_raw = b64url_decode(EXPORT_SIGNING_KEY)
    export_key = ed25519.Ed25519PrivateKey.from_private_bytes(export_raw)
    secrets = {
        "staff password": {PASSWORD},
        "wrong staff password": {WRONG_PASSWORD},
        "SECRET_KEY": {config.secret_key},
        "VAPID private key": {VAPID_PRIVATE} | _encodings(vapid_raw) | _pem_and_der(vapid_key),
        "subscription data key": {KEY_V1} | _encodings(base64.b64decode(KEY_V1)),
        "export signing key": {EXPORT_SIGNING_KEY}
        | _encodings(export_raw)
        | _pem_and_der(export_key),
        "feedback secret": set(config.feedback_secrets),
    }
    for index, person in enumerate(people):
        secrets[f"auth secret {index}"] = {person.auth_b64} | _encodings(person.auth)
        secrets[f"p256dh {index}"] = {person.p256dh} | _encodings(b64url_decode(person.p256dh))
    # Short encodings would match by chance; every value here is long enough not to.
    assert all(len(value) >= 16 for values in secrets.values() for value in values)
    return secrets


def _texts(record: logging.LogRecord) -> list[str]:
    texts = [str(record.msg), repr(record.args), record.getMessage()]
    texts.append(logging.Formatter("%(name)s %(message)s").format(record))  # with traceback
    texts.extend(repr(value) for value in vars(record).values())
    return texts


@pytest.fixture
def everything_logged(caplog):
    caplog.set_level(logging.DEBUG)  # the root logger and the capture handler
    for name in ("portal", "werkzeug", "apscheduler", "urllib3"):
        caplog.set_level(logging.DEBUG, logger=name)
    # SQL statements with their parameters; DEBUG would add every result row, which
    # shows stored data (p256dh is kept verbatim) and is never for production.
    caplog.set_level(logging.INFO, logger="sqlalchemy.engine")
    return caplog


def test_no_secret_reaches_the_logs(request, everything_logged):
    # The campaign tests' fixtures, imported above: the app trusting the fake push
    # service, its dispatcher, and staff sign-in.
    app = request.getfixturevalue("push_app")
    sender = request.getfixturevalue("dispatcher")
    push_service = request.getfixturevalue("fake_push")
    staff_sign_in = request.getfixturevalue("sign_in")
    from portal.staff.models import Role

    @app.get("/crash")
    def crash() -> str:
        raise RuntimeError(CRASH_SECRET)

    people = [push_service.subscribe() for _ in range(2)]
    visitor = app.test_client()
    for person in people:
        response = visitor.post(
            "/api/push/subscribe",
            json={
                "subscription": person.to_json(),
                "topics": ["weekly-digest"],
                "policyVersion": "v1",
            },
        )
        assert response.status_code == 201, response.json
    # Preferences through the API, a heartbeat, a receipt, and a refusal. The visitor's
    # device cookie names the second subscription: the first proves itself with its
    # auth secret, which must not reach a log either.
    response = visitor.post(
        "/api/push/preferences",
        json={
            "endpoint": people[0].endpoint,
            "auth": people[0].auth_b64,
            "decisions": [{"slug": "offers", "state": "opt_in"}],
            "policyVersion": "v1",
            "decidedAt": "2025-12-31T23:00:00Z",
        },
    )
    assert response.status_code == 200, response.json
    assert (
        visitor.post("/api/push/heartbeat", json={"endpoint": people[1].endpoint}).status_code
        == 200
    )
    bad = dict(people[1].to_json(), keys={"p256dh": people[1].p256dh, "auth": "short"})
    assert visitor.post("/api/push/subscribe", json={"subscription": bad}).status_code == 422
    # Preferences through the preference centre (the visitor's cookies name them).
    page = visitor.get("/preferences")
    assert page.status_code == 200
    saved = visitor.post(
        "/preferences",
        data={
            "csrf_token": csrf_from(page.text),
            "policy_version": "v1",
            "visible": ["weekly-digest", "offers"],
            "topics": ["weekly-digest", "offers"],
        },
    )
    assert saved.status_code == 303, saved.text

    staff = staff_sign_in(app, "campaigner@example.test", Role.CAMPAIGNS, Role.COMPLIANCE)
    with app.test_client() as stranger:  # the right address, a wrong password
        login = stranger.get("/staff/login")
        refused = stranger.post(
            "/staff/login",
            data={
                "csrf_token": csrf_from(login.text),
                "email": "campaigner@example.test",
                "password": WRONG_PASSWORD,
            },
        )
        assert refused.status_code != 303

    fields = form_data()
    review = staff.post("/staff/campaigns/new", {**fields, "action": "review"})
    campaign_id = re.search(r'name="campaign_id" value="([0-9a-f-]{36})"', review.text).group(1)
    launched = staff.post(
        "/staff/campaigns/new", {**fields, "campaign_id": campaign_id, "action": "launch"}
    )
    assert launched.status_code == 303
    sender.tick()
    assert len(push_service.received()) == 2
    for person in people:
        assert len(push_service.plaintexts(person)) == 1

    export = staff.post(
        "/staff/compliance/export",
        {
            "date_from": "2025-12-01",
            "date_to": "2026-01-01",
            "data_format": "csv",
            "topic": "",
            "subscriber": "",
        },
    )
    assert export.status_code == 200
    assert export.mimetype == "application/zip"
    export.get_data()

    app.config["PROPAGATE_EXCEPTIONS"] = False  # answer the crash as production does
    assert app.test_client().get("/crash").status_code == 500
    with app.extensions["portal.db"].engine.connect() as conn:
        delivery_id = conn.execute(
            sa.text(
                "SELECT d.id FROM delivery d JOIN push_subscription s ON s.id = d.subscription_id"
                " WHERE s.endpoint = :e"
            ),
            {"e": people[0].endpoint},
        ).scalar_one()
    receipt = {
        "deliveryId": str(delivery_id),
        "event": "shown",
        "endpoint": people[0].endpoint,
        "auth": people[0].auth_b64,
    }
    assert visitor.post("/api/push/receipt", json=receipt).status_code == 201

    records = everything_logged.records
    assert any(r.name.startswith("sqlalchemy.engine") for r in records)  # really captured
    assert any(r.exc_info for r in records)  # the crash was logged, with its traceback
    secrets = _secrets(app, people)
    leaks = []
    for record in records:
        texts = _texts(record)
        for name, values in secrets.items():
            if any(value in text for value in values for text in texts):
                leaks.append(f"{name} in {record.name}: {record.getMessage()[:200]}")
    assert leaks == []
