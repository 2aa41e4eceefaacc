"""VAPID tokens (RFC 8292): what is signed, that it verifies, and how the cache renews."""

from __future__ import annotations

import base64
import datetime as dt
import itertools
import json
import threading

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from portal.clock import FrozenClock
from portal.config import b64url_decode, generate_vapid_keys
from portal.push.vapid import (
    MAX_LIFETIME,
    VapidKeyError,
    VapidSigner,
    push_service_origin,
)
from tests.conftest import make_settings

PRIVATE, PUBLIC = generate_vapid_keys()
SUBJECT = "mailto:ops@example.test"
FCM = "https://fcm.googleapis.com/fcm/send/abc"
MOZILLA = "https://updates.push.services.mozilla.com/wpush/v2/xyz"


def _part(segment: str) -> dict:
    return json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))


def _split(authorization: str) -> tuple[str, str]:
    scheme, _, rest = authorization.partition(" ")
    assert scheme == "vapid"
    t_part, k_part = rest.split(", ")
    assert t_part.startswith("t=")
    assert k_part.startswith("k=")
    return t_part[2:], k_part[2:]


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(dt.datetime(2026, 3, 1, 9, 30, tzinfo=dt.UTC))


@pytest.fixture
def signer(clock: FrozenClock) -> VapidSigner:
    return VapidSigner(PRIVATE, SUBJECT, public_key=PUBLIC, clock=clock)


def test_the_jwt_is_es256_over_aud_exp_sub_and_verifies_with_k(signer, clock):
    jwt, key = _split(signer.authorization(FCM))
    assert key == PUBLIC
    header_b64, claims_b64, signature_b64 = jwt.split(".")
    assert _part(header_b64) == {"typ": "JWT", "alg": "ES256"}
    claims = _part(claims_b64)
    assert claims == {
        "aud": "https://fcm.googleapis.com",
        "exp": int((clock.now() + dt.timedelta(hours=12)).timestamp()),
        "sub": SUBJECT,
    }
    signature = b64url_decode(signature_b64)
    assert len(signature) == 64  # raw r ‖ s, not DER
    public = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), b64url_decode(key))
    der = encode_dss_signature(
        int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big")
    )
    public.verify(der, f"{header_b64}.{claims_b64}".encode(), ec.ECDSA(hashes.SHA256()))
    tampered = _part(claims_b64) | {"aud": "https://evil.example"}
    forged = base64.urlsafe_b64encode(json.dumps(tampered).encode()).rstrip(b"=").decode()
    with pytest.raises(InvalidSignature):
        public.verify(der, f"{header_b64}.{forged}".encode(), ec.ECDSA(hashes.SHA256()))


def test_one_token_per_origin_is_reused(signer):
    first = signer.authorization(FCM)
    assert signer.authorization(FCM + "-other-subscription") == first
    assert signer.authorization("https://FCM.googleapis.com:443/fcm/send/x") == first
    mozilla = signer.authorization(MOZILLA)
    assert mozilla != first
    assert _part(_split(mozilla)[0].split(".")[1])["aud"] == (
        "https://updates.push.services.mozilla.com"
    )
    assert signer.stats.misses == 2
    assert signer.stats.hits == 2


def test_the_observer_sees_every_hit_and_miss(clock):
    seen: list[bool] = []
    signer = VapidSigner(PRIVATE, SUBJECT, clock=clock, on_lookup=seen.append)
    for _ in range(3):
        signer.authorization(FCM)
    assert seen == [False, True, True]


def test_renewed_once_less_than_the_margin_is_left(signer, clock):
    first = signer.token("https://fcm.googleapis.com")
    clock.advance(hours=11)  # exactly one hour left: still good
    assert signer.token("https://fcm.googleapis.com") == first
    clock.advance(seconds=1)
    second = signer.token("https://fcm.googleapis.com")
    assert second != first
    assert second.signed_at == clock.now()
    assert second.expires_at == clock.now() + MAX_LIFETIME
    assert second.expires_at - clock.now() <= dt.timedelta(hours=12)


