"""Who is at the browser: the signed subscriber cookie set at subscription."""

from __future__ import annotations

import uuid

from flask import Flask, Request, Response, current_app
from itsdangerous import BadSignature, URLSafeTimedSerializer

SUBSCRIBER_COOKIE = "portal_subscriber"
SUBSCRIBER_COOKIE_MAX_AGE = 400 * 24 * 3600  # the longest lifetime browsers keep


def _serializer(app: Flask | None = None) -> URLSafeTimedSerializer:
    app = app or current_app
    return URLSafeTimedSerializer(app.config["SECRET_KEY"], salt="portal.subscriber-cookie")


def subscriber_from_cookie(request: Request) -> uuid.UUID | None:
    value = request.cookies.get(SUBSCRIBER_COOKIE)
    if not value:
        return None
    try:
        text = _serializer().loads(value, max_age=SUBSCRIBER_COOKIE_MAX_AGE)
        return uuid.UUID(str(text))
    except (BadSignature, ValueError):
        return None


def set_subscriber_cookie(response: Response, subscriber_id: uuid.UUID, *, secure: bool) -> None:
    response.set_cookie(
        SUBSCRIBER_COOKIE,
        _serializer().dumps(str(subscriber_id)),
        max_age=SUBSCRIBER_COOKIE_MAX_AGE,
        httponly=True,
        secure=secure,
        samesite="Lax",
        path="/",
    )
