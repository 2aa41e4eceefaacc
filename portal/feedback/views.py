"""``POST /api/push/feedback``: the signed delivery-feedback digest (seed 004).

A server-to-server endpoint: no browser calls it, so the same-origin check and CSRF
do not apply (the HMAC signature authenticates it instead); the body-size limit does.
"""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request
from werkzeug.exceptions import RequestEntityTooLarge

from portal.api import RETRY_AFTER_SECONDS
from portal.db import db
from portal.feedback import services
from portal.seams import current_portal
from portal.security import body_within

bp = Blueprint("feedback_api", __name__, url_prefix="/api/push")


@bp.post("/feedback")
def receive() -> tuple[Response, int]:
    portal = current_portal()
    settings = portal.settings
    try:
        # The raw bytes, exactly as signed: never parsed before the signature checks out.
        raw = body_within(settings.feedback_max_body_bytes)
    except RequestEntityTooLarge:
        services.count_rejection("too_large")
        raise
    receipt = services.receive(
        raw,
        request.headers.get(settings.feedback_signature_header),
        settings=settings,
        now=portal.clock.now(),
        sessions=db.session_factory(),
    )
    response = jsonify(receipt.body)
    if receipt.status == 401:
        response.headers["WWW-Authenticate"] = (
            f'HMAC-SHA256 header="{settings.feedback_signature_header}"'
        )
    if receipt.status == 503:
        # As every other 503 of the API: when to try again (the database is coming back).
        response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response, receipt.status