def test_over_two_days_never_signed_twice_within_an_hour_and_never_stale(signer, clock):
    origins = ["https://fcm.googleapis.com", "https://web.push.apple.com"]
    signed_at: dict[str, list[dt.datetime]] = {o: [] for o in origins}
    start = clock.now()
    while clock.now() < start + dt.timedelta(days=2):
        for origin in origins:
            token = signer.token(origin)
            if not signed_at[origin] or signed_at[origin][-1] != token.signed_at:
                signed_at[origin].append(token.signed_at)
            left = token.expires_at - clock.now()
            assert dt.timedelta(hours=1) <= left <= dt.timedelta(hours=12)
        clock.advance(minutes=7)
    for times in signed_at.values():
        assert len(times) >= 4
        assert all(b - a >= dt.timedelta(hours=1) for a, b in itertools.pairwise(times))


def test_a_clock_stepped_back_gets_a_fresh_token(signer, clock):
    first = signer.token("https://fcm.googleapis.com")
    clock.advance(hours=-3)
    second = signer.token("https://fcm.googleapis.com")
    assert second != first
    assert second.expires_at - clock.now() <= MAX_LIFETIME


def test_a_short_lifetime_is_allowed_but_not_more_than_12_hours_or_hourly_signing(clock):
    short = VapidSigner(
        PRIVATE,
        SUBJECT,
        clock=clock,
        lifetime=dt.timedelta(hours=2),
        renew_margin=dt.timedelta(minutes=30),
    )
    token = short.token("https://fcm.googleapis.com")
    assert token.expires_at - clock.now() == dt.timedelta(hours=2)
    with pytest.raises(ValueError, match="at most"):
        VapidSigner(PRIVATE, SUBJECT, lifetime=dt.timedelta(hours=13))
    with pytest.raises(ValueError, match="between signatures"):
        VapidSigner(
            PRIVATE,
            SUBJECT,
            lifetime=dt.timedelta(hours=2),
            renew_margin=dt.timedelta(hours=1, minutes=1),
        )


def test_concurrent_callers_share_one_signature_per_origin(clock):
    signer = VapidSigner(PRIVATE, SUBJECT, clock=clock)
    origins = [f"https://push{i}.example.test" for i in range(3)]
    tokens: list[str] = []
    lock = threading.Lock()

    def work() -> None:
        mine = [signer.token(origins[i % 3]).jwt for i in range(300)]
        with lock:
            tokens.extend(mine)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(tokens)) == 3
    assert signer.stats.misses == 3
    assert signer.stats.hits == 8 * 300 - 3


def test_keys_and_subject_are_checked():
    other_private, other_public = generate_vapid_keys()
    with pytest.raises(VapidKeyError, match="does not match"):
        VapidSigner(PRIVATE, SUBJECT, public_key=other_public)
    with pytest.raises(VapidKeyError, match="32 bytes"):
        VapidSigner(PRIVATE[:20], SUBJECT)
    with pytest.raises(VapidKeyError, match="base64url"):
        VapidSigner("not base64 at all!", SUBJECT)
    with pytest.raises(ValueError, match="subject"):
        VapidSigner(other_private, "ops@example.test")
    assert VapidSigner(other_private, "https://example.test/contact").public_key == other_public


def test_from_settings_uses_the_configured_keys(tmp_path, clock):
    settings = make_settings("sqlite://", str(tmp_path))
    signer = VapidSigner.from_settings(settings, clock=clock)
    assert signer.public_key == settings.vapid_public_key
    assert signer.subject == settings.vapid_subject


@pytest.mark.parametrize(
    ("endpoint", "origin"),
    [
        ("https://fcm.googleapis.com/fcm/send/x", "https://fcm.googleapis.com"),
        ("https://FCM.GoogleAPIs.com:443/fcm/send/x", "https://fcm.googleapis.com"),
        ("https://127.0.0.1:8443/push/abc", "https://127.0.0.1:8443"),
        (
            "https://wns2-by3p.notify.windows.com/w/?token=a/b",
            "https://wns2-by3p.notify.windows.com",
        ),
        ("https://[::1]:9000/push/x", "https://[::1]:9000"),
        ("https://host.example?token=1", "https://host.example"),
    ],
)
def test_push_service_origin(endpoint, origin):
    assert push_service_origin(endpoint) == origin
    assert push_service_origin(endpoint) == origin  # the cached answer matches too


def test_push_service_origin_refuses_a_url_without_a_host():
    with pytest.raises(ValueError, match="host"):
        push_service_origin("https:///nothing")
