"""POST /api/push/feedback: verify, validate everything, apply once, acknowledge after commit."""

from __future__ import annotations

import datetime as dt
import json

import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY
from sqlalchemy.exc import OperationalError
from werkzeug.test import run_wsgi_app

from portal import create_app
from portal.consent.tree import verify_chain
from portal.feedback import services
from tests.feedback.conftest import HEADER, SECRET, URL, Sender, digest, invalid_target
from tests.helpers import all_rows, chunked_environ, count_rows


def _subscription(engine, endpoint: str) -> dict:
    rows = [r for r in all_rows(engine, "push_subscription") if r["endpoint"] == endpoint]
    assert len(rows) == 1
    return rows[0]


def _feedback_events(engine) -> list[dict]:
    return [r for r in all_rows(engine, "consent_event") if r["kind"] == "revoked_by_feedback"]


def _nothing_applied(engine, *endpoints: str) -> None:
    assert count_rows(engine, "feedback_applied") == 0
    assert _feedback_events(engine) == []
    for endpoint in endpoints:
        assert _subscription(engine, endpoint)["state"] == "pending"


def _same_id(a, b) -> bool:
    return str(a).replace("-", "") == str(b).replace("-", "")


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# --- applying --------------------------------------------------------------------------


def test_invalid_target_revokes_the_subscription_and_logs_it(sender, subscribe, engine, clock, app):
    sub = subscribe()
    response = sender.post(digest([invalid_target(sub.endpoint, delivery_id="d-1")]))

    assert response.status_code == 200
    body = response.json
    assert body == {
        "id": body["id"],
        "organization": "acme",
        "events": 1,
        "applied": 1,
        "revoked": 1,
        "duplicates": 0,
        "ignored": 0,
        "truncated": False,
        "eventsOmitted": 0,
    }
    row = _subscription(engine, sub.endpoint)
    assert row["state"] == "revoked"
    assert row["end_reason"] == "revoked_by_feedback"
    assert row["revoked_at"] is not None
    [event] = _feedback_events(engine)
    assert (event["actor"], event["source"]) == ("system", "system")
    assert (event["previous_state"], event["new_state"]) == ("pending", "revoked")
    assert _same_id(event["subscription_id"], row["id"])
    assert json.loads(event["context"]) == {
        "delivery": "d-1",
        "organization": "acme",
        "provider": "webpush",
        "reason": "INVALID_TARGET",
        "screen": "delivery-feedback",
    }
    with engine.connect() as conn:
        assert verify_chain(conn).ok

    [marker] = all_rows(engine, "feedback_applied")
    assert (marker["organization"], marker["key_kind"], marker["outcome"]) == (
        "acme",
        "delivery",
        "revoked",
    )
    assert marker["delivery_id"] == "d-1"
    assert bytes(marker["target_hash"]) == bytes(row["endpoint_hash"])
    [received] = all_rows(engine, "feedback_digest")
    assert received["result"] == "accepted"
    assert received["secret_index"] == 0
    assert (received["events"], received["applied"], received["revoked"]) == (1, 1, 1)
    # The heartbeat now tells the browser to drop the dead subscription.
    beat = sender.client.post("/api/push/heartbeat", json={"endpoint": sub.endpoint})
    assert beat.json == {"state": "revoked", "action": "unsubscribe"}


def test_the_same_digest_twice_is_acknowledged_twice_and_applied_once(sender, subscribe, engine):
    sub = subscribe()
    raw = digest([invalid_target(sub.endpoint, delivery_id="d-1")])
    first = sender.post(raw)
    second = sender.post(raw)  # a lost response: the sender sends the same window again

    assert (first.status_code, second.status_code) == (200, 200)
    assert (first.json["applied"], first.json["duplicates"]) == (1, 0)
    assert (second.json["applied"], second.json["revoked"], second.json["duplicates"]) == (
        0,
        0,
        1,
    )
    assert len(_feedback_events(engine)) == 1
    assert count_rows(engine, "feedback_applied") == 1
    digests = all_rows(engine, "feedback_digest")
    assert sorted(d["duplicates"] for d in digests) == [0, 1]


