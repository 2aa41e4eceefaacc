"""The subscription API: thin views that parse, call a service, answer.

Every route that names an endpoint acts only for the browser that holds the
subscription: its device cookie, or the ``auth`` secret it sends
(:mod:`portal.subscriptions.possession`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from flask import Blueprint, Response, jsonify, request

from portal.api import check_same_origin, json_body, request_locale, request_origin
from portal.campaigns.zones import browser_zone
from portal.consent.models import PreferenceState, Source
from portal.consent.preferences import (
    Choice,
    Decision,
    apply_decisions,
    chosen_topics,
    region_for_country,
    require_published,
)
from portal.consent.sources import source_for
from portal.db import db
from portal.errors import ValidationError
from portal.identity import (
    device_from_cookie,
    set_device_cookie,
    set_subscriber_cookie,
    subscriber_from_cookie,
)
from portal.ratelimit import limit_endpoint
from portal.seams import current_portal
from portal.subscriptions import services
from portal.subscriptions.possession import Proof, proof_from
from portal.subscriptions.validation import (
    HostAllowList,
    ValidSubscription,
    require_string,
    validate_subscription,
)

bp = Blueprint("subscriptions_api", __name__, url_prefix="/api/push")


@bp.before_request
def _same_origin_only() -> None:
    check_same_origin()


def _subscription(value: object, field: str = "subscription") -> ValidSubscription:
    settings = current_portal().settings
    subscription = validate_subscription(
        value,
        allowed=HostAllowList(settings.push_allowed_hosts),
        max_length=settings.endpoint_max_length,
        field=field,
    )
    limit_endpoint(subscription.endpoint.endpoint)
    return subscription


def _endpoint(body: dict[str, Any], field: str = "endpoint") -> str:
    text = require_string(body.get(field), field)
    if len(text) > current_portal().settings.endpoint_max_length:
        raise ValidationError("endpoint_too_long", f"{field} is too long", field)
    limit_endpoint(text)
    return text


def _registration() -> services.Registration:
    header = current_portal().settings.region_header
    return services.Registration(
        origin=request_origin(),
        user_agent=request.headers.get("User-Agent"),
        locale=request_locale(),
        subscriber_id=subscriber_from_cookie(request),
        device_id=device_from_cookie(request),
        region_code=region_for_country(request.headers.get(header)) if header else None,
    )


def _secure() -> bool:
    return request.is_secure or current_portal().settings.is_production


def _with_cookies(response: Response, result: services.UpsertResult) -> Response:
    """The browser's cookies: who it is, and the subscription it now holds."""
    set_subscriber_cookie(response, result.subscriber_id, secure=_secure())
    set_device_cookie(response, result.id, secure=_secure())
    return response


def _proof(body: dict[str, Any], field: str = "auth") -> Proof:
    """What the request shows to act on a subscription: its device cookie, and the
    subscription's auth secret when the body carries one."""
    return proof_from(device_from_cookie(request), body.get(field), field)


def _topic_choice(body: dict[str, Any]) -> tuple[list[Decision], str | None]:
    """The topics chosen on the subscribe page: chosen ones opt in; the marketing topics
    shown but not chosen opt out; transactional ones follow the permission grant. And the
    notice version the page showed, which the permission grant and the subscription are
    recorded against: one we published, or the request is refused."""
    if body.get("topics") is None:
        if body.get("policyVersion") is None:
            return [], None
        version = require_string(body.get("policyVersion"), "policyVersion")
        require_published(db.session, version)
        return [], version
    chosen = body["topics"]
    if not isinstance(chosen, list) or not all(isinstance(slug, str) for slug in chosen):
        raise ValidationError(
            "invalid_type", "topics must be a list of slugs", "topics", status=400
        )
    version = require_string(body.get("policyVersion"), "policyVersion")
    topics = chosen_topics(
        db.session,
        policy_version=version,
        choices=[Choice(slug, f"topics[{index}]") for index, slug in enumerate(chosen)],
        repeat_field="topics",
    )
    decisions = [
        Decision(topic, PreferenceState.OPT_IN if slug in chosen else PreferenceState.OPT_OUT)
        for slug, topic in topics.items()
        if slug in chosen or not topic.is_transactional
    ]
    return decisions, version


