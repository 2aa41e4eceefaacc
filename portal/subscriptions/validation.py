"""Validating a browser's PushSubscription before anything touches the database.

Every rule here rejects with a :class:`ValidationError` naming the field, so the API can
answer with a precise message and write nothing.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from cryptography.hazmat.primitives.asymmetric import ec

from portal.errors import ValidationError
from portal.subscriptions.models import PushService

_B64URL = re.compile(r"^[A-Za-z0-9_-]*$")
_HOST_LABELS = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")
P256DH_LENGTH = 65
AUTH_LENGTH = 16
# Pushing a date past this is nonsense from a client; it also keeps datetime in range.
_MAX_EXPIRATION_MS = 32503680000000  # 3000-01-01


def endpoint_hash(endpoint: str) -> bytes:
    """SHA-256 of the exact endpoint: the subscription's identity (32 bytes)."""
    return hashlib.sha256(endpoint.encode("utf-8")).digest()


def decode_b64url(text: str, *, field: str, length: int) -> bytes:
    """Strict base64url: no padding, no ``+`` or ``/``, canonical, of an exact length."""
    if not _B64URL.fullmatch(text):
        raise ValidationError(
            "invalid_base64url",
            f"{field} must be base64url without padding (A–Z, a–z, 0–9, '-' and '_')",
            field,
        )
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise ValidationError(
            "invalid_base64url", f"{field} is not valid base64url", field
        ) from None
    if len(raw) != length:
        raise ValidationError(
            "invalid_length", f"{field} must decode to {length} bytes, not {len(raw)}", field
        )
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != text:
        raise ValidationError("invalid_base64url", f"{field} is not canonical base64url", field)
    return raw


@dataclass(frozen=True)
class AllowedHost:
    host: str
    port: int | None
    wildcard: bool

    @classmethod
    def parse(cls, entry: str) -> AllowedHost:
        entry = entry.strip().lower()
        port: int | None = None
        host = entry
        if entry.startswith("["):  # [v6]:port
            close = entry.index("]")
            host, rest = entry[1:close], entry[close + 1 :]
            if rest:
                port = int(rest.lstrip(":"))
        elif entry.count(":") == 1:
            host, port_text = entry.split(":")
            port = int(port_text)
        wildcard = host.startswith("*.")
        return cls(host[2:] if wildcard else host, port, wildcard)

    def matches(self, host: str, port: int) -> bool:
        if port != (self.port if self.port is not None else 443):
            return False
        if self.wildcard:
            # A suffix on a dot boundary with something before it: never a substring.
            prefix = host[: -len(self.host)] if host.endswith(self.host) else ""
            return len(prefix) > 1 and prefix.endswith(".")
        return host == self.host


class HostAllowList:
    def __init__(self, entries: Iterable[str]) -> None:
        self.entries = tuple(AllowedHost.parse(e) for e in entries)

    def allows(self, host: str, port: int) -> bool:
        return any(entry.matches(host, port) for entry in self.entries)


def push_service_for(host: str) -> PushService:
    """The push service behind a host; stored, never inferred again at send time."""

    def under(domain: str) -> bool:
        return host == domain or host.endswith("." + domain)

    if under("googleapis.com"):
        return PushService.FCM
    if under("push.services.mozilla.com"):
        return PushService.AUTOPUSH
    if under("push.apple.com"):
        return PushService.APPLE
    if under("notify.windows.com"):
        return PushService.WNS
    return PushService.OTHER


@dataclass(frozen=True)
class ValidEndpoint:
    endpoint: str
    host: str
    push_service: PushService

    @property
    def hash(self) -> bytes:
        return endpoint_hash(self.endpoint)