def test_classic_events_are_keyed_by_provider_target_and_time(sender, subscribe, engine, clock):
    sub = subscribe()
    at = sender.now_ms()
    first = sender.post(digest([invalid_target(sub.endpoint, at=at)]))
    assert (first.json["applied"], first.json["revoked"]) == (1, 1)

    # The same classic event again: a duplicate.
    again = sender.post(digest([invalid_target(sub.endpoint, at=at)]))
    assert again.json["duplicates"] == 1
    # A later event for the same target is a new event (the target has ended already).
    later = sender.post(digest([invalid_target(sub.endpoint, at=at + 1)]))
    assert (later.json["applied"], later.json["revoked"]) == (1, 0)
    # The same time from another provider is another event too.
    other = sender.post(digest([invalid_target(sub.endpoint, at=at, provider="fcm")]))
    assert other.json["applied"] == 1

    markers = all_rows(engine, "feedback_applied")
    assert sorted(m["outcome"] for m in markers) == ["already_ended", "already_ended", "revoked"]
    assert {m["key_kind"] for m in markers} == {"classic"}
    assert len(_feedback_events(engine)) == 1


def test_event_keys_follow_the_seed():
    endpoint = "https://fcm.googleapis.com/fcm/send/abc"
    assert services.event_key(invalid_target(endpoint, delivery_id="6f0f"))[0] == "delivery:6f0f"
    assert (
        services.event_key({"provider": "fcm", "token": "example-device-token", "at": 17})[0]
        == "classic:fcm:20:example-device-token:17"
    )
    # token wins over endpoint.
    key = services.event_key({"provider": "fcm", "token": "t", "endpoint": "e", "at": 1})
    assert key == ("classic:fcm:1:t:1", "fcm", None)


def test_an_empty_delivery_id_needs_a_timestamp():
    with pytest.raises(services.ValidationError) as raised:
        services.event_key({"provider": "fcm", "token": "t", "deliveryId": ""})
    assert raised.value.code == "missing_timestamp"
    key = services.event_key({"provider": "fcm", "token": "t", "deliveryId": "", "at": 5})
    assert key == ("classic:fcm:1:t:5", "fcm", None)
    # The length counts UTF-16 code units, as the sender's own helpers do.
    assert services.event_key({"provider": "p", "token": "a😀", "at": 1})[0] == "classic:p:3:a😀:1"


def test_dead_with_a_transient_reason_removes_nothing(sender, subscribe, engine):
    sub = subscribe()
    events = [
        {
            "deliveryId": "d-9",
            "provider": "webpush",
            "endpoint": sub.endpoint,
            "status": "DEAD",
            "reason": reason,
            "attempts": 5,
        }
        for reason in ("PROVIDER_UNAVAILABLE", "TIMEOUT", "RATE_LIMITED", None)
    ]
    # A transient event needs no correlation: no target, no time, still no failure.
    events.append({"status": "DEAD", "reason": "TIMEOUT"})
    response = sender.post(digest(events))

    assert response.status_code == 200
    assert (response.json["ignored"], response.json["applied"]) == (5, 0)
    _nothing_applied(engine, sub.endpoint)
    [received] = all_rows(engine, "feedback_digest")
    assert (received["events"], received["ignored"]) == (5, 5)


def test_an_unknown_target_is_acknowledged_and_marked(sender, engine):
    response = sender.post(
        digest([invalid_target("https://fcm.googleapis.com/fcm/send/gone", delivery_id="d")])
    )
    assert response.status_code == 200
    assert (response.json["applied"], response.json["revoked"]) == (1, 0)
    [marker] = all_rows(engine, "feedback_applied")
    assert marker["outcome"] == "unmatched"
    assert marker["subscription_id"] is None


def test_markers_are_per_organization(sender, subscribe, engine):
    sub = subscribe()
    event = invalid_target(sub.endpoint, delivery_id="d-1")
    assert sender.post(digest([event], organization="acme")).json["applied"] == 1
    assert sender.post(digest([event], organization="globex")).json["applied"] == 1
    assert count_rows(engine, "feedback_applied") == 2
    assert len(_feedback_events(engine)) == 1  # the subscription ended once


