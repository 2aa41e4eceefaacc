"""RFC 8291 message encryption: the RFC's own example, round trips, limits, interop."""

from __future__ import annotations

import os

import http_ece
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given, settings
from hypothesis import strategies as st

from portal.config import b64url_decode
from portal.push.encryption import (
    HEADER_LENGTH,
    MAX_BODY_BYTES,
    MAX_PLAINTEXT_BYTES,
    InvalidSubscriptionKeys,
    PayloadTooLarge,
    encrypt,
    encrypted_size,
    max_plaintext_bytes,
)
from tests.push_decrypt import DecryptError, decrypt

# RFC 8291 Appendix A, verbatim.
RFC_PLAINTEXT = b"When I grow up, I want to be a watermelon"
RFC_AS_PRIVATE = "yfWPiYE-n46HLnH0KqZOF1fJJU3MYrct3AELtAQ-oRw"
RFC_AS_PUBLIC = (
    "BP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A8"
)
RFC_UA_PRIVATE = "q1dXpw3UpT5VOmu_cf_v6ih07Aems3njxI-JWgLcM94"
RFC_UA_PUBLIC = (
    "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4"
)
RFC_AUTH = "BTBZMqHH6r4Tts7J_aSIgg"
RFC_SALT = "DGv6ra1nlYgDCS1FRnbzlw"
RFC_BODY = (
    "DGv6ra1nlYgDCS1FRnbzlwAAEABBBP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27ml"
    "mlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A_yl95bQpu6cVPT"
    "pK4Mqgkf1CXztLVBSt2Ks3oZwbuwXPXLWyouBWLVWGNWQexSgSxsj_Qulcy4a-fN"
)


def _private(b64: str) -> ec.EllipticCurvePrivateKey:
    return ec.derive_private_key(int.from_bytes(b64url_decode(b64), "big"), ec.SECP256R1())


def _public_bytes(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )


@pytest.fixture
def browser() -> tuple[ec.EllipticCurvePrivateKey, bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    return key, _public_bytes(key), os.urandom(16)


def test_rfc8291_appendix_a_byte_for_byte():
    as_key = _private(RFC_AS_PRIVATE)
    assert _public_bytes(as_key) == b64url_decode(RFC_AS_PUBLIC)
    body = encrypt(
        RFC_PLAINTEXT,
        b64url_decode(RFC_UA_PUBLIC),
        b64url_decode(RFC_AUTH),
        salt=b64url_decode(RFC_SALT),
        ephemeral_key=as_key,
    )
    assert body == b64url_decode(RFC_BODY)


def test_rfc8291_appendix_a_body_decrypts_with_the_user_agent_key():
    plaintext = decrypt(b64url_decode(RFC_BODY), _private(RFC_UA_PRIVATE), b64url_decode(RFC_AUTH))
    assert plaintext == RFC_PLAINTEXT


def test_header_layout(browser):
    _, p256dh, auth = browser
    body = encrypt(b"hello", p256dh, auth)
    assert len(body) == encrypted_size(5) == HEADER_LENGTH + 5 + 17
    assert body[16:20] == (4096).to_bytes(4, "big")
    assert body[20] == 65
    assert body[21] == 0x04  # keyid is the uncompressed ephemeral public key
    assert body[21:86] != p256dh


@settings(max_examples=40, deadline=None)
@given(st.binary(min_size=0, max_size=MAX_PLAINTEXT_BYTES))
def test_round_trip(plaintext):
    key = ec.generate_private_key(ec.SECP256R1())
    auth = os.urandom(16)
    body = encrypt(plaintext, _public_bytes(key), auth)
    assert len(body) <= MAX_BODY_BYTES
    assert decrypt(body, key, auth) == plaintext


def test_fresh_salt_and_ephemeral_key_per_message(browser):
    _, p256dh, auth = browser
    first, second = encrypt(b"same", p256dh, auth), encrypt(b"same", p256dh, auth)
    assert first[:16] != second[:16]
    assert first[21:86] != second[21:86]
    assert first[86:] != second[86:]


def test_largest_payload_fills_exactly_4096_bytes(browser):
    key, p256dh, auth = browser
    assert MAX_PLAINTEXT_BYTES == 3993
    body = encrypt(b"x" * MAX_PLAINTEXT_BYTES, p256dh, auth)
    assert len(body) == 4096
    assert decrypt(body, key, auth) == b"x" * MAX_PLAINTEXT_BYTES


def test_one_byte_more_is_refused_with_the_sizes(browser):
    _, p256dh, auth = browser
    with pytest.raises(PayloadTooLarge, match="3994 bytes; at most 3993") as caught:
        encrypt(b"x" * (MAX_PLAINTEXT_BYTES + 1), p256dh, auth)
    assert (caught.value.size, caught.value.limit) == (3994, 3993)


def test_a_smaller_record_size_lowers_the_limit(browser):
    key, p256dh, auth = browser
    assert max_plaintext_bytes(100) == 83
    body = encrypt(b"y" * 83, p256dh, auth, record_size=100)
    assert decrypt(body, key, auth) == b"y" * 83
    with pytest.raises(PayloadTooLarge):
        encrypt(b"y" * 84, p256dh, auth, record_size=100)
    with pytest.raises(ValueError, match="record_size"):
        encrypt(b"", p256dh, auth, record_size=17)


@pytest.mark.parametrize(
    ("p256dh", "auth"),
    [
        (b"\x04" + b"\x01" * 64, os.urandom(16)),  # not on the curve
        (b"\x04" * 33, os.urandom(16)),  # compressed length
        (None, b"short"),
    ],
    # Named, not shown: ids made of random bytes differ between pytest-xdist's workers.
    ids=["not-on-the-curve", "compressed-length", "short-auth"],
)
def test_malformed_keys_are_refused(browser, p256dh, auth):
    with pytest.raises(InvalidSubscriptionKeys):
        encrypt(b"hi", p256dh or browser[1], auth)


def test_a_wrong_auth_secret_does_not_open(browser):
    key, p256dh, auth = browser
    body = encrypt(b"secret", p256dh, auth)
    with pytest.raises(DecryptError):
        decrypt(body, key, os.urandom(16))


def test_our_body_opens_with_http_ece(browser):
    key, p256dh, auth = browser
    body = encrypt(b"interop: ours to http_ece", p256dh, auth)
    opened = http_ece.decrypt(body, private_key=key, auth_secret=auth, version="aes128gcm")
    assert opened == b"interop: ours to http_ece"


def test_http_ece_body_opens_with_our_helper_and_matches_ours(browser):
    key, p256dh, auth = browser
    sender = ec.generate_private_key(ec.SECP256R1())
    salt = os.urandom(16)
    theirs = http_ece.encrypt(
        b"interop: http_ece to ours",
        salt=salt,
        private_key=sender,
        dh=p256dh,
        auth_secret=auth,
        version="aes128gcm",
    )
    assert decrypt(theirs, key, auth) == b"interop: http_ece to ours"
    ours = encrypt(b"interop: http_ece to ours", p256dh, auth, salt=salt, ephemeral_key=sender)
    assert ours == theirs
