"""POST /api/push/subscribe: seed 000's verification and the bad-input table."""

from __future__ import annotations

import base64
import json
import sqlite3
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa

from portal.seams import current_portal
from portal.subscriptions.validation import endpoint_hash
from tests.factories import BrowserSubscription, SubscriptionFactory
from tests.helpers import all_rows, count_rows

URL = "/api/push/subscribe"


def test_same_subscription_twice_same_id_inserted_then_updated(client, engine, subscriptions):
    sub = subscriptions()
    first = client.post(URL, json={"subscription": sub.to_json()})
    second = client.post(URL, json={"subscription": sub.to_json()})

    assert first.status_code == 201
    assert second.status_code == 200
    assert first.json["inserted"] is True
    assert second.json["inserted"] is False
    assert first.json["id"] == second.json["id"]
    assert first.json["state"] == "pending"
    rows = all_rows(engine, "push_subscription")
    assert len(rows) == 1
    row = rows[0]
    assert bytes(row["endpoint_hash"]) == endpoint_hash(sub.endpoint)
    assert len(bytes(row["endpoint_hash"])) == 32
    assert row["endpoint"] == sub.endpoint  # verbatim
    assert row["p256dh"] == sub.p256dh  # verbatim
    assert row["push_service"] == "fcm"
    assert count_rows(engine, "subscriber") == 1


def test_subscribe_sets_a_signed_httponly_subscriber_cookie(client, subscriptions):
    response = client.post(URL, json={"subscription": subscriptions().to_json()})
    cookies = {c.split("=", 1)[0]: c for c in response.headers.getlist("Set-Cookie")}
    assert set(cookies) == {"portal_subscriber", "portal_device"}
    for cookie in cookies.values():
        assert "HttpOnly" in cookie
        assert "SameSite=Lax" in cookie


def test_two_endpoints_from_one_browser_share_the_subscriber(client, engine, subscriptions):
    client.post(URL, json={"subscription": subscriptions().to_json()})
    client.post(URL, json={"subscription": subscriptions("autopush").to_json()})
    assert count_rows(engine, "push_subscription") == 2
    assert count_rows(engine, "subscriber") == 1
    services = sorted(r["push_service"] for r in all_rows(engine, "push_subscription"))
    assert services == ["autopush", "fcm"]


def test_a_forged_cookie_is_ignored(app, engine, subscriptions):
    client = app.test_client()
    client.set_cookie("portal_subscriber", "not-a-signed-value")
    response = client.post(URL, json={"subscription": subscriptions().to_json()})
    assert response.status_code == 201
    assert count_rows(engine, "subscriber") == 1


def _needles(sub: BrowserSubscription) -> list[bytes]:
    raw = sub.auth
    return [
        sub.auth_b64.encode(),
        base64.b64encode(raw).rstrip(b"="),
        raw,
        raw.hex().encode(),
        raw.hex().upper().encode(),
    ]


def test_auth_secret_never_appears_in_a_plain_dump(client, engine, subscriptions, backend):
    subs = [subscriptions(), subscriptions("autopush"), subscriptions("apple")]
    for sub in subs:
        assert client.post(URL, json={"subscription": sub.to_json()}).status_code == 201
    if backend == "postgresql":
        url = engine.url.set(drivername="postgresql")
        dump = subprocess.run(
            ["pg_dump", "--data-only", url.render_as_string(hide_password=False)],
            capture_output=True,
            check=True,
        ).stdout
    else:
        conn = sqlite3.connect(engine.url.database)
        dump = "\n".join(conn.iterdump()).encode()
        conn.close()
        dump += Path(engine.url.database).read_bytes()  # the database file itself
    assert b"push_subscription" in dump
    for sub in subs:
        assert sub.p256dh.encode() in dump  # the dump is real: public values are there
        for needle in _needles(sub):
            assert needle not in dump, needle


def _valid() -> dict:
    return SubscriptionFactory()().to_json()


def _with(path: str, value: object) -> dict:
    body = {"subscription": _valid()}
    target = body
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    return body