def test_a_duplicate_inside_one_digest_counts_once(sender, subscribe, engine):
    sub = subscribe()
    event = invalid_target(sub.endpoint, delivery_id="d-1")
    response = sender.post(digest([event, event]))
    assert (response.json["applied"], response.json["duplicates"]) == (1, 1)
    assert len(_feedback_events(engine)) == 1


def test_truncated_pages_are_separate_requests_and_omitted_is_a_figure(sender, subscribe, engine):
    one, two = subscribe(), subscribe()
    first = sender.post(
        digest([invalid_target(one.endpoint, delivery_id="a")], truncated=True, eventsOmitted=0)
    )
    second = sender.post(digest([invalid_target(two.endpoint, delivery_id="b")], eventsOmitted=120))
    assert (first.status_code, second.status_code) == (200, 200)
    assert (first.json["truncated"], second.json["eventsOmitted"]) == (True, 120)
    rows = sorted(all_rows(engine, "feedback_digest"), key=lambda r: r["truncated"])
    assert [(r["truncated"], r["events_omitted"], r["events"]) for r in rows] == [
        (False, 120, 1),
        (True, 0, 1),
    ]
    # 120 omitted accepted deliveries are neither failures nor lost: nothing else happens.
    assert len(_feedback_events(engine)) == 2


# --- authentication --------------------------------------------------------------------


def _tamper_one_byte(raw: bytes) -> bytes:
    return raw.replace(b'"acme"', b'"acmf"')


