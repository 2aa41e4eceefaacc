"""Message encryption for Web Push (RFC 8291) in the ``aes128gcm`` content coding (RFC 8188).

Every message gets a fresh ephemeral P-256 key pair and a fresh 16-byte salt, so no two
messages ever share an AES-GCM key and nonce. The body is one record:

    salt(16) ‖ rs(4, big-endian) ‖ idlen(1) = 65 ‖ as_public(65) ‖ AES-128-GCM(plaintext ‖ 0x02)

Built on ``cryptography`` directly (about 0.12 ms of CPU a message, half of it the ECDH)
rather than through ``http_ece``, which adds its own per-call overhead.
"""

from __future__ import annotations

import hmac
import os
import struct

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

CONTENT_ENCODING = "aes128gcm"
SALT_LENGTH = 16
AUTH_SECRET_LENGTH = 16
PUBLIC_KEY_LENGTH = 65
TAG_LENGTH = 16
HEADER_LENGTH = SALT_LENGTH + 4 + 1 + PUBLIC_KEY_LENGTH  # 86
RECORD_OVERHEAD = TAG_LENGTH + 1  # the GCM tag and the 0x02 padding delimiter
DEFAULT_RECORD_SIZE = 4096
MIN_RECORD_SIZE = 18  # RFC 8188 §2: a record must hold the tag, the delimiter and a byte

MAX_BODY_BYTES = 4096
"""Largest encrypted body every push service must accept (RFC 8030 §7.2)."""

MAX_PLAINTEXT_BYTES = MAX_BODY_BYTES - HEADER_LENGTH - RECORD_OVERHEAD  # 3993
"""Largest plaintext whose encrypted body still fits in :data:`MAX_BODY_BYTES`."""

_CURVE = ec.SECP256R1()
_KEY_INFO_PREFIX = b"WebPush: info\x00"
_CEK_INFO = b"Content-Encoding: aes128gcm\x00"
_NONCE_INFO = b"Content-Encoding: nonce\x00"
_LAST_RECORD_DELIMITER = b"\x02"


class PayloadTooLarge(ValueError):
    """The plaintext would not fit in one push message."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"payload is {size} bytes; at most {limit} bytes fit in one push message")
        self.size = size
        self.limit = limit


class InvalidSubscriptionKeys(ValueError):
    """The subscription's p256dh or auth value cannot be used to encrypt."""


def _hkdf(salt: bytes, ikm: bytes, info: bytes, length: int) -> bytes:
    """RFC 5869 HKDF-SHA256 for lengths up to 32 bytes (one expansion block), on
    ``hmac.digest``: a tenth of the CPU of building a ``cryptography`` HKDF object."""
    prk = hmac.digest(salt, ikm, "sha256")
    return hmac.digest(prk, info + b"\x01", "sha256")[:length]


def max_plaintext_bytes(record_size: int = DEFAULT_RECORD_SIZE) -> int:
    """Largest plaintext :func:`encrypt` accepts for ``record_size``.

    Bounded both by the one record (``record_size`` − 17) and by the 4096-byte body limit.
    """
    return min(MAX_PLAINTEXT_BYTES, record_size - RECORD_OVERHEAD)


def encrypted_size(plaintext_length: int) -> int:
    """Size of the body :func:`encrypt` produces for a plaintext of this many bytes."""
    return HEADER_LENGTH + plaintext_length + RECORD_OVERHEAD


def encrypt(
    plaintext: bytes,
    p256dh: bytes,
    auth: bytes,
    *,
    record_size: int = DEFAULT_RECORD_SIZE,
    salt: bytes | None = None,
    ephemeral_key: ec.EllipticCurvePrivateKey | None = None,
) -> bytes:
    """Encrypt ``plaintext`` for one subscription; returns the whole request body.

    ``p256dh`` is the subscription's 65-byte uncompressed P-256 point and ``auth`` its
    16-byte secret (both decoded from base64url). ``salt`` and ``ephemeral_key`` exist
    for known-answer tests only: reusing either across messages breaks confidentiality,
    so production callers leave them unset and get fresh ones per message.

    Raises :class:`PayloadTooLarge` when the plaintext does not fit in one message and
    :class:`InvalidSubscriptionKeys` when the keys are malformed.
    """
    if record_size < MIN_RECORD_SIZE or record_size > 0xFFFFFFFF:
        raise ValueError(f"record_size must be between {MIN_RECORD_SIZE} and 2^32 − 1")
    limit = max_plaintext_bytes(record_size)
    if len(plaintext) > limit:
        raise PayloadTooLarge(len(plaintext), limit)
    if len(auth) != AUTH_SECRET_LENGTH:
        raise InvalidSubscriptionKeys(f"auth must be {AUTH_SECRET_LENGTH} bytes, not {len(auth)}")
    if len(p256dh) != PUBLIC_KEY_LENGTH or p256dh[0] != 0x04:
        raise InvalidSubscriptionKeys("p256dh must be a 65-byte uncompressed P-256 point")
    try:
        ua_public = ec.EllipticCurvePublicKey.from_encoded_point(_CURVE, p256dh)
    except ValueError:
        raise InvalidSubscriptionKeys("p256dh is not a point on P-256") from None

    if salt is None:
        salt = os.urandom(SALT_LENGTH)
    elif len(salt) != SALT_LENGTH:
        raise ValueError(f"salt must be {SALT_LENGTH} bytes")
    if ephemeral_key is None:
        ephemeral_key = ec.generate_private_key(_CURVE)
    as_public = ephemeral_key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    shared_secret = ephemeral_key.exchange(ec.ECDH(), ua_public)

    # RFC 8291 §3.4: mix the auth secret and both public keys into the input key material.
    ikm = _hkdf(auth, shared_secret, _KEY_INFO_PREFIX + p256dh + as_public, 32)
    # RFC 8188 §2.2–2.3: the content-encryption key and the nonce, from the message salt
    # (one extraction, two expansions).
    prk = hmac.digest(salt, ikm, "sha256")
    cek = hmac.digest(prk, _CEK_INFO + b"\x01", "sha256")[:16]
    nonce = hmac.digest(prk, _NONCE_INFO + b"\x01", "sha256")[:12]

    ciphertext = AESGCM(cek).encrypt(nonce, plaintext + _LAST_RECORD_DELIMITER, None)
    header = salt + struct.pack("!IB", record_size, PUBLIC_KEY_LENGTH) + as_public
    return header + ciphertext
