"""VAPID (RFC 8292): the application server's identity on every push request.

A push service wants ``Authorization: vapid t=<JWT>, k=<public key>``, the JWT being
ES256 over ``{"aud": <push-service origin>, "exp": ..., "sub": VAPID_SUBJECT}``. Signing
is the slow part of that (an ECDSA signature), and the token is the same for every
message to one push service, so :class:`VapidSigner` signs one token per origin and
hands it out until shortly before it expires: a campaign of a million messages to four
push services signs a handful of tokens, not a million.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from portal.clock import Clock, SystemClock
from portal.config import Settings

MAX_LIFETIME = dt.timedelta(hours=12)
"""Longest ``exp`` we set ahead of now (RFC 8292 allows 24 h; half leaves room for skew)."""

MIN_RENEWAL_INTERVAL = dt.timedelta(hours=1)
"""A token is used at least this long before it is replaced: at most one signature an
hour per push service, whatever the traffic."""

DEFAULT_RENEW_MARGIN = dt.timedelta(hours=1)
"""A token is replaced once it has less than this left, so a request in flight, a slow
retry or a push service whose clock runs ahead never sees an expired one."""

# A clock stepped back by more than this leaves a cached token whose exp lies further
# ahead than the lifetime allows; it is re-signed rather than sent.
_CLOCK_STEP_TOLERANCE = dt.timedelta(minutes=1)

_JWT_HEADER = base64.urlsafe_b64encode(b'{"typ":"JWT","alg":"ES256"}').rstrip(b"=")


class VapidKeyError(ValueError):
    """The VAPID key pair is malformed or the halves do not belong together."""


def _b64url(raw: bytes) -> bytes:
    return base64.urlsafe_b64encode(raw).rstrip(b"=")


def _b64url_decode(text: str) -> bytes:
    # Strict: urlsafe_b64decode would silently skip characters outside the alphabet.
    return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)


# Origins by the endpoint's text up to the first "/" after the scheme: the origin depends
# only on that part, and a campaign's endpoints share a handful of them, so this saves a
# URL parse per message. Bounded so odd endpoints cannot grow it without limit.
_ORIGINS: dict[str, str] = {}
_ORIGINS_MAX = 1024


def push_service_origin(endpoint: str) -> str:
    """The origin of a push endpoint, as the JWT's ``aud`` and the connection pool key.

    Lower-case scheme and host, the port only when it is not the scheme's default:
    ``https://FCM.googleapis.com:443/fcm/send/x`` → ``https://fcm.googleapis.com``.
    """
    cut = endpoint.find("/", 8)
    prefix = endpoint if cut < 0 else endpoint[:cut]
    origin = _ORIGINS.get(prefix)
    if origin is None:
        origin = _parse_origin(endpoint)
        if len(_ORIGINS) < _ORIGINS_MAX:
            _ORIGINS[prefix] = origin
    return origin


def _parse_origin(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    scheme = parts.scheme.lower()
    host = parts.hostname
    if scheme not in ("https", "http") or not host:
        raise ValueError(f"not an http(s) URL with a host: {endpoint!r}")
    if ":" in host:  # an IPv6 literal keeps its brackets in an origin
        host = f"[{host}]"
    port = parts.port
    default_port = 443 if scheme == "https" else 80
    if port is None or port == default_port:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


@dataclass(frozen=True, slots=True)
class VapidToken:
    """One signed JWT for one push-service origin."""

    audience: str
    jwt: str
    public_key: str
    signed_at: dt.datetime
    expires_at: dt.datetime

    @property
    def authorization(self) -> str:
        """The ``Authorization`` header value (RFC 8292 §3)."""
        return f"vapid t={self.jwt}, k={self.public_key}"


@dataclass(frozen=True, slots=True)
class VapidCacheStats:
    """How often a token came from the cache (``hits``) or had to be signed (``misses``)."""

    hits: int = 0
    misses: int = 0


CacheObserver = Callable[[bool], None]
"""Called with ``True`` on a cache hit and ``False`` on a signature, e.g.
``lambda hit: counter.labels("hit" if hit else "miss").inc()``."""


class VapidSigner:
    """Signs and caches one VAPID token per push-service origin; safe across threads.

    ``private_key`` is the base64url raw 32-byte P-256 scalar and ``public_key`` the
    base64url uncompressed point, as ``VAPID_PRIVATE_KEY`` / ``VAPID_PUBLIC_KEY`` hold
    them (derived from the private key when not given, checked against it when given).
    Tokens carry ``exp`` = signing time + ``lifetime`` and are replaced once less than
    ``renew_margin`` is left; the two must leave at least an hour between signatures.
    """

    def __init__(
        self,
        private_key: str,
        subject: str,
        *,
        public_key: str | None = None,
        clock: Clock | None = None,
        lifetime: dt.timedelta = MAX_LIFETIME,
        renew_margin: dt.timedelta = DEFAULT_RENEW_MARGIN,
        on_lookup: CacheObserver | None = None,
    ) -> None:
        if not subject.startswith(("mailto:", "https:")):
            raise ValueError("the VAPID subject must be a mailto: or https: URI")
        if lifetime > MAX_LIFETIME:
            raise ValueError(f"a VAPID token may live at most {MAX_LIFETIME}")
        if renew_margin <= dt.timedelta(0) or lifetime - renew_margin < MIN_RENEWAL_INTERVAL:
            raise ValueError(
                "renew_margin must be positive and leave at least "
                f"{MIN_RENEWAL_INTERVAL} between signatures"
            )
        self._key = _load_private_key(private_key)
        derived = self._key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        if public_key is not None:
            try:
                given = _b64url_decode(public_key)
            except (binascii.Error, ValueError):
                given = b""
            if given != derived:
                raise VapidKeyError("the VAPID public key does not match the private key")
        self.public_key = _b64url(derived).decode("ascii")
        self.subject = subject
        self._clock: Clock = clock or SystemClock()
        self._lifetime = lifetime
        self._renew_margin = renew_margin
        self._on_lookup = on_lookup
        self._tokens: dict[str, VapidToken] = {}
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        clock: Clock | None = None,
        on_lookup: CacheObserver | None = None,
    ) -> VapidSigner:
        """A signer for the keys and subject in :class:`portal.config.Settings`."""
        return cls(
            settings.vapid_private_key,
            settings.vapid_subject,
            public_key=settings.vapid_public_key or None,
            clock=clock,
            on_lookup=on_lookup,
        )

    @property
    def stats(self) -> VapidCacheStats:
        with self._lock:
            return VapidCacheStats(self._hits, self._misses)

    def authorization(self, endpoint: str) -> str:
        """The ``Authorization`` header value for a request to ``endpoint``."""
        return self.token(push_service_origin(endpoint)).authorization

    def token(self, origin: str) -> VapidToken:
        """The current token for a push-service ``origin``, signing one when due."""
        now = self._clock.now()
        with self._lock:
            token = self._tokens.get(origin)
            hit = token is not None and self._fresh(token, now)
            if not hit:
                token = self._sign(origin, now)
                self._tokens[origin] = token
                self._misses += 1
            else:
                self._hits += 1
        if self._on_lookup is not None:
            self._on_lookup(hit)
        assert token is not None
        return token

    def _fresh(self, token: VapidToken, now: dt.datetime) -> bool:
        left = token.expires_at - now
        return self._renew_margin <= left <= self._lifetime + _CLOCK_STEP_TOLERANCE

    def _sign(self, origin: str, now: dt.datetime) -> VapidToken:
        # NumericDate is whole seconds; truncating keeps exp within the lifetime.
        exp = int(now.timestamp() + self._lifetime.total_seconds())
        claims = json.dumps(
            {"aud": origin, "exp": exp, "sub": self.subject}, separators=(",", ":")
        ).encode()
        signing_input = _JWT_HEADER + b"." + _b64url(claims)
        der = self._key.sign(signing_input, ec.ECDSA(hashes.SHA256()))
        r, s = decode_dss_signature(der)
        # JOSE wants the raw r ‖ s form (RFC 7518 §3.4), not DER.
        signature = r.to_bytes(32, "big") + s.to_bytes(32, "big")
        jwt = (signing_input + b"." + _b64url(signature)).decode("ascii")
        return VapidToken(
            audience=origin,
            jwt=jwt,
            public_key=self.public_key,
            signed_at=now,
            expires_at=dt.datetime.fromtimestamp(exp, dt.UTC),
        )


def _load_private_key(text: str) -> ec.EllipticCurvePrivateKey:
    try:
        raw = _b64url_decode(text.strip())
    except (binascii.Error, ValueError):
        raise VapidKeyError("the VAPID private key is not base64url") from None
    if len(raw) != 32:
        raise VapidKeyError(f"the VAPID private key must be 32 bytes, not {len(raw)}")
    try:
        return ec.derive_private_key(int.from_bytes(raw, "big"), ec.SECP256R1())
    except ValueError:
        raise VapidKeyError("the VAPID private key is not a valid P-256 scalar") from None