def _reserialised(raw: bytes) -> bytes:
    return json.dumps(json.loads(raw), indent=2, sort_keys=True).encode()


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("flipped byte", "invalid_signature"),
        ("re-serialised", "invalid_signature"),
        ("wrong secret", "invalid_signature"),
        ("stale", "signature_expired"),
        ("future", "signature_expired"),
        ("missing header", "missing_signature"),
        ("empty header", "missing_signature"),
        ("no v1", "malformed_signature"),
        ("no t", "malformed_signature"),
        ("short mac", "malformed_signature"),
        ("not hex", "malformed_signature"),
        ("seconds not millis", "signature_expired"),
    ],
)
def test_unauthentic_digests_are_refused_before_anything(
    sender, subscribe, engine, clock, case, reason
):
    sub = subscribe()
    raw = digest([invalid_target(sub.endpoint, delivery_id="d-1")])
    now = sender.now_ms()
    good = sender.signature(raw)
    mac = good.split("v1=")[1]
    before = _metric("portal_feedback_rejections_total", reason=reason)
    response = {
        "flipped byte": lambda: sender.post(_tamper_one_byte(raw), signature=good),
        "re-serialised": lambda: sender.post(_reserialised(raw), signature=good),
        "wrong secret": lambda: sender.post(raw, secret="not-the-secret"),
        "stale": lambda: sender.post(raw, t=now - 300_001),
        "future": lambda: sender.post(raw, t=now + 300_001),
        "missing header": lambda: sender.client.post(
            URL, data=raw, headers={"Content-Type": "application/json"}
        ),
        "empty header": lambda: sender.post(raw, signature=""),
        "no v1": lambda: sender.post(raw, signature=f"t={now}"),
        "no t": lambda: sender.post(raw, signature=f"v1={mac}"),
        "short mac": lambda: sender.post(raw, signature=f"t={now},v1={mac[:-2]}"),
        "not hex": lambda: sender.post(raw, signature=f"t={now},v1={'z' * 64}"),
        "seconds not millis": lambda: sender.post(raw, t=now // 1000),
    }[case]()

    assert response.status_code == 401
    assert response.json["error"]["code"] == reason
    assert response.headers["WWW-Authenticate"].startswith("HMAC-SHA256")
    _nothing_applied(engine, sub.endpoint)
    # Unsigned requests write nothing at all, not even a digest row.
    assert count_rows(engine, "feedback_digest") == 0
    assert _metric("portal_feedback_rejections_total", reason=reason) == before + 1


@pytest.mark.parametrize("case", ["missing header", "wrong secret", "stale", "malformed"])
def test_an_unauthentic_body_is_never_parsed(sender, engine, monkeypatch, case):
    """401 comes before any parsing: a body that is not even JSON is refused for its
    signature, and the parser is never reached."""

    def never(*_args, **_kwargs):
        raise AssertionError("an unauthentic body was parsed")

    monkeypatch.setattr(services, "parse_digest", never)
    monkeypatch.setattr(services, "_organization_hint", never)
    monkeypatch.setattr(services.json, "loads", never)
    raw = b"{not json at all"
    response = {
        "missing header": lambda: sender.client.post(URL, data=raw),
        "wrong secret": lambda: sender.post(raw, secret="not-the-secret"),
        "stale": lambda: sender.post(raw, t=sender.now_ms() - 300_001),
        "malformed": lambda: sender.post(raw, signature="t=1,v1=zz"),
    }[case]()
    assert response.status_code == 401
    assert count_rows(engine, "feedback_digest") == 0


def test_the_edges_of_the_age_window_are_accepted(sender, engine):
    raw = digest([])
    now = sender.now_ms()
    assert sender.post(raw, t=now - 300_000).status_code == 200
    assert sender.post(raw, t=now + 300_000).status_code == 200


def test_the_clock_decides_what_is_stale(sender, clock):
    raw = digest([])
    signed = sender.signature(raw)
    clock.advance(minutes=5)
    assert sender.post(raw, signature=signed).status_code == 200
    clock.advance(seconds=1)
    assert sender.post(raw, signature=signed).json["error"]["code"] == "signature_expired"


def _app(settings, clock, **overrides):
    application = create_app(settings.with_overrides(**overrides), clock=clock)
    application.config["TESTING"] = True
    return application


def test_two_secrets_during_rotation_then_the_old_one_is_refused(settings, clock, subscriptions):
    rotating = _app(settings, clock, feedback_secrets=("new-secret", SECRET))
    try:
        sender = Sender(rotating.test_client(), clock)
        old = sender.post(digest([], organization="o"), secret=SECRET)
        new = sender.post(digest([], organization="n"), secret="new-secret")
        assert (old.status_code, new.status_code) == (200, 200)
        engine = rotating.extensions["portal.db"].engine
        indexes = {
            r["organization"]: r["secret_index"] for r in all_rows(engine, "feedback_digest")
        }
        assert indexes == {"o": 1, "n": 0}
    finally:
        rotating.extensions["portal.db"].engine.dispose()

    rotated = _app(settings, clock, feedback_secrets=("new-secret",))
    try:
        sender = Sender(rotated.test_client(), clock)
        refused = sender.post(digest([], organization="late"), secret=SECRET)
        assert refused.status_code == 401
        assert refused.json["error"]["code"] == "invalid_signature"
        assert sender.post(digest([]), secret="new-secret").status_code == 200
    finally:
        rotated.extensions["portal.db"].engine.dispose()


def test_a_receiver_without_secrets_refuses_everything(settings, clock):
    bare = _app(settings, clock, feedback_secrets=())
    try:
        response = Sender(bare.test_client(), clock).post(digest([]))
        assert response.status_code == 401
        assert response.json["error"]["code"] == "not_configured"
    finally:
        bare.extensions["portal.db"].engine.dispose()


def test_the_signature_header_is_configurable(settings, clock):
    custom = _app(settings, clock, feedback_signature_header="X-Feedback-Signature")
    try:
        client = custom.test_client()
        raw = digest([])
        signed = Sender(client, clock).signature(raw)
        assert client.post(URL, data=raw, headers={HEADER: signed}).status_code == 401
        assert (
            client.post(URL, data=raw, headers={"X-Feedback-Signature": signed}).status_code == 200
        )
    finally:
        custom.extensions["portal.db"].engine.dispose()


def test_server_to_server_no_origin_check_and_no_csrf(sender, app):
    assert app.config.get("WTF_CSRF_ENABLED", True)  # CSRF is on for the rest of the app
    response = sender.post(
        digest([]),
        headers={"Origin": "https://provider.example", "Sec-Fetch-Site": "cross-site"},
    )
    assert response.status_code == 200
    # The browser API next to it still refuses the same request.
    refused = sender.client.post(
        "/api/push/heartbeat",
        json={"endpoint": "https://fcm.googleapis.com/x"},
        headers={"Sec-Fetch-Site": "cross-site"},
    )
    assert refused.status_code == 403


def test_the_body_size_limit_holds(settings, clock):
    small = _app(settings, clock, feedback_max_body_bytes=200)
    try:
        sender = Sender(small.test_client(), clock)
        before = _metric("portal_feedback_rejections_total", reason="too_large")
        response = sender.post(digest([invalid_target("https://x.example/" + "a" * 300)]))
        assert response.status_code == 413
        assert response.json["error"]["code"] == "request_entity_too_large"
        assert _metric("portal_feedback_rejections_total", reason="too_large") == before + 1
    finally:
        small.extensions["portal.db"].engine.dispose()


def test_a_chunked_body_over_the_limit_is_too_large_not_a_forgery(settings, clock):
    """Sent chunked (no Content-Length; gunicorn ends the stream), a signed digest over the
    limit is refused as too large, as with a Content-Length: not cut at the limit and
    then refused as a bad signature, which would read as a wrong secret or an attack."""
    small = _app(settings, clock, feedback_max_body_bytes=200)
    try:
        raw = digest([invalid_target("https://x.example/" + "a" * 300)])
        sender = Sender(small.test_client(), clock)
        before = _metric("portal_feedback_rejections_total", reason="too_large")
        environ = chunked_environ(
            URL, raw, {"Content-Type": "application/json", HEADER: sender.signature(raw)}
        )
        answer, status, _ = run_wsgi_app(small.wsgi_app, environ)
        assert status.startswith("413")
        assert json.loads(b"".join(answer))["error"]["code"] == "request_entity_too_large"
        assert _metric("portal_feedback_rejections_total", reason="too_large") == before + 1
    finally:
        small.extensions["portal.db"].engine.dispose()


# --- refusing the whole digest ---------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "code", "field"),
    [
        ({"provider": None}, "missing_provider", "events[1].provider"),
        ({"provider": ""}, "missing_provider", "events[1].provider"),
        ({"endpoint": None}, "missing_target", "events[1].token"),
        ({"endpoint": "", "token": ""}, "missing_target", "events[1].token"),
        ({"endpoint": 42}, "missing_target", "events[1].token"),
        ({"deliveryId": None}, "missing_timestamp", "events[1].at"),
        ({"deliveryId": None, "at": "2026-01-01"}, "missing_timestamp", "events[1].at"),
        ({"deliveryId": None, "at": 1.5}, "missing_timestamp", "events[1].at"),
        ({"deliveryId": 7}, "invalid_digest", "events[1].deliveryId"),
        ({"deliveryId": "d" * 129}, "invalid_digest", "events[1].deliveryId"),
        ({"provider": "p\x00"}, "invalid_digest", "events[1].provider"),
    ],
)
def test_an_uncorrelatable_cleanup_fails_the_whole_digest(
    sender, subscribe, engine, bad, code, field
):
    valid, other = subscribe(), subscribe()
    broken = invalid_target(other.endpoint, delivery_id="d-2")
    for key, value in bad.items():
        if value is None:
            broken.pop(key, None)
        else:
            broken[key] = value
    raw = digest([invalid_target(valid.endpoint, delivery_id="d-1"), broken])
    response = sender.post(raw)

    assert response.status_code == 422
    assert response.json["error"]["code"] == code
    assert response.json["error"]["field"] == field
    # Not even the valid first event was applied.
    _nothing_applied(engine, valid.endpoint, other.endpoint)
    [received] = all_rows(engine, "feedback_digest")
    assert (received["result"], received["reason"]) == ("rejected", code)
    assert received["organization"] == "acme"
    assert received["applied"] == 0