_DELETE = object()
# A 65-byte uncompressed point whose coordinates are not on P-256.
OFF_CURVE = base64.urlsafe_b64encode(b"\x04" + b"\x01" * 64).rstrip(b"=").decode()
SIXTY_FOUR = base64.urlsafe_b64encode(b"\x04" + b"\x02" * 63).rstrip(b"=").decode()
AUTH_15 = base64.urlsafe_b64encode(b"a" * 15).rstrip(b"=").decode()
AUTH_17 = base64.urlsafe_b64encode(b"a" * 17).rstrip(b"=").decode()
FCM = "https://fcm.googleapis.com/fcm/send/abc123"


def _padded(value: str) -> str:
    return value + "=" * (-len(value) % 4)


def _standard_b64() -> dict:
    """A p256dh whose base64url text has '-' or '_' rewritten as standard base64 '+' '/'."""
    while True:
        body = {"subscription": _valid()}
        key = body["subscription"]["keys"]["p256dh"]
        if "-" in key or "_" in key:
            body["subscription"]["keys"]["p256dh"] = key.replace("-", "+").replace("_", "/")
            return body


BAD_JSON_BODIES = [
    pytest.param(
        lambda: _with("subscription.endpoint", "http://fcm.googleapis.com/fcm/send/x"),
        422,
        "subscription.endpoint",
        id="http-endpoint",
    ),
    pytest.param(
        lambda: _with("subscription.endpoint", "https://push.example.com/x"),
        422,
        "subscription.endpoint",
        id="host-not-allowed",
    ),
    pytest.param(
        lambda: _with("subscription.endpoint", "https://fcm.googleapis.com.evil.example/x"),
        422,
        "subscription.endpoint",
        id="allowed-name-as-prefix",
    ),
    pytest.param(
        lambda: _with("subscription.endpoint", "https://evilfcm.googleapis.com/x"),
        422,
        "subscription.endpoint",
        id="allowed-name-as-suffix",
    ),
    pytest.param(
        lambda: _with("subscription.endpoint", "https://evil.example/fcm.googleapis.com/x"),
        422,
        "subscription.endpoint",
        id="allowed-name-in-path",
    ),
    pytest.param(
        lambda: _with("subscription.endpoint", "https://fcm.googleapis.com@evil.example/x"),
        422,
        "subscription.endpoint",
        id="userinfo-host-trick",
    ),
    pytest.param(
        lambda: _with("subscription.endpoint", "https://evil.example@fcm.googleapis.com/x"),
        422,
        "subscription.endpoint",
        id="userinfo",
    ),
    pytest.param(
        lambda: _with("subscription.endpoint", "https://fcm.googleapis.com:8443/x"),
        422,
        "subscription.endpoint",
        id="port-not-allowed",
    ),
    pytest.param(
        lambda: _with("subscription.endpoint", "https://fcm.googleapis.com:443@evil.example/x"),
        422,
        "subscription.endpoint",
        id="port-userinfo-trick",
    ),
    pytest.param(
        lambda: _with("subscription.endpoint", "https://fcm.googleapis.com:99999/x"),
        422,
        "subscription.endpoint",
        id="port-out-of-range",
    ),
    pytest.param(
        lambda: _with("subscription.endpoint", "https://fcm.googleapis.com\\@evil.example/x"),
        422,
        "subscription.endpoint",
        id="backslash-trick",
    ),
    pytest.param(
        lambda: _with("subscription.endpoint", "https://notify.windows.com/x"),
        422,
        "subscription.endpoint",
        id="wildcard-needs-a-label",
    ),
    pytest.param(
        lambda: _with("subscription.endpoint", "https://evilnotify.windows.com/x"),
        422,
        "subscription.endpoint",
        id="wildcard-substring",
    ),
    pytest.param(
        lambda: _with("subscription.endpoint", "https://fcm.googleapis.com/"),
        422,
        "subscription.endpoint",
        id="no-registration-path",
    ),
    pytest.param(
        lambda: _with("subscription.endpoint", "https://fcm.googleapis.com/" + "a" * 4100),
        422,
        "subscription.endpoint",
        id="endpoint-over-bound",
    ),
    pytest.param(
        lambda: _with("subscription.endpoint", "https://fcm.googleapis.com/a b"),
        422,
        "subscription.endpoint",
        id="endpoint-whitespace",
    ),
    pytest.param(
        lambda: _with("subscription.keys.p256dh", SIXTY_FOUR),
        422,
        "subscription.keys.p256dh",
        id="p256dh-64-bytes",
    ),
    pytest.param(
        lambda: _with("subscription.keys.p256dh", OFF_CURVE),
        422,
        "subscription.keys.p256dh",
        id="p256dh-off-curve",
    ),
    pytest.param(
        lambda: _with("subscription.keys.p256dh", _padded(_valid()["keys"]["p256dh"])),
        422,
        "subscription.keys.p256dh",
        id="p256dh-padded",
    ),
    pytest.param(_standard_b64, 422, "subscription.keys.p256dh", id="p256dh-standard-base64"),
    pytest.param(
        lambda: _with("subscription.keys.auth", _padded(_valid()["keys"]["auth"])),
        422,
        "subscription.keys.auth",
        id="auth-padded",
    ),
    pytest.param(
        lambda: _with("subscription.keys.auth", AUTH_15),
        422,
        "subscription.keys.auth",
        id="auth-15-bytes",
    ),
    pytest.param(
        lambda: _with("subscription.keys.auth", AUTH_17),
        422,
        "subscription.keys.auth",
        id="auth-17-bytes",
    ),
    pytest.param(
        lambda: _with("subscription.keys.auth", 12345),
        400,
        "subscription.keys.auth",
        id="auth-not-a-string",
    ),
    pytest.param(
        lambda: _with("subscription.endpoint", _DELETE),
        400,
        "subscription.endpoint",
        id="missing-endpoint",
    ),
    pytest.param(
        lambda: _with("subscription.endpoint", None),
        400,
        "subscription.endpoint",
        id="null-endpoint",
    ),
    pytest.param(
        lambda: _with("subscription.keys", _DELETE), 400, "subscription.keys", id="missing-keys"
    ),
    pytest.param(
        lambda: _with("subscription.keys.p256dh", None),
        400,
        "subscription.keys.p256dh",
        id="null-p256dh",
    ),
    pytest.param(
        lambda: _with("subscription.keys.auth", _DELETE),
        400,
        "subscription.keys.auth",
        id="missing-auth",
    ),
    pytest.param(lambda: {"subscription": None}, 400, "subscription", id="null-subscription"),
    pytest.param(lambda: {}, 400, "subscription", id="empty-object"),
    pytest.param(
        lambda: {"subscription": "text"}, 400, "subscription", id="subscription-not-object"
    ),
    pytest.param(
        lambda: _with("subscription.expirationTime", "tomorrow"),
        400,
        "subscription.expirationTime",
        id="expiration-not-number",
    ),
    pytest.param(
        lambda: _with("subscription.expirationTime", -5),
        422,
        "subscription.expirationTime",
        id="expiration-negative",
    ),
]


