"""``POST /api/push/receipt``: the service worker reports that it showed a delivery, or
that the person clicked it.

Three different facts, kept apart: the push service *accepted* a message (its 201, which
the sender records on the delivery), the browser *showed* it, the person *clicked* it.
A browser may report nothing at all (offline, closed, blocked), so receipts are evidence
of display, never the condition for anything else.

Only the browser a delivery went to may report it: its device cookie names the
delivery's subscription, or it shows that subscription's auth secret
(:mod:`portal.subscriptions.possession`). A delivery id travels in a payload anyone on
the device can read, so an id alone proves nothing; an id that is not a delivery and a
delivery sent elsewhere get the same refusal.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from flask import Blueprint, Response, jsonify, request
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from portal.api import check_same_origin, json_body
from portal.campaigns import unsent
from portal.campaigns.models import Campaign
from portal.db import db, is_postgres
from portal.delivery.models import Delivery, DeliveryReceipt, DeliveryStatus, ReceiptEvent
from portal.errors import ApiError, ValidationError
from portal.identity import device_from_cookie
from portal.ratelimit import count_in_the_request, limit_endpoint
from portal.seams import current_portal
from portal.subscriptions.models import PushSubscription
from portal.subscriptions.possession import Proof, holds, proof_from
from portal.subscriptions.sealing import KeyRing
from portal.subscriptions.validation import endpoint_hash, require_string

bp = Blueprint("receipts_api", __name__, url_prefix="/api/push")
bp.before_request(check_same_origin)

# The form a deliveryId may take (letters, digits, '-' and '_'); ours are the delivery
# rows' decimal ids, and any other id is simply not one of our deliveries.
DELIVERY_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_OUR_DELIVERY_ID = re.compile(r"^[1-9][0-9]{0,17}$")  # within BIGINT
_EVENTS = {e.value for e in ReceiptEvent}


class NotYourDelivery(ApiError):
    """No delivery to the calling browser has this id (403): unknown ids and other
    browsers' deliveries answer alike."""

    status = 403

    def __init__(self) -> None:
        super().__init__(
            "not_your_delivery", "no delivery to this browser has this id", "deliveryId"
        )


@dataclass(frozen=True)
class Receipt:
    delivery_id: str
    event: ReceiptEvent
    endpoint: str | None


def parse_receipt(body: dict[str, Any], *, endpoint_max_length: int) -> Receipt:
    delivery_id = require_string(body.get("deliveryId"), "deliveryId")
    if not DELIVERY_ID.fullmatch(delivery_id):
        raise ValidationError(
            "invalid_delivery_id",
            "deliveryId is 1–64 letters, digits, '-' or '_'",
            "deliveryId",
        )
    event = require_string(body.get("event"), "event")
    if event not in _EVENTS:
        raise ValidationError(
            "invalid_value", "event is shown, clicked, action-1 or action-2", "event"
        )
    endpoint = body.get("endpoint")
    if endpoint is not None:
        endpoint = require_string(endpoint, "endpoint")
        if len(endpoint) > endpoint_max_length:
            raise ValidationError("endpoint_too_long", "endpoint is too long", "endpoint")
    return Receipt(delivery_id, ReceiptEvent(event), endpoint)


_NEVER_SENT = frozenset({DeliveryStatus.SKIPPED.value, DeliveryStatus.REVOKED.value})