@pytest.mark.parametrize(
    ("raw", "status", "code"),
    [
        (b"not json", 400, "invalid_json"),
        (b"[]", 400, "invalid_json"),
        (b'{"organization": "acme", "events": [], "x": NaN}', 400, "invalid_json"),
        (b'{"events": []}', 422, "missing_organization"),
        (b'{"organization": "", "events": []}', 422, "missing_organization"),
        (b'{"organization": "acme\\u0000", "events": []}', 422, "invalid_digest"),
        (b'{"organization": "acme\\ud800", "events": []}', 422, "invalid_digest"),
        (b'{"organization": "acme"}', 422, "invalid_digest"),
        (b'{"organization": "acme", "events": {}}', 422, "invalid_digest"),
        (b'{"organization": "acme", "events": [1]}', 422, "invalid_digest"),
        (b'{"organization": "acme", "events": [], "truncated": "no"}', 422, "invalid_digest"),
        (b'{"organization": "acme", "events": [], "eventsOmitted": -1}', 422, "invalid_digest"),
        (b'{"organization": "acme", "events": [], "eventsOmitted": true}', 422, "invalid_digest"),
    ],
)
def test_malformed_digests_are_refused(sender, engine, raw, status, code):
    response = sender.post(raw)
    assert response.status_code == status
    assert response.json["error"]["code"] == code
    assert count_rows(engine, "feedback_applied") == 0
    [received] = all_rows(engine, "feedback_digest")
    assert received["result"] == "rejected"