@pytest.mark.parametrize(("make_body", "status", "field"), BAD_JSON_BODIES)
def test_bad_subscription_is_refused_and_writes_nothing(client, engine, make_body, status, field):
    response = client.post(URL, json=make_body())
    assert response.status_code == status, response.json
    error = response.json["error"]
    assert set(error) >= {"code", "message"}
    assert error["field"] == field
    assert count_rows(engine, "push_subscription") == 0
    assert count_rows(engine, "subscriber") == 0


RAW_BAD_REQUESTS = [
    pytest.param(b"{not json", "application/json", 400, "invalid_json", id="not-json"),
    pytest.param(b"[1, 2]", "application/json", 400, "invalid_json", id="json-array"),
    pytest.param(b'{"subscription": NaN}', "application/json", 400, "invalid_json", id="json-nan"),
    pytest.param(
        b"[" * 5000 + b"]" * 5000, "application/json", 400, "invalid_json", id="deep-nesting"
    ),
    pytest.param(
        b'{"subscription": {}}', "text/plain", 415, "unsupported_media_type", id="text-plain"
    ),
    pytest.param(
        b"subscription=x",
        "application/x-www-form-urlencoded",
        415,
        "unsupported_media_type",
        id="form-encoded",
    ),
    pytest.param(
        b'{"subscription": {}}', None, 415, "unsupported_media_type", id="no-content-type"
    ),
    pytest.param(
        b'{"pad": "' + b"x" * 20000 + b'"}',
        "application/json",
        413,
        "request_entity_too_large",
        id="oversized-body",
    ),
    pytest.param(b"\xff\xfe{}", "application/json", 400, "invalid_json", id="not-utf8"),
]


