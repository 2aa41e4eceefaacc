"""Validating a browser's PushSubscription before anything touches the database.

Every rule here rejects with a :class:`ValidationError` naming the field, so the API can
answer with a precise message and write nothing.

The endpoint rules live here too, once: :func:`parse_endpoint` is the one parser of a push
endpoint and :func:`canonical_endpoint` its one canonical spelling. The registry stores
that spelling, :func:`endpoint_hash` (the subscription's identity) hashes it, every
route that looks a row up by endpoint goes through it, and the sender's own check
(``PushRequest``) is the same parser, so whatever is accepted here is sent.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import idna
from cryptography.hazmat.primitives.asymmetric import ec

from portal.errors import ValidationError
from portal.subscriptions.models import PushService

_B64URL = re.compile(r"^[A-Za-z0-9_-]*$")
_HOST_LABELS = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")
# RFC 3986: what a path and a query may hold besides percent-escapes (pchar, "/", "?").
_URI_TEXT = re.compile(r"^[A-Za-z0-9\-._~!$&'()*+,;=:@/?%]*$")
_NEVER_IN_ENDPOINT = re.compile(r"[\s\x00-\x1f\x7f\\]")  # white space, controls, "\\"
_ESCAPE = re.compile(r"%(?:([0-9A-Fa-f]{2})|)")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_NUMERIC_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")
P256DH_LENGTH = 65
AUTH_LENGTH = 16
# Pushing a date past this is nonsense from a client; it also keeps datetime in range.
_MAX_EXPIRATION_MS = 32503680000000  # 3000-01-01


class EndpointRefused(ValueError):
    """Text that is not a push endpoint; ``code`` is the API's error code for it."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(frozen=True)
class EndpointParts:
    """A parsed push endpoint, already canonical: lower-case host (punycode for an
    internationalised name, no trailing dot; an IP address in its shortest form), the
    port only when it is not 443, the path and query as RFC 3986 normalises them."""

    host: str
    port: int
    path: str
    query: str

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = "" if self.port == 443 else f":{self.port}"
        query = f"?{self.query}" if self.query else ""
        return f"https://{host}{port}{self.path}{query}"


def parse_endpoint(text: str) -> EndpointParts:
    """The one parser of a push endpoint: an ``https`` URL with a host, no user
    information, and nothing a URL cannot carry. The spellings of one push resource —
    scheme or host case, ``:443``, a port with leading zeros, a trailing dot, an empty
    ``?``, a ``#fragment``, an internationalised host name, ``.`` and ``..`` segments,
    percent-escapes of unreserved characters or in lower-case hex — all parse to the
    same parts. Raises :class:`EndpointRefused`.
    """
    if _NEVER_IN_ENDPOINT.search(text):
        raise EndpointRefused("invalid_endpoint", "has characters a push endpoint never has")
    try:
        parts = urlsplit(text)
    except ValueError:  # e.g. "https://[::1/x": an unclosed IPv6 bracket
        raise EndpointRefused("invalid_endpoint", "is not a URL") from None
    if parts.scheme != "https":  # urlsplit lower-cases the scheme
        raise EndpointRefused("insecure_endpoint", "must be an https:// URL")
    netloc = parts.netloc
    if "@" in netloc:
        raise EndpointRefused("invalid_endpoint", "must not carry user information")
    if not (parts.path + parts.query).isascii():
        raise EndpointRefused("invalid_endpoint", "has characters a push endpoint never has")
    if netloc.startswith("["):  # [IPv6]:port
        close = netloc.find("]")
        host, after = _ip6_host(netloc[1:close] if close > 0 else ""), netloc[close + 1 :]
        if after and not after.startswith(":"):
            raise EndpointRefused("invalid_endpoint", "has no valid host")
        port = after[1:]
    else:  # a name holds no colon: whatever follows the first one is the port
        name, _, port = netloc.partition(":")
        host = _name_host(name)
    return EndpointParts(host, _port(port), _path(parts.path), _normalise(parts.query))


def canonical_endpoint(text: str) -> str:
    """The canonical spelling of a push endpoint (what the registry stores); raises
    :class:`EndpointRefused`. Canonicalising a canonical endpoint changes nothing."""
    return parse_endpoint(text).url