def test_a_digest_for_another_organization_is_refused(settings, clock, subscriptions):
    scoped = _app(settings, clock, feedback_organization="acme")
    try:
        sender = Sender(scoped.test_client(), clock)
        sub = subscriptions()
        sender.client.post("/api/push/subscribe", json={"subscription": sub.to_json()})
        event = invalid_target(sub.endpoint, delivery_id="d-1")
        refused = sender.post(digest([event], organization="globex"))
        assert refused.status_code == 422
        assert refused.json["error"]["code"] == "unknown_organization"
        engine = scoped.extensions["portal.db"].engine
        assert count_rows(engine, "feedback_applied") == 0
        accepted = sender.post(digest([event], organization="acme"))
        assert (accepted.status_code, accepted.json["revoked"]) == (200, 1)
        rows = {r["organization"]: r["result"] for r in all_rows(engine, "feedback_digest")}
        assert rows == {"globex": "rejected", "acme": "accepted"}
    finally:
        scoped.extensions["portal.db"].engine.dispose()


# --- acknowledging only after commit ---------------------------------------------------


def test_a_failure_between_marker_and_revocation_answers_503_and_keeps_nothing(
    sender, subscribe, engine, monkeypatch
):
    sub = subscribe()
    raw = digest([invalid_target(sub.endpoint, delivery_id="d-1")])
    marked: list[bool] = []
    real_mark = services._mark

    def mark_then_note(*args, **kwargs):
        inserted = real_mark(*args, **kwargs)
        marked.append(inserted)
        return inserted

    def revocation_fails(*_args, **_kwargs):
        raise OperationalError("UPDATE push_subscription", {}, Exception("connection lost"))

    monkeypatch.setattr(services, "_mark", mark_then_note)
    monkeypatch.setattr(services, "revoke_subscription", revocation_fails)
    before = _metric("portal_feedback_rejections_total", reason="unavailable")
    failed = sender.post(raw)

    assert marked == [True]  # the marker was written, then rolled back with the rest
    assert failed.status_code == 503
    assert failed.headers["Retry-After"] == "30"
    assert failed.json["error"]["code"] == "unavailable"
    _nothing_applied(engine, sub.endpoint)
    [received] = all_rows(engine, "feedback_digest")
    assert (received["result"], received["reason"], received["events"]) == (
        "rejected",
        "unavailable",
        1,
    )
    assert _metric("portal_feedback_rejections_total", reason="unavailable") == before + 1

    monkeypatch.undo()
    retried = sender.post(raw)  # the sender retries the window it was not acknowledged
    assert retried.status_code == 200
    assert (retried.json["applied"], retried.json["revoked"]) == (1, 1)
    assert _subscription(engine, sub.endpoint)["end_reason"] == "revoked_by_feedback"
    assert len(_feedback_events(engine)) == 1