@pytest.mark.parametrize(("data", "content_type", "status", "code"), RAW_BAD_REQUESTS)
def test_malformed_request_is_refused_and_writes_nothing(
    client, engine, data, content_type, status, code
):
    headers = {"Content-Type": content_type} if content_type else {}
    response = client.post(URL, data=data, headers=headers)
    assert response.status_code == status
    error = response.json["error"]
    assert error["code"] == code
    assert isinstance(error["message"], str) and error["message"]
    assert count_rows(engine, "push_subscription") == 0
    assert count_rows(engine, "subscriber") == 0


@pytest.mark.parametrize(
    ("key", "value", "code", "message"),
    [
        ("p256dh", SIXTY_FOUR, "invalid_length", "must decode to 65 bytes, not 64"),
        ("p256dh", OFF_CURVE, "invalid_key", "is not a point on P-256"),
        ("auth", AUTH_15, "invalid_length", "must decode to 16 bytes, not 15"),
        ("auth", AUTH_17, "invalid_length", "must decode to 16 bytes, not 17"),
    ],
)
def test_bad_keys_are_refused_for_the_right_reason(client, key, value, code, message):
    response = client.post(URL, json=_with(f"subscription.keys.{key}", value))
    assert response.status_code == 422
    error = response.json["error"]
    assert (error["code"], error["field"]) == (code, f"subscription.keys.{key}")
    assert message in error["message"]


def test_cross_site_post_is_refused(client, engine, subscriptions):
    body = json.dumps({"subscription": subscriptions().to_json()})
    for headers in (
        {"Origin": "https://evil.example"},
        {"Sec-Fetch-Site": "cross-site"},
        # Not a URL at all (urlsplit refuses the unclosed bracket): refused, not a 500.
        {"Origin": "http://[::1"},
    ):
        response = client.post(URL, data=body, content_type="application/json", headers=headers)
        assert response.status_code == 403
        assert response.json["error"]["code"] == "cross_origin"
    assert count_rows(engine, "push_subscription") == 0


def test_same_origin_header_is_accepted(client, subscriptions):
    response = client.post(
        URL,
        json={"subscription": subscriptions().to_json()},
        headers={"Origin": "http://localhost", "Sec-Fetch-Site": "same-origin"},
    )
    assert response.status_code == 201


def test_get_on_the_api_answers_json_405(client):
    response = client.get(URL)
    assert response.status_code == 405
    assert response.json["error"]["code"] == "method_not_allowed"


def test_unknown_api_route_answers_json_404(client):
    response = client.post("/api/push/nothing-here", json={})
    assert response.status_code == 404
    assert "error" in response.json


def test_configured_endpoint_bound_is_used(app, client, engine, subscriptions):
    settings = current_portal(app).settings
    current_portal(app).settings = settings.with_overrides(endpoint_max_length=100)
    sub = subscriptions()
    assert len(sub.endpoint) > 100
    response = client.post(URL, json={"subscription": sub.to_json()})
    assert response.status_code == 422
    assert response.json["error"]["code"] == "endpoint_too_long"


@pytest.mark.parametrize(
    ("service", "expected"),
    [
        ("fcm", "fcm"),
        ("autopush", "autopush"),
        ("apple", "apple"),
        ("wns", "wns"),
        ("local", "other"),
    ],
)
def test_push_service_is_derived_and_stored(client, engine, subscriptions, service, expected):
    assert (
        client.post(URL, json={"subscription": subscriptions(service).to_json()}).status_code == 201
    )
    with engine.connect() as conn:
        assert (
            conn.execute(sa.text("SELECT push_service FROM push_subscription")).scalar_one()
            == expected
        )


def test_expiration_time_is_stored(client, engine, subscriptions):
    sub = subscriptions(expiration_time=1_900_000_000_000)
    client.post(URL, json={"subscription": sub.to_json()})
    with engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT expiration_time FROM push_subscription")).scalar_one()
    assert "2030" in str(stored)


def test_upserts_are_counted_as_a_metric(client, subscriptions):
    def value(result: str) -> float:
        for line in client.get("/metrics").text.splitlines():
            if line.startswith(f'push_subscription_upserts_total{{result="{result}"}}'):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    inserted, updated = value("inserted"), value("updated")
    sub = subscriptions()
    client.post(URL, json={"subscription": sub.to_json()})
    client.post(URL, json={"subscription": sub.to_json()})
    client.post(URL, json={"subscription": sub.to_json()})
    assert value("inserted") == inserted + 1
    assert value("updated") == updated + 2
