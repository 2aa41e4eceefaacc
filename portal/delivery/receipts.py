"""``POST /api/push/receipt``: the service worker reports that it showed a delivery, or
that the person clicked it.

Three different facts, kept apart: the push service *accepted* a message (its 201, which
the sender records on the delivery), the browser *showed* it, the person *clicked* it.
A browser may report nothing at all (offline, closed, blocked), so receipts are evidence
of display, never the condition for anything else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from flask import Blueprint, Response, current_app, jsonify
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from portal.api import check_same_origin, json_body
from portal.clock import Clock
from portal.db import db, is_postgres
from portal.delivery.models import DeliveryReceipt, ReceiptEvent
from portal.errors import ValidationError
from portal.ratelimit import limit_endpoint
from portal.subscriptions.validation import endpoint_hash, require_string

bp = Blueprint("receipts_api", __name__, url_prefix="/api/push")
bp.before_request(check_same_origin)

# Delivery ids are UUIDs today; letters, digits, '-' and '_' leave room for other schemes.
DELIVERY_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_EVENTS = {e.value for e in ReceiptEvent}


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
        raise ValidationError("invalid_value", "event is shown or clicked", "event")
    endpoint = body.get("endpoint")
    if endpoint is not None:
        endpoint = require_string(endpoint, "endpoint")
        if len(endpoint) > endpoint_max_length:
            raise ValidationError("endpoint_too_long", "endpoint is too long", "endpoint")
    return Receipt(delivery_id, ReceiptEvent(event), endpoint)


def record(session: Session, receipt: Receipt, *, clock: Clock) -> bool:
    """Store the fact once; True when it is new. A repeated report changes nothing."""
    insert = (postgresql.insert if is_postgres(session) else sqlite.insert)(DeliveryReceipt).values(
        delivery_id=receipt.delivery_id,
        event=receipt.event.value,
        at=clock.now(),
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
    body = json_body()  # content type and size limits, like every JSON endpoint
    settings = current_app.extensions["portal.settings"]
    parsed = parse_receipt(body, endpoint_max_length=settings.endpoint_max_length)
    if parsed.endpoint is not None:
        limit_endpoint(parsed.endpoint)
    session = db.session
    created = record(session, parsed, clock=current_app.extensions["portal"].clock)
    session.commit()
    return jsonify(
        {"deliveryId": parsed.delivery_id, "event": parsed.event.value, "recorded": created}
    ), 201 if created else 200