def endpoint_hash(endpoint: str) -> bytes:
    """SHA-256 of the endpoint's canonical form: the subscription's identity (32 bytes).

    Every spelling of one push resource has the same hash, so a look-up finds its row
    however the endpoint is written. Text that is no push endpoint at all is hashed as it
    is: it can only find a row stored with exactly that text (one written before
    endpoints were canonical), never another.
    """
    try:
        text = canonical_endpoint(endpoint)
    except EndpointRefused:
        text = endpoint
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def lookup_hashes(endpoint: str) -> tuple[bytes, ...]:
    """The hashes a look-up by ``endpoint`` tries, best first: :func:`endpoint_hash`,
    then the hash of the exact text, which a row stored before endpoints were canonical
    still carries (a tombstone keeps it for good; the others until ``run-job
    canonicalise-endpoints`` rewrites them)."""
    canonical = endpoint_hash(endpoint)
    exact = hashlib.sha256(endpoint.encode("utf-8", "surrogatepass")).digest()
    return (canonical,) if exact == canonical else (canonical, exact)


def _ip6_host(text: str) -> str:
    try:
        if "%" in text:  # a zone id ("%25eth0") names an interface of this machine
            raise ValueError(text)
        return ipaddress.IPv6Address(text).compressed
    except ValueError:
        raise EndpointRefused("invalid_endpoint", "has no valid host") from None


def _name_host(text: str) -> str:
    host = text[:-1] if text.endswith(".") else text
    if not host.isascii():
        try:  # IDNA 2008 with the UTS #46 mapping, as browsers resolve a name
            host = idna.encode(host, uts46=True).decode("ascii")
        except (idna.IDNAError, UnicodeError):
            raise EndpointRefused("invalid_endpoint", "has no valid host") from None
    host = host.lower()
    if not _HOST_LABELS.fullmatch(host):
        raise EndpointRefused("invalid_endpoint", "has no valid host")
    if _NUMERIC_LABEL.fullmatch(host.rsplit(".", 1)[-1]):
        # A name ending in a number is an IPv4 address to a URL parser ("127.1",
        # "0x7f.0.0.1" included): only the plain dotted quad is taken.
        try:
            return str(ipaddress.IPv4Address(host))
        except ValueError:
            raise EndpointRefused("invalid_endpoint", "has no valid host") from None
    return host


def _port(digits: str) -> int:
    """``:443``, ``:0443`` and a bare ``:`` are all the default port."""
    if not digits:
        return 443
    if not (digits.isascii() and digits.isdigit()) or not 0 < int(digits) < 65536:
        raise EndpointRefused("invalid_endpoint", "has an invalid port")
    return int(digits)


def _normalise(text: str) -> str:
    """RFC 3986 §6.2.2: escapes in upper-case hex, unreserved characters unescaped."""
    if not _URI_TEXT.fullmatch(text):
        raise EndpointRefused("invalid_endpoint", "has characters a push endpoint never has")

    if "%" not in text:
        return text

    def one(match: re.Match[str]) -> str:
        if match.group(1) is None:
            raise EndpointRefused("invalid_endpoint", "has a % that is no escape")
        char = chr(int(match.group(1), 16))
        return char if char in _UNRESERVED else f"%{match.group(1).upper()}"

    return _ESCAPE.sub(one, text)


def _path(text: str) -> str:
    """The path with its dot segments removed (RFC 3986 §5.2.4), as the sender's HTTP
    client sends it anyway; an empty path is ``/``."""
    given = _normalise(text).split("/")[1:]
    segments: list[str] = []
    for segment in given:
        if segment == "..":
            if segments:
                segments.pop()
        elif segment != ".":
            segments.append(segment)
    if given and given[-1] in (".", ".."):
        segments.append("")  # "/a/." and "/a/b/.." name the folder "/a/"
    return "/" + "/".join(segments)


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
    endpoint: str  # canonical
    host: str
    push_service: PushService

    @property
    def hash(self) -> bytes:
        return endpoint_hash(self.endpoint)


def validate_endpoint(
    value: object, *, allowed: HostAllowList, max_length: int, field: str = "endpoint"
) -> ValidEndpoint:
    """A push endpoint the portal may store, in its canonical spelling."""
    text = require_string(value, field)
    if len(text) > max_length:
        raise ValidationError(
            "endpoint_too_long", f"{field} is longer than {max_length} characters", field
        )
    try:
        parts = parse_endpoint(text)
    except EndpointRefused as refused:
        raise ValidationError(refused.code, f"{field} {refused.reason}", field) from None
    if not allowed.allows(parts.host, parts.port):
        raise ValidationError(
            "push_service_not_allowed", f"{field} is not on an allowed push service", field
        )
    if parts.path == "/":
        raise ValidationError("invalid_endpoint", f"{field} has no registration path", field)
    canonical = parts.url
    if len(canonical) > max_length:  # a punycode host is longer than its Unicode name
        raise ValidationError(
            "endpoint_too_long", f"{field} is longer than {max_length} characters", field
        )
    return ValidEndpoint(canonical, parts.host, push_service_for(parts.host))


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