@bp.get("/vapid-public-key")
def vapid_public_key() -> Response:
    """The application-server key, for a service worker renewing a subscription on its
    own (pushsubscriptionchange) after the key was rotated."""
    response = jsonify({"publicKey": current_portal().settings.vapid_public_key})
    response.headers["Cache-Control"] = "no-cache"
    return response


@bp.post("/subscribe")
def subscribe() -> tuple[Response, int]:
    body = json_body()
    subscription = _subscription(body.get("subscription"))
    source = source_for("subscribe", body)
    decisions, version = _topic_choice(body)
    session = db.session
    portal = current_portal()
    zone = body.get("timeZone")
    registration = dataclasses.replace(
        _registration(),
        source=source,
        screen=source,
        policy_version=version,
        time_zone=None if zone is None else browser_zone(require_string(zone, "timeZone")),
    )
    services.refuse_renewal_of_an_ended_device(session, registration)
    result = services.upsert_subscription(
        session, subscription, registration, keys=portal.keys, now=portal.clock.now()
    )
    if decisions:
        now = portal.clock.now()
        apply_decisions(
            session,
            result.subscriber_id,
            decisions,
            source=source,
            policy_version=version,
            decided_at=now,
            recorded_at=now,
            context=registration.context(),
            subscription_id=result.id,
        )
    session.commit()
    response = jsonify(
        {"id": str(result.id), "state": result.state.value, "inserted": result.inserted}
    )
    return _with_cookies(response, result), 201 if result.inserted else 200


@bp.post("/heartbeat")
def heartbeat() -> Response:
    body = json_body()
    endpoint = _endpoint(body)
    proof = _proof(body)
    session = db.session
    result = services.heartbeat(
        session,
        endpoint,
        proof,
        subscriber_id=subscriber_from_cookie(request),
        keys=current_portal().keys,
        now=current_portal().clock.now(),
        throttle=dt.timedelta(seconds=current_portal().settings.last_seen_throttle_seconds),
    )
    session.commit()
    return jsonify({"state": result.state, "action": result.action})


@bp.post("/status")
def status() -> Response:
    """What the server holds for this browser's subscription, for a page to show."""
    body = json_body()
    endpoint = _endpoint(body)
    proof = _proof(body)
    session = db.session
    portal = current_portal()
    result = services.device_status(
        session,
        endpoint,
        proof,
        keys=portal.keys,
        now=portal.clock.now(),
        throttle=dt.timedelta(seconds=portal.settings.last_seen_throttle_seconds),
    )
    session.commit()
    response = jsonify({"status": result.status.value, "action": result.action})
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.post("/change")
def change() -> tuple[Response, int]:
    body = json_body()
    old_endpoint = _endpoint(body, "oldEndpoint")
    proof = _proof(body, "oldAuth")
    new = _subscription(body.get("subscription"))
    registration = dataclasses.replace(
        _registration(), source=Source.SERVICE_WORKER.value, screen="pushsubscriptionchange"
    )
    session = db.session
    portal = current_portal()
    result = services.change_endpoint(
        session, old_endpoint, new, registration, proof, keys=portal.keys, now=portal.clock.now()
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
    return _with_cookies(response, result.new), 201 if result.new.inserted else 200


@bp.post("/unsubscribe")
def unsubscribe() -> Response:
    body = json_body()
    endpoint = _endpoint(body)
    proof = _proof(body)
    source = source_for("unsubscribe", body)
    session = db.session
    portal = current_portal()
    sub = services.unsubscribe_endpoint(
        session,
        endpoint,
        proof,
        keys=portal.keys,
        now=portal.clock.now(),
        source=source,
        context=_registration().context(),
    )
    session.commit()
    return jsonify({"id": str(sub.id), "state": sub.state.value})
