"""The digest signature: ``t=<unix-millis>,v1=<hex>``, HMAC-SHA256 over ``<t>.<raw body>``.

Verification works on the raw request bytes, before anything parses them: re-serialised
JSON (other whitespace, other key order) is different bytes and must not verify.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Sequence
from dataclasses import dataclass

SCHEME = "v1"
_MAC_HEX_LENGTH = hashlib.sha256().digest_size * 2
# Milliseconds up to 15 digits reach the year 33658; longer is not a timestamp.
_TIMESTAMP = re.compile(r"^[0-9]{1,15}$")
_HEX = re.compile(r"^[0-9a-fA-F]+$")


class SignatureError(Exception):
    """The request is not authentically signed; ``reason`` is a short machine code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class SignatureHeader:
    timestamp_ms: int
    macs: tuple[bytes, ...]


def parse_header(value: str | None) -> SignatureHeader:
    """Parse ``t=<unix-millis>,v1=<hex>[,v1=<hex>…]``.

    Several ``v1`` values are accepted (a sender signing with two secrets while it
    rotates); parts of other schemes are skipped so a sender may add a newer scheme
    beside ``v1``. Exactly one ``t`` and at least one well-formed ``v1`` are required.
    """
    if value is None or not value.strip():
        raise SignatureError("missing_signature", "the request carries no signature")
    timestamp: int | None = None
    macs: list[bytes] = []
    for part in value.split(","):
        key, sep, item = part.strip().partition("=")
        if not sep:
            raise SignatureError("malformed_signature", "a signature part is not key=value")
        if key == "t":
            if timestamp is not None or not _TIMESTAMP.fullmatch(item):
                raise SignatureError(
                    "malformed_signature", "t must appear once, as unix milliseconds"
                )
            timestamp = int(item)
        elif key == SCHEME:
            if len(item) != _MAC_HEX_LENGTH or not _HEX.fullmatch(item):
                raise SignatureError(
                    "malformed_signature", f"v1 must be {_MAC_HEX_LENGTH} hexadecimal digits"
                )
            macs.append(bytes.fromhex(item))
    if timestamp is None or not macs:
        raise SignatureError("malformed_signature", "the signature needs t and v1")
    return SignatureHeader(timestamp, tuple(macs))


def sign(secret: str, timestamp_ms: int, body: bytes) -> bytes:
    """HMAC-SHA256 over ``<t>.<raw body>`` with the UTF-8 bytes of the secret."""
    message = str(timestamp_ms).encode("ascii") + b"." + body
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).digest()


def header_value(secret: str, timestamp_ms: int, body: bytes) -> str:
    return f"t={timestamp_ms},{SCHEME}={sign(secret, timestamp_ms, body).hex()}"


def verify(
    header: SignatureHeader,
    body: bytes,
    secrets: Sequence[str],
    *,
    now_ms: int,
    max_age_seconds: int,
) -> int:
    """The index of the secret that signed ``body``, or :class:`SignatureError`.

    Every configured secret is tried (two during a rotation), each MAC compared in
    constant time. The age check comes after the MAC, so "expired" is only ever said
    of a request that was authentically signed (a replay or a skewed clock).
    """
    if not secrets:
        raise SignatureError("not_configured", "no FEEDBACK_SECRETS are configured")
    matched: int | None = None
    for index, secret in enumerate(secrets):
        expected = sign(secret, header.timestamp_ms, body)
        for mac in header.macs:
            if hmac.compare_digest(expected, mac) and matched is None:
                matched = index
    if matched is None:
        raise SignatureError("invalid_signature", "the signature does not match the body")
    if abs(now_ms - header.timestamp_ms) > max_age_seconds * 1000:
        raise SignatureError(
            "signature_expired", "the signature's timestamp is outside the allowed window"
        )
    return matched
