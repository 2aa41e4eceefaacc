"""The subscription API: thin views that parse, call a service, answer."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import TYPE_CHECKING, Any

from flask import Blueprint, Response, current_app, jsonify, request

from portal.api import check_same_origin, json_body, request_locale, request_origin
from portal.db import db
from portal.errors import NotFound, ValidationError
from portal.identity import set_subscriber_cookie, subscriber_from_cookie
from portal.subscriptions import services
from portal.subscriptions.validation import (
    HostAllowList,
    ValidSubscription,
    require_string,
    validate_subscription,
)

if TYPE_CHECKING:
    from portal import Portal
    from portal.config import Settings

bp = Blueprint("subscriptions_api", __name__, url_prefix="/api/push")


@bp.before_request
def _same_origin_only() -> None:
    check_same_origin()


def _settings() -> Settings:
    return current_app.extensions["portal.settings"]


def _portal() -> Portal:
    return current_app.extensions["portal"]


def _subscription(value: object, field: str = "subscription") -> ValidSubscription:
    settings = _settings()
    return validate_subscription(
        value,
        allowed=HostAllowList(settings.push_allowed_hosts),
        max_length=settings.endpoint_max_length,
        field=field,
    )


def _endpoint(body: dict[str, Any], field: str = "endpoint") -> str:
    text = require_string(body.get(field), field)
    if len(text) > _settings().endpoint_max_length:
        raise ValidationError("endpoint_too_long", f"{field} is too long", field)
    return text


def _registration() -> services.Registration:
    return services.Registration(
        origin=request_origin(),
        user_agent=request.headers.get("User-Agent"),
        locale=request_locale(),
        subscriber_id=subscriber_from_cookie(request),
    )


def _with_cookie(response: Response, subscriber_id: uuid.UUID) -> Response:
    set_subscriber_cookie(
        response, subscriber_id, secure=request.is_secure or _settings().is_production
    )
    return response


@bp.post("/subscribe")
def subscribe() -> tuple[Response, int]:
    body = json_body()
    subscription = _subscription(body.get("subscription"))
    session = db.session
    portal = _portal()
    result = services.upsert_subscription(
        session, subscription, _registration(), keys=portal.keys, clock=portal.clock
    )
    session.commit()
    response = jsonify(
        {"id": str(result.id), "state": result.state.value, "inserted": result.inserted}
    )
    return _with_cookie(response, result.subscriber_id), 201 if result.inserted else 200


@bp.post("/heartbeat")
def heartbeat() -> Response:
    body = json_body()
    endpoint = _endpoint(body)
    session = db.session
    result = services.heartbeat(
        session,
        endpoint,
        clock=_portal().clock,
        throttle=dt.timedelta(seconds=_settings().last_seen_throttle_seconds),
    )
    session.commit()
    return jsonify({"state": result.state, "action": result.action})


@bp.post("/change")
def change() -> tuple[Response, int]:
    body = json_body()
    old_endpoint = _endpoint(body, "oldEndpoint")
    new = _subscription(body.get("subscription"))
    session = db.session
    portal = _portal()
    result = services.change_endpoint(
        session, old_endpoint, new, _registration(), keys=portal.keys, clock=portal.clock
    )
    session.commit()
    response = jsonify(
        {
            "id": str(result.new.id),
            "state": result.new.state.value,
            "inserted": result.new.inserted,
            "moved": result.moved,
        }
    )
    return _with_cookie(response, result.new.subscriber_id), 201 if result.new.inserted else 200


@bp.post("/unsubscribe")
def unsubscribe() -> Response:
    body = json_body()
    endpoint = _endpoint(body)
    session = db.session
    sub = services.unsubscribe(session, endpoint, clock=_portal().clock)
    if sub is None:
        raise NotFound("unknown_endpoint", "no subscription has this endpoint", "endpoint")
    session.commit()
    return jsonify({"id": str(sub.id), "state": sub.state.value})