def test_a_failed_commit_is_not_acknowledged(sender, subscribe, engine, monkeypatch):
    sub = subscribe()
    raw = digest([invalid_target(sub.endpoint, delivery_id="d-1")])
    real_apply = services.apply_digest

    def apply_then_break_the_commit(session, *args, **kwargs):
        report = real_apply(session, *args, **kwargs)
        session.execute(sa.text("INSERT INTO feedback_applied (id) VALUES (NULL)"))
        return report

    monkeypatch.setattr(services, "apply_digest", apply_then_break_the_commit)
    assert sender.post(raw).status_code == 503
    _nothing_applied(engine, sub.endpoint)
    monkeypatch.undo()
    assert sender.post(raw).json["revoked"] == 1


# --- replacements ----------------------------------------------------------------------


def test_a_replacement_registered_since_is_left_alone(sender, subscribe, engine, deliver):
    old = subscribe()
    sent_to_old = deliver(old.endpoint)
    new = subscribe()  # the same browser profile registered a new endpoint since
    old_row, new_row = _subscription(engine, old.endpoint), _subscription(engine, new.endpoint)
    assert old_row["subscriber_id"] == new_row["subscriber_id"]

    response = sender.post(digest([invalid_target(old.endpoint, delivery_id=sent_to_old)]))

    assert response.json["revoked"] == 1
    assert _subscription(engine, old.endpoint)["state"] == "revoked"
    assert _subscription(engine, new.endpoint)["state"] == "pending"
    [event] = _feedback_events(engine)
    assert _same_id(event["subscription_id"], old_row["id"])
    [marker] = all_rows(engine, "feedback_applied")
    assert _same_id(marker["subscription_id"], old_row["id"])


def test_a_classic_event_for_the_old_endpoint_leaves_the_replacement_alone(
    sender, subscribe, engine
):
    old, new = subscribe(), subscribe()
    response = sender.post(digest([invalid_target(old.endpoint, at=sender.now_ms())]))
    assert response.json["revoked"] == 1
    assert _subscription(engine, old.endpoint)["state"] == "revoked"
    assert _subscription(engine, new.endpoint)["state"] == "pending"


def test_a_rotated_endpoint_keeps_its_end_and_the_new_one_lives(
    sender, client, subscriptions, engine, deliver
):
    old, new = subscriptions(), subscriptions()
    client.post("/api/push/subscribe", json={"subscription": old.to_json()})
    sent_to_old = deliver(old.endpoint)
    changed = client.post(
        "/api/push/change", json={"oldEndpoint": old.endpoint, "subscription": new.to_json()}
    )
    assert changed.json["moved"] is True

    response = sender.post(digest([invalid_target(old.endpoint, delivery_id=sent_to_old)]))

    assert (response.json["applied"], response.json["revoked"]) == (1, 0)
    assert _subscription(engine, old.endpoint)["end_reason"] == "rotated"
    assert _subscription(engine, new.endpoint)["state"] == "pending"
    assert _feedback_events(engine) == []
    [marker] = all_rows(engine, "feedback_applied")
    assert marker["outcome"] == "already_ended"


def test_a_delivery_and_a_target_that_disagree_revoke_nothing(sender, subscribe, engine, deliver):
    old, new = subscribe(), subscribe()
    sent_to_new = deliver(new.endpoint)

    # Our delivery went to the new subscription but the event names the old endpoint.
    response = sender.post(digest([invalid_target(old.endpoint, delivery_id=sent_to_new)]))

    assert (response.json["applied"], response.json["revoked"]) == (1, 0)
    assert _subscription(engine, old.endpoint)["state"] == "pending"
    assert _subscription(engine, new.endpoint)["state"] == "pending"
    [marker] = all_rows(engine, "feedback_applied")
    assert marker["outcome"] == "unmatched"