def buttons_sent_to_caller(
    session: Session, delivery_id: str, proof: Proof, *, keys: KeyRing
) -> int | None:
    """How many buttons the notification of ``delivery_id`` had, when it is one of our
    deliveries and went to the browser that shows ``proof`` (its device cookie names the
    delivery's subscription, or it carries that subscription's auth secret); None when
    not. One read: the check and the buttons a receipt may name.

    A delivery never sent (skipped: over a cap, keys unreadable; revoked: consent or the
    subscription ended first, or its push service said it is gone) reached no browser:
    a report of it would count on the funnel as shown where nothing could show. One whose
    answer is not in yet, or was lost (queued again, sending, failed), may have shown."""
    if not _OUR_DELIVERY_ID.fullmatch(delivery_id):
        return None
    row = session.execute(
        sa.select(
            # Still queued in a campaign that ended: the skip it is about to be marked
            # (portal/campaigns/unsent.py), refused as it will be then.
            unsent.shown_status(Campaign.status, Delivery.status).label("status"),
            Delivery.subscription_id,
            PushSubscription.auth_sealed,
            PushSubscription.auth_key_version,
            PushSubscription.deleted_at,
            Campaign.actions,
        )
        .select_from(Delivery)
        .join(Campaign, Campaign.id == Delivery.campaign_id)
        .outerjoin(PushSubscription, PushSubscription.id == Delivery.subscription_id)
        .where(Delivery.id == int(delivery_id))
    ).one_or_none()
    if row is None or row.status in _NEVER_SENT:
        return None
    if row.deleted_at is not None:
        return None  # a tombstone (erased, or its data purged): nothing more is collected
    held = holds(
        proof,
        subscription_id=row.subscription_id,
        auth_sealed=row.auth_sealed,
        auth_key_version=row.auth_key_version or 0,
        keys=keys,
    )
    return len(row.actions or ()) if held else None


_BUTTONS = {ReceiptEvent.ACTION_1: 1, ReceiptEvent.ACTION_2: 2}


def check_button(receipt: Receipt, buttons: int) -> None:
    """A button's receipt names a button the delivery's notification had (422 otherwise):
    a campaign's funnel counts clicks on its buttons, never on ones it never showed."""
    number = _BUTTONS.get(receipt.event)
    if number is not None and buttons < number:
        raise ValidationError(
            "no_such_button", f"this notification had no button {receipt.event.value}", "event"
        )


def record(session: Session, receipt: Receipt, *, now: dt.datetime) -> bool:
    """Store the fact once; True when it is new. A repeated report changes nothing."""
    insert = (postgresql.insert if is_postgres(session) else sqlite.insert)(DeliveryReceipt).values(
        delivery_id=receipt.delivery_id,
        event=receipt.event.value,
        at=now,
        endpoint_hash=endpoint_hash(receipt.endpoint) if receipt.endpoint else None,
    )
    statement = insert.on_conflict_do_nothing(
        index_elements=[DeliveryReceipt.delivery_id, DeliveryReceipt.event]
    ).returning(DeliveryReceipt.id)
    return session.execute(statement).first() is not None


def receipts_for(session: Session, delivery_id: str) -> list[DeliveryReceipt]:
    return list(
        session.scalars(
            sa.select(DeliveryReceipt)
            .where(DeliveryReceipt.delivery_id == delivery_id)
            .order_by(DeliveryReceipt.id)
        )
    )


@bp.post("/receipt")
def receipt() -> tuple[Response, int]:
    """Nothing is written before a refusal: the rate limits count this route's requests
    in its own transaction (:func:`portal.ratelimit.count_in_the_request`)."""
    body = json_body()  # content type and size limits, like every JSON endpoint
    settings = current_portal().settings
    parsed = parse_receipt(body, endpoint_max_length=settings.endpoint_max_length)
    proof = proof_from(device_from_cookie(request), body.get("auth"), "auth")
    if parsed.endpoint is not None:
        limit_endpoint(parsed.endpoint)
    portal = current_portal()
    session = db.session
    # The rate-limit counts, the check and the write share one transaction: one commit
    # per receipt. A refusal writes nothing but its counts (portal.ratelimit).
    buttons = buttons_sent_to_caller(session, parsed.delivery_id, proof, keys=portal.keys)
    if buttons is None:
        raise NotYourDelivery()
    check_button(parsed, buttons)
    created = record(session, parsed, now=portal.clock.now())
    session.commit()
    return jsonify(
        {"deliveryId": parsed.delivery_id, "event": parsed.event.value, "recorded": created}
    ), 201 if created else 200


count_in_the_request(f"{bp.name}.{receipt.__name__}")
