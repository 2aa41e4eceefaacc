"""The browser's half of RFC 8291: open an ``aes128gcm`` push message body.

Written separately from ``portal.push.encryption`` on purpose: a shared mistake in
the key derivation would let a round trip pass, an independent reading of the RFC does
not. Handles any number of records (RFC 8188 §2), as browsers do, so bodies from other
encoders (``http_ece``) open too.
"""

from __future__ import annotations

import hmac
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM


class DecryptError(ValueError):
    """The body is malformed or does not open with these keys."""


def _hkdf(salt: bytes, ikm: bytes, info: bytes, length: int) -> bytes:
    # RFC 5869 with a single expansion block (every length here is ≤ 32).
    prk = hmac.digest(salt, ikm, "sha256")
    return hmac.digest(prk, info + b"\x01", "sha256")[:length]


def decrypt(
    body: bytes,
    private_key: ec.EllipticCurvePrivateKey,
    auth: bytes,
    *,
    ua_public: bytes | None = None,
) -> bytes:
    """The plaintext of ``body``, as the browser holding ``private_key`` and ``auth`` reads it.

    ``ua_public`` (the browser's p256dh point) is derived from the key when not given."""
    if len(body) < 21:
        raise DecryptError("body shorter than the aes128gcm header")
    salt = body[:16]
    (record_size,) = struct.unpack("!I", body[16:20])
    key_id_length = body[20]
    if record_size < 18:
        raise DecryptError(f"record size {record_size} is below the minimum of 18")
    if key_id_length != 65:
        raise DecryptError(f"key id of {key_id_length} bytes is not a P-256 public key")
    as_public = body[21:86]
    records = body[86:]
    try:
        sender = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), as_public)
    except ValueError:
        raise DecryptError("key id is not a point on P-256") from None
    if ua_public is None:
        ua_public = private_key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
    shared = private_key.exchange(ec.ECDH(), sender)
    ikm = _hkdf(auth, shared, b"WebPush: info\x00" + ua_public + as_public, 32)
    cek = AESGCM(_hkdf(salt, ikm, b"Content-Encoding: aes128gcm\x00", 16))
    base_nonce = int.from_bytes(_hkdf(salt, ikm, b"Content-Encoding: nonce\x00", 12), "big")

    if not records:
        raise DecryptError("no records")
    out = bytearray()
    chunks = [records[i : i + record_size] for i in range(0, len(records), record_size)]
    for seq, chunk in enumerate(chunks):
        nonce = (base_nonce ^ seq).to_bytes(12, "big")
        try:
            padded = cek.decrypt(nonce, chunk, None)
        except InvalidTag:
            raise DecryptError(f"record {seq} does not authenticate") from None
        data = padded.rstrip(b"\x00")
        last = seq == len(chunks) - 1
        if not data or data[-1] != (2 if last else 1):
            raise DecryptError(f"record {seq} has a wrong padding delimiter")
        out += data[:-1]
    return bytes(out)
