"""Who is at the browser.

- A signed, HttpOnly subscriber cookie set at subscription, and a device cookie naming
  the subscription this browser registered (so "stop on this device" works without
  JavaScript, and the endpoint-keyed API knows the browser holds that subscription:
  ``portal.subscriptions.possession``).
- A signed, expiring link token for links inside notifications.
- A host product's identity assertion: ``base64url(JSON).hex(HMAC-SHA256)`` with a shared
  secret, naming the account (``sub``), its expiry (``exp``) and optionally ``region``
  and ``locale``; it links the browser to that account.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import re
import uuid
from dataclasses import dataclass
from typing import Any, TypeGuard

from flask import Flask, Request, current_app
from itsdangerous import BadSignature, SignatureExpired, URLSafeTimedSerializer
from werkzeug.wrappers import Response

SUBSCRIBER_COOKIE = "portal_subscriber"
DEVICE_COOKIE = "portal_device"
COOKIE_MAX_AGE = 400 * 24 * 3600  # the longest lifetime browsers keep
ASSERTION_SKEW_SECONDS = 300
_EXTERNAL_ID = re.compile(r"^[A-Za-z0-9._:@+-]{1,255}$")
_REGION = re.compile(r"^[A-Z]{2}$")
_ASSERTION = re.compile(r"([A-Za-z0-9_-]{1,8192})\.([0-9a-f]{64})")
# A language tag as the portal stores one (the shape portal.api accepts from browsers).
_LOCALE = re.compile(r"^[A-Za-z]{2,3}(-[A-Za-z0-9]{1,8}){0,3}$")


def _serializer(salt: str, app: Flask | None = None) -> URLSafeTimedSerializer:
    app = app or current_app
    return URLSafeTimedSerializer(app.config["SECRET_KEY"], salt=salt)


def _signed_uuid(request: Request, name: str) -> uuid.UUID | None:
    value = request.cookies.get(name)
    if not value:
        return None
    try:
        return uuid.UUID(str(_serializer(name).loads(value, max_age=COOKIE_MAX_AGE)))
    except (BadSignature, ValueError):
        return None


def subscriber_from_cookie(request: Request) -> uuid.UUID | None:
    return _signed_uuid(request, SUBSCRIBER_COOKIE)


def device_from_cookie(request: Request) -> uuid.UUID | None:
    return _signed_uuid(request, DEVICE_COOKIE)


def _set(response: Response, name: str, value: uuid.UUID, *, secure: bool) -> None:
    response.set_cookie(
        name,
        _serializer(name).dumps(str(value)),
        max_age=COOKIE_MAX_AGE,
        httponly=True,
        secure=secure,
        samesite="Lax",
        path="/",
    )


def set_subscriber_cookie(response: Response, subscriber_id: uuid.UUID, *, secure: bool) -> None:
    _set(response, SUBSCRIBER_COOKIE, subscriber_id, secure=secure)


def set_device_cookie(response: Response, subscription_id: uuid.UUID, *, secure: bool) -> None:
    _set(response, DEVICE_COOKIE, subscription_id, secure=secure)


def preference_link_token(subscriber_id: uuid.UUID, app: Flask | None = None) -> str:
    """The ``token`` of ``/preferences?token=…`` links placed inside notifications."""
    return _serializer("portal.preference-link", app).dumps(str(subscriber_id))


class InvalidLink(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def subscriber_from_link_token(token: str, *, max_age: int) -> uuid.UUID:
    try:
        return uuid.UUID(str(_serializer("portal.preference-link").loads(token, max_age=max_age)))
    except SignatureExpired:
        raise InvalidLink(
            "This link has expired. Open the latest notification, or subscribe again."
        ) from None
    except (BadSignature, ValueError):
        raise InvalidLink("This link is not valid.") from None


@dataclass(frozen=True)
class Assertion:
    external_user_id: str
    region_code: str | None
    locale: str | None


def sign_assertion(claims: dict[str, Any], secret: str) -> str:
    """What the host product does (documented in docs/consent.md; used by tests)."""
    payload = base64.urlsafe_b64encode(json.dumps(claims, separators=(",", ":")).encode()).rstrip(
        b"="
    )
    mac = hmac.new(secret.encode(), payload, hashlib.sha256).hexdigest()
    return f"{payload.decode()}.{mac}"


def verify_assertion(value: str, *, secrets: tuple[str, ...], now: float) -> Assertion:
    if not secrets:
        raise InvalidLink("Account links are not set up on this portal.")
    # The shape first (base64url, a dot, the hex HMAC): anything else, non-ASCII
    # included, is refused before it reaches the HMAC or the decoder.
    shape = _ASSERTION.fullmatch(value)
    if shape is None:
        raise InvalidLink("This sign-in link is not valid.")
    payload, mac = shape.group(1).encode("ascii"), shape.group(2).encode("ascii")
    if not any(
        hmac.compare_digest(hmac.new(s.encode(), payload, hashlib.sha256).hexdigest().encode(), mac)
        for s in secrets
    ):
        raise InvalidLink("This sign-in link is not valid.")
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + b"=" * (-len(payload) % 4)))
    except (ValueError, binascii.Error, RecursionError):
        raise InvalidLink("This sign-in link is not valid.") from None
    if not isinstance(claims, dict):
        raise InvalidLink("This sign-in link is not valid.")
    subject, expires = claims.get("sub"), claims.get("exp")
    if not isinstance(subject, str) or not _EXTERNAL_ID.fullmatch(subject):
        raise InvalidLink("This sign-in link does not name an account.")
    if not _is_time(expires) or expires < now:
        raise InvalidLink("This sign-in link has expired. Go back and try again.")
    issued = claims.get("iat")
    if issued is not None and not _is_time(issued):
        raise InvalidLink("This sign-in link is not valid.")
    if issued is not None and issued > now + ASSERTION_SKEW_SECONDS:
        raise InvalidLink("This sign-in link is not valid yet.")
    region = claims.get("region")
    locale = claims.get("locale")
    return Assertion(
        subject,
        region if isinstance(region, str) and _REGION.fullmatch(region) else None,
        locale if isinstance(locale, str) and _LOCALE.fullmatch(locale) else None,
    )


def _is_time(value: object) -> TypeGuard[float]:
    """A Unix time in seconds: a finite number (JSON's Infinity and NaN never expire)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