def test_a_delivery_id_that_is_not_ours_falls_back_to_the_target(sender, subscribe, engine):
    sub = subscribe()
    for delivery_id in ("6f0f6f1e-9a1e-4f2a-9a7a-6d5f5f6a1b02", "99999", "9" * 30):
        response = sender.post(digest([invalid_target(sub.endpoint, delivery_id=delivery_id)]))
        assert response.status_code == 200
    assert _subscription(engine, sub.endpoint)["end_reason"] == "revoked_by_feedback"
    assert count_rows(engine, "feedback_applied") == 3


def test_the_delivery_lookup(app, subscribe, deliver, engine):
    from portal.db import db

    sub = subscribe()
    delivery_id = deliver(sub.endpoint)
    expected = _subscription(engine, sub.endpoint)["id"]
    with db.begin(app) as session:
        assert _same_id(services.subscription_for_delivery(session, delivery_id), expected)
        for other in ("0", str(int(delivery_id) + 1), "-1", "1e3", "١", str(2**63), "x"):
            assert services.subscription_for_delivery(session, other) is None


def test_metrics_count_accepted_digests_and_events(sender, subscribe):
    sub = subscribe()
    accepted = _metric("portal_feedback_digests_total", result="accepted")
    applied = _metric("portal_feedback_events_total", outcome="applied")
    duplicate = _metric("portal_feedback_events_total", outcome="duplicate")
    ignored = _metric("portal_feedback_events_total", outcome="ignored")
    revoked = _metric("portal_feedback_revocations_total")
    raw = digest([invalid_target(sub.endpoint, delivery_id="d"), {"reason": "TIMEOUT"}])
    sender.post(raw)
    sender.post(raw)
    assert _metric("portal_feedback_digests_total", result="accepted") == accepted + 2
    assert _metric("portal_feedback_events_total", outcome="applied") == applied + 1
    assert _metric("portal_feedback_events_total", outcome="duplicate") == duplicate + 1
    assert _metric("portal_feedback_events_total", outcome="ignored") == ignored + 2
    assert _metric("portal_feedback_revocations_total") == revoked + 1
    text = sender.client.get("/metrics").text
    assert 'portal_feedback_digests_total{result="accepted"}' in text


def test_revoked_at_is_the_receivers_clock(sender, subscribe, engine, clock):
    sub = subscribe()
    clock.advance(hours=3)
    sender.post(digest([invalid_target(sub.endpoint, delivery_id="d")]))
    revoked_at = _subscription(engine, sub.endpoint)["revoked_at"]
    if isinstance(revoked_at, str):
        revoked_at = dt.datetime.fromisoformat(revoked_at)
    assert revoked_at.replace(tzinfo=dt.UTC) == clock.now()


@pytest.mark.parametrize(
    "issued",
    [
        # WNS writes its %-escapes in lower case; the stored canonical form, in upper case.
        "https://wns2-by3p.notify.windows.com/w/?token=BQYAAADt%2fiuVT%2bPS9kY1Ui%3d%3d",
        "https://FCM.googleapis.com/fcm/send/dXkR7-abc:APA91bH",
    ],
)
@pytest.mark.parametrize("with_delivery", [False, True])
def test_feedback_naming_the_endpoint_as_its_push_service_spells_it_revokes_it(
    sender, subscriptions, client, engine, deliver, issued, with_delivery
):
    """The subscribe API keeps an endpoint in its canonical form; the push service's
    report names it as the service issued it. Both are one subscription."""
    sub = subscriptions()
    sub.endpoint = issued
    assert (
        client.post("/api/push/subscribe", json={"subscription": sub.to_json()}).status_code == 201
    )
    event = (
        invalid_target(issued, delivery_id=deliver(issued))
        if with_delivery
        else invalid_target(issued, at=1)
    )
    answer = sender.post(digest([event]))
    assert (answer.status_code, answer.json["revoked"]) == (200, 1)
    (row,) = all_rows(engine, "push_subscription")
    assert (row["state"], row["end_reason"]) == ("revoked", "revoked_by_feedback")
    (marker,) = all_rows(engine, "feedback_applied")
    assert marker["outcome"] == "revoked"
    assert bytes(marker["target_hash"]) == bytes(row["endpoint_hash"])
