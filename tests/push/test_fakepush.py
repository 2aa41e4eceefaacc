"""The fake push service holds senders to RFC 8030 / 8292 and decrypts what it takes.

These tests talk to it with plain ``requests`` so they can send what the real transport
never would (no TTL, a bad token, an oversized body).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator

import pytest
import requests

from portal.clock import FrozenClock
from portal.config import b64url_decode
from portal.push.encryption import encrypt
from portal.push.vapid import VapidSigner
from tests.conftest import VAPID_PRIVATE, VAPID_PUBLIC
from tests.factories import BrowserSubscription, SubscriptionFactory
from tests.fakepush import (
    Answer,
    FakePushProcess,
    FakePushService,
    VapidRejected,
    fake_push_service,
    token_of,
    verify_vapid,
)
from tests.push.conftest import SUBJECT


@pytest.fixture
def session(fake_push: FakePushService) -> Iterator[requests.Session]:
    with requests.Session() as http:
        http.trust_env = False  # REQUESTS_CA_BUNDLE would override verify= otherwise
        http.verify = fake_push.ca_bundle
        yield http


def _headers(signer: VapidSigner, endpoint: str, **extra: str) -> dict[str, str]:
    headers = {
        "TTL": "60",
        "Content-Encoding": "aes128gcm",
        "Content-Type": "application/octet-stream",
        "Authorization": signer.authorization(endpoint),
    }
    headers.update(extra)
    return {k: v for k, v in headers.items() if v}


def _body(subscription: BrowserSubscription, plaintext: bytes = b"hi") -> bytes:
    return encrypt(plaintext, b64url_decode(subscription.p256dh), subscription.auth)


def test_a_good_request_is_taken_decrypted_and_recorded(fake_push, session, vapid_signer):
    sub = fake_push.subscribe()
    before = dt.datetime.now(dt.UTC)
    response = session.post(
        sub.endpoint,
        data=_body(sub, b"readable by the browser"),
        headers=_headers(vapid_signer, sub.endpoint, Urgency="high", Topic="spring-sale"),
    )
    assert response.status_code == 201
    assert response.headers["Location"].startswith(f"{fake_push.origin}/message/")
    [record] = fake_push.received(sub)
    assert record.plaintext == b"readable by the browser"
    assert record.headers["urgency"] == "high"
    assert record.headers["topic"] == "spring-sale"
    assert record.at >= before
    assert fake_push.plaintexts(sub) == [b"readable by the browser"]
    assert fake_push.stats.decrypted == 1


@pytest.mark.parametrize(
    ("change", "status", "reason"),
    [
        ({"TTL": ""}, 400, "TTL"),
        ({"TTL": "-5"}, 400, "TTL"),
        ({"Content-Encoding": "aesgcm"}, 400, "Content-Encoding"),
        ({"Urgency": "urgent"}, 400, "Urgency"),
        ({"Topic": "a" * 33}, 400, "Topic"),
        ({"Topic": "has spaces"}, 400, "Topic"),
        ({"Authorization": ""}, 401, "no Authorization"),
        ({"Authorization": "WebPush abc"}, 401, "scheme"),
    ],
)
def test_protocol_errors_are_refused(fake_push, session, vapid_signer, change, status, reason):
    sub = fake_push.subscribe()
    response = session.post(
        sub.endpoint, data=_body(sub), headers=_headers(vapid_signer, sub.endpoint, **change)
    )
    assert response.status_code == status
    assert reason in response.json()["error"]
    assert fake_push.plaintexts(sub) == []


def test_vapid_for_another_origin_expired_or_too_far_ahead_is_refused(fake_push, session):
    sub = fake_push.subscribe()
    elsewhere = VapidSigner(VAPID_PRIVATE, SUBJECT)
    now = dt.datetime.now(dt.UTC)
    stale = VapidSigner(VAPID_PRIVATE, SUBJECT, clock=FrozenClock(now - dt.timedelta(hours=13)))
    ahead = VapidSigner(VAPID_PRIVATE, SUBJECT, clock=FrozenClock(now + dt.timedelta(hours=13)))
    cases = [
        (elsewhere.authorization("https://fcm.googleapis.com/fcm/send/x"), "aud"),
        (stale.authorization(sub.endpoint), "expired"),
        (ahead.authorization(sub.endpoint), "24 hours"),
    ]
    for authorization, reason in cases:
        headers = {"TTL": "0", "Content-Encoding": "aes128gcm", "Authorization": authorization}
        response = session.post(sub.endpoint, data=_body(sub), headers=headers)
        assert response.status_code == 401
        assert reason in response.json()["error"]


def test_a_forged_signature_is_refused(fake_push, session, vapid_signer):
    sub = fake_push.subscribe()
    authorization = vapid_signer.authorization(sub.endpoint)
    jwt = authorization.split("t=")[1].split(",")[0]
    forged = authorization.replace(jwt, jwt[:-4] + ("AAAA" if not jwt.endswith("AAAA") else "BBBB"))
    headers = {"TTL": "0", "Content-Encoding": "aes128gcm", "Authorization": forged}
    response = session.post(sub.endpoint, data=_body(sub), headers=headers)
    assert response.status_code == 401


def test_verify_vapid_accepts_its_own_origin_only(vapid_signer):
    authorization = vapid_signer.authorization("https://fcm.googleapis.com/fcm/send/x")
    now = dt.datetime.now(dt.UTC)
    claims, key = verify_vapid(authorization, audience="https://fcm.googleapis.com", now=now)
    assert claims["sub"] == SUBJECT
    assert key == VAPID_PUBLIC
    with pytest.raises(VapidRejected, match="aud"):
        verify_vapid(authorization, audience="https://web.push.apple.com", now=now)


def test_bodies_over_4096_bytes_get_413(fake_push, session, vapid_signer):
    sub = fake_push.subscribe()
    response = session.post(
        sub.endpoint, data=b"\x00" * 4097, headers=_headers(vapid_signer, sub.endpoint)
    )
    assert response.status_code == 413


def test_a_body_that_does_not_decrypt_gets_400(fake_push, session, vapid_signer):
    sub, other = fake_push.subscribe(), fake_push.subscribe()
    response = session.post(
        sub.endpoint, data=_body(other), headers=_headers(vapid_signer, sub.endpoint)
    )
    assert response.status_code == 400
    assert "decrypt" in response.json()["error"]


def test_an_unknown_subscription_gets_404_unless_decryption_is_off(session, vapid_signer):
    with fake_push_service() as service:
        endpoint = service.endpoint("never-registered")
        session.verify = service.ca_bundle
        response = session.post(endpoint, data=b"x" * 100, headers=_headers(vapid_signer, endpoint))
        assert response.status_code == 404
    with fake_push_service(decrypt=False) as service:
        endpoint = service.endpoint("never-registered")
        session.verify = service.ca_bundle
        response = session.post(endpoint, data=b"x" * 100, headers=_headers(vapid_signer, endpoint))
        assert response.status_code == 201
        assert service.received("never-registered")[0].plaintext is None


def test_scripted_answers_come_in_order_then_the_default(fake_push, session, vapid_signer):
    sub = fake_push.subscribe()
    fake_push.script(
        sub,
        Answer.of(429, retry_after=30),
        Answer.of(503, retry_after="Wed, 21 Oct 2026 07:28:00 GMT"),
        410,
    )
    statuses = []
    for _ in range(4):
        response = session.post(
            sub.endpoint, data=_body(sub), headers=_headers(vapid_signer, sub.endpoint)
        )
        statuses.append((response.status_code, response.headers.get("Retry-After")))
    assert statuses == [
        (429, "30"),
        (503, "Wed, 21 Oct 2026 07:28:00 GMT"),
        (410, None),
        (201, None),
    ]
    # Only the accepted one was taken and read.
    assert [r.status for r in fake_push.received(sub)] == [429, 503, 410, 201]
    assert fake_push.plaintexts(sub) == [b"hi"]


def test_scripts_are_per_token(fake_push, session, vapid_signer):
    gone, fine = fake_push.subscribe(), fake_push.subscribe()
    fake_push.script(token_of(gone), 410)
    for sub, status in ((fine, 201), (gone, 410)):
        response = session.post(
            sub.endpoint, data=_body(sub), headers=_headers(vapid_signer, sub.endpoint)
        )
        assert response.status_code == status


def test_a_slow_answer_waits_and_a_reset_closes_without_answering(fake_push, session, vapid_signer):
    sub = fake_push.subscribe()
    fake_push.script(sub, Answer.slow(0.3), Answer.connection_reset())
    started = time.monotonic()
    response = session.post(
        sub.endpoint, data=_body(sub), headers=_headers(vapid_signer, sub.endpoint)
    )
    assert response.status_code == 201
    assert time.monotonic() - started >= 0.3
    with pytest.raises(requests.ConnectionError):
        session.post(sub.endpoint, data=_body(sub), headers=_headers(vapid_signer, sub.endpoint))
    assert fake_push.stats.resets == 1


def test_keep_alive_connections_are_counted(fake_push, session, vapid_signer):
    sub = fake_push.subscribe()
    for _ in range(5):
        session.post(sub.endpoint, data=_body(sub), headers=_headers(vapid_signer, sub.endpoint))
    assert fake_push.stats.connections == 1
    assert fake_push.stats.requests == 5


def test_other_paths_and_methods(fake_push, session, vapid_signer):
    assert session.post(f"{fake_push.origin}/elsewhere", data=b"").status_code == 404
    assert session.get(fake_push.endpoint("abc")).status_code == 405


def test_the_service_can_run_in_a_child_process(vapid_signer):
    with FakePushProcess() as service, requests.Session() as http:
        http.trust_env = False
        http.verify = service.ca_bundle
        sub = SubscriptionFactory()(base=service.endpoint_base)
        service.register_many([sub])
        response = http.post(
            sub.endpoint,
            data=_body(sub, b"over a pipe"),
            headers=_headers(vapid_signer, sub.endpoint),
        )
        assert response.status_code == 201
        assert service.stats()["decrypted"] == 1


def test_a_decryption_sample_opens_the_first_messages_then_every_kth(session, vapid_signer):
    with fake_push_service(decrypt_sample=(2, 3)) as service:
        session.verify = service.ca_bundle
        subs = [service.subscribe() for _ in range(7)]
        for n, sub in enumerate(subs, start=1):
            response = session.post(
                sub.endpoint,
                data=_body(sub, f"message {n}".encode()),
                headers=_headers(vapid_signer, sub.endpoint),
            )
            assert response.status_code == 201
        # Messages 1 and 2 (the first two), then 3 and 6 (every third).
        assert service.samples() == [
            (token_of(subs[n - 1]), f"message {n}".encode()) for n in (1, 2, 3, 6)
        ]
        assert [r.plaintext is not None for r in service.received()] == [
            True, True, True, False, False, True, False,
        ]  # fmt: skip
        assert service.stats.accepted == service.stats.distinct_tokens == 7
        assert service.stats.decrypted == 4

        # Not sampled, still checked: framing, registration, headers.
        unsampled = subs[0]
        garbage = session.post(
            unsampled.endpoint, data=b"x" * 200, headers=_headers(vapid_signer, unsampled.endpoint)
        )
        assert garbage.status_code == 400
        assert "aes128gcm" in garbage.json()["error"]
        endpoint = service.endpoint("never-registered")
        unknown = session.post(
            endpoint, data=_body(unsampled), headers=_headers(vapid_signer, endpoint)
        )
        assert unknown.status_code == 404
        no_ttl = session.post(
            unsampled.endpoint,
            data=_body(unsampled),
            headers=_headers(vapid_signer, unsampled.endpoint, TTL=""),
        )
        assert no_ttl.status_code == 400
        assert service.stats.accepted == 7

        service.forget_tokens()
        assert service.stats.distinct_tokens == 0


def test_a_decryption_sample_must_make_sense():
    with pytest.raises(ValueError, match="decrypt_sample"):
        FakePushService(decrypt_sample=(100, 0))
