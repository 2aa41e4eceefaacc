"""Erasure requested by the person, from the preference centre, with a confirmation step."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

from flask import Blueprint, Response, current_app, redirect, render_template, request, url_for
from flask import session as flask_session
from itsdangerous import BadSignature, URLSafeSerializer

from portal.consent.log import Context
from portal.consent.models import Source
from portal.consent.views import _current_subscriber, forget_link_visit
from portal.db import db
from portal.identity import SUBSCRIBER_COOKIE, device_from_cookie, subscriber_from_cookie
from portal.retention.services import ErasureReceipt, erase_subscriber, receipt_id
from portal.seams import current_portal
from portal.subscriptions.services import DeviceStatus, status_of_device
from portal.useragent import family

bp = Blueprint("erasure", __name__)
_CONFIRM_ERROR = "Tick the box to confirm you want everything erased"
# The flash category that carries a receipt's token to the page shown after an erasure.
RECEIPT_FLASH = "erasure-receipt"
# The session key of the receipt the page after an erasure shows.
_ERASED = "erasure_receipt"


def _receipts() -> URLSafeSerializer:
    return URLSafeSerializer(current_app.config["SECRET_KEY"], salt="portal.erasure-receipt")


def receipt_token(receipt: ErasureReceipt) -> str:
    """The signed token of an erasure's receipt: ``/preferences/erasure-receipt/<token>``
    downloads it, whoever asked for the erasure (the person, or staff on their behalf)."""
    return _receipts().dumps(
        {
            "subscriber": str(receipt.subscriber_id),
            "erasedAt": receipt.erased_at.isoformat(),
            "consentEventSeq": receipt.event_seq,
            "consentEventHash": receipt.event_hash,
            "subscriptionsEnded": receipt.subscriptions,
        }
    )


@bp.get("/preferences/erase")
def confirm() -> Any:
    subscriber = _current_subscriber()
    if subscriber is None:
        return render_template("preferences/unknown.html"), 200
    return render_template("preferences/erase.html", errors=[], error=None)


@bp.post("/preferences/erase")
def erase() -> Any:
    subscriber = _current_subscriber()
    if subscriber is None:
        return render_template("preferences/unknown.html"), 403
    if request.form.get("confirm") != "yes":
        return render_template(
            "preferences/erase.html",
            errors=[("erase-confirm", _CONFIRM_ERROR)],
            error=_CONFIRM_ERROR,
        ), 400
    session = db.session
    receipt = erase_subscriber(
        session,
        subscriber.id,
        now=current_portal().clock.now(),
        source=Source.PREFERENCE_CENTRE.value,
        context=Context(
            screen="preference-centre:erase", client=family(request.headers.get("User-Agent"))
        ),
    )
    session.commit()
    forget_link_visit()
    # Post/redirect/get: the answer page reads the receipt from the (signed) session, so
    # reloading it shows the receipt again and erases nothing.
    flask_session[_ERASED] = receipt_token(receipt)
    response = redirect(url_for("erasure.erased"), 303)
    if subscriber_from_cookie(request) == subscriber.id:  # not a link visitor's browser
        response.delete_cookie(SUBSCRIBER_COOKIE, path="/")
    # The device cookie stays: it names only this browser's tombstone, and it is what
    # lets the browser prove that tombstone is its own, so its next heartbeat is told to
    # drop the subscription (the tombstone keeps no auth secret to prove it with).
    return response


@bp.get("/preferences/erased")
def erased() -> Any:
    """What the erasure did, with its receipt, for as long as this browser's session lasts."""
    token = flask_session.get(_ERASED)
    try:
        body = _receipts().loads(token) if isinstance(token, str) else None
    except BadSignature:
        body = None
    if body is None:
        return redirect(url_for("erasure.confirm"), 303)
    receipt = ErasureReceipt(
        subscriber_id=uuid.UUID(body["subscriber"]),
        erased_at=dt.datetime.fromisoformat(body["erasedAt"]),
        event_seq=body["consentEventSeq"],
        event_hash=body["consentEventHash"],
        subscriptions=body["subscriptionsEnded"],
    )
    # What the server knows of this browser now: its subscription erased with the rest,
    # or (a preference link opened in another person's browser) that browser's own.
    here = status_of_device(
        db.session, device_from_cookie(request), now=current_portal().clock.now()
    )
    return render_template(
        "preferences/erased.html",
        receipt=receipt,
        token=token,
        this_device_receiving=here is DeviceStatus.RECEIVING,
    )


@bp.get("/preferences/erasure-receipt/<token>")
def receipt(token: str) -> Response:
    try:
        body = _receipts().loads(token)
    except BadSignature:
        return Response("This receipt link is not valid.", status=404, mimetype="text/plain")
    document = {
        "receipt": "erasure",
        "receiptId": receipt_id(body["consentEventSeq"], body["consentEventHash"]),
        **body,
        "note": "Your data was erased. The consent log keeps only that consent existed and "
        "ended, under a random identifier; the event above is its record.",
        "signature": token.rsplit(".", 1)[-1],
    }
    return Response(
        json.dumps(document, indent=2),
        mimetype="application/json",
        headers={"Content-Disposition": 'attachment; filename="erasure-receipt.json"'},
    )