def validate_endpoint(
    value: object, *, allowed: HostAllowList, max_length: int, field: str = "endpoint"
) -> ValidEndpoint:
    text = require_string(value, field)
    if len(text) > max_length:
        raise ValidationError(
            "endpoint_too_long", f"{field} is longer than {max_length} characters", field
        )
    if not text.isascii() or any(ch.isspace() or ord(ch) < 0x20 or ch == "\\" for ch in text):
        raise ValidationError(
            "invalid_endpoint", f"{field} has characters a push endpoint never has", field
        )
    try:
        parts = urlsplit(text)
    except ValueError:  # e.g. "https://[::1/x": an unclosed IPv6 bracket
        raise ValidationError("invalid_endpoint", f"{field} is not a URL", field) from None
    if parts.scheme != "https":
        raise ValidationError("insecure_endpoint", f"{field} must be an https:// URL", field)
    if "@" in parts.netloc:
        raise ValidationError("invalid_endpoint", f"{field} must not carry user information", field)
    host = parts.hostname or ""
    try:
        port = parts.port or 443
    except ValueError:
        raise ValidationError("invalid_endpoint", f"{field} has an invalid port", field) from None
    if not host or (not _HOST_LABELS.fullmatch(host) and ":" not in host):
        raise ValidationError("invalid_endpoint", f"{field} has no valid host", field)
    if not allowed.allows(host, port):
        raise ValidationError(
            "push_service_not_allowed", f"{field} is not on an allowed push service", field
        )
    if parts.path in ("", "/"):
        raise ValidationError("invalid_endpoint", f"{field} has no registration path", field)
    return ValidEndpoint(text, host, push_service_for(host))


def validate_p256dh(value: object, field: str = "subscription.keys.p256dh") -> str:
    text = require_string(value, field)
    raw = decode_b64url(text, field=field, length=P256DH_LENGTH)
    if raw[0] != 0x04:
        raise ValidationError("invalid_key", f"{field} must be an uncompressed P-256 point", field)
    try:
        ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), raw)
    except ValueError:
        raise ValidationError("invalid_key", f"{field} is not a point on P-256", field) from None
    return text


def validate_auth(value: object, field: str = "subscription.keys.auth") -> bytes:
    return decode_b64url(require_string(value, field), field=field, length=AUTH_LENGTH)


def validate_expiration(value: object, field: str) -> dt.datetime | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(
            "invalid_type", f"{field} must be a number or null", field, status=400
        )
    if not 0 <= value < _MAX_EXPIRATION_MS:
        raise ValidationError("invalid_value", f"{field} is out of range", field)
    return dt.datetime.fromtimestamp(value / 1000, tz=dt.UTC)


@dataclass(frozen=True)
class ValidSubscription:
    endpoint: ValidEndpoint
    p256dh: str
    auth: bytes
    expiration_time: dt.datetime | None


def validate_subscription(
    value: object, *, allowed: HostAllowList, max_length: int, field: str = "subscription"
) -> ValidSubscription:
    """A PushSubscription's ``toJSON()`` form: endpoint, expirationTime, keys."""
    sub = require_object(value, field)
    keys = require_object(require_key(sub, "keys", field), f"{field}.keys")
    endpoint = validate_endpoint(
        require_key(sub, "endpoint", field),
        allowed=allowed,
        max_length=max_length,
        field=f"{field}.endpoint",
    )
    p256dh = validate_p256dh(require_key(keys, "p256dh", f"{field}.keys"), f"{field}.keys.p256dh")
    auth = validate_auth(require_key(keys, "auth", f"{field}.keys"), f"{field}.keys.auth")
    expiration = validate_expiration(sub.get("expirationTime"), f"{field}.expirationTime")
    return ValidSubscription(endpoint, p256dh, auth, expiration)


def require_object(value: object, field: str) -> Mapping[str, Any]:
    if value is None:
        raise ValidationError("missing_field", f"{field} is required", field, status=400)
    if not isinstance(value, dict):
        raise ValidationError("invalid_type", f"{field} must be an object", field, status=400)
    return value


def require_key(obj: Mapping[str, Any], key: str, parent: str | None) -> Any:
    field = f"{parent}.{key}" if parent else key
    value = obj.get(key)
    if value is None:
        raise ValidationError("missing_field", f"{field} is required", field, status=400)
    return value


def require_string(value: object, field: str) -> str:
    if value is None:
        raise ValidationError("missing_field", f"{field} is required", field, status=400)
    if not isinstance(value, str):
        raise ValidationError("invalid_type", f"{field} must be a string", field, status=400)
    if not value:
        raise ValidationError("missing_field", f"{field} must not be empty", field, status=400)
    if "\x00" in value or not _encodable(value):
        # JSON can carry both ("\u0000", "\ud800"); neither is text a column can hold, and
        # an unpaired surrogate cannot even be hashed.
        raise ValidationError(
            "invalid_text", f"{field} has a NUL or an unpaired surrogate character", field
        )
    return value


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
