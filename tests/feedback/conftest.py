"""A signing sender for the delivery-feedback receiver, and digest builders."""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa

from portal.campaigns.models import Campaign
from portal.consent import catalogue
from portal.db import db
from portal.delivery.models import Delivery
from portal.feedback.signature import header_value
from portal.subscriptions.models import PushSubscription
from portal.subscriptions.validation import endpoint_hash

URL = "/api/push/feedback"
SECRET = "feedback-secret-one"  # what make_settings configures
HEADER = "X-CN1-Signature"


def invalid_target(endpoint: str, *, delivery_id: str | None = None, **extra: Any) -> dict:
    event = {"provider": "webpush", "endpoint": endpoint, "status": "FAILED"}
    event.update(reason="INVALID_TARGET", attempts=1)
    if delivery_id is not None:
        event["deliveryId"] = delivery_id
    event.update(extra)
    return event


def digest(events: list[dict], *, organization: str = "acme", **extra: Any) -> bytes:
    body = {"organization": organization, "events": events, "truncated": False}
    body["eventsOmitted"] = 0
    body.update(extra)
    return json.dumps(body).encode()


class Sender:
    """Posts raw bytes signed the way the provider signs them."""

    def __init__(self, client: Any, clock: Any) -> None:
        self.client = client
        self.clock = clock

    def now_ms(self) -> int:
        return int(self.clock.now().timestamp() * 1000)

    def signature(self, raw: bytes, *, secret: str = SECRET, t: int | None = None) -> str:
        return header_value(secret, self.now_ms() if t is None else t, raw)

    def post(
        self,
        raw: bytes,
        *,
        secret: str = SECRET,
        t: int | None = None,
        signature: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        sent = {"Content-Type": "application/json"}
        sent[HEADER] = (
            signature if signature is not None else self.signature(raw, secret=secret, t=t)
        )
        sent.update(headers or {})
        return self.client.post(URL, data=raw, headers=sent)


@pytest.fixture
def sender(client, clock) -> Sender:
    return Sender(client, clock)


@pytest.fixture
def subscribe(client, subscriptions):
    """Subscribes a new browser subscription (as the test client's subscriber)."""

    def make(**kwargs: Any):
        sub = subscriptions(**kwargs)
        response = client.post("/api/push/subscribe", json={"subscription": sub.to_json()})
        assert response.status_code == 201, response.json
        return sub

    return make


@pytest.fixture
def deliver(app, clock):
    """Records one of our deliveries to an endpoint's subscription; returns its deliveryId."""
    topics: list[int] = []

    def make(endpoint: str) -> str:
        now = clock.now()
        with db.begin(app) as session:
            if not topics:
                topic = catalogue.add_topic(
                    session, slug="news", category="News", label="News", now=now
                )
                session.flush()
                topics.append(topic.id)
            sub = session.scalars(
                sa.select(PushSubscription).where(
                    PushSubscription.endpoint_hash == endpoint_hash(endpoint)
                )
            ).one()
            campaign = Campaign(
                topic_id=topics[0],
                title="Hello",
                body="Hello",
                send_at=now,
                status="sending",
                created_by="test",
                created_at=now,
            )
            session.add(campaign)
            session.flush()
            delivery = Delivery(
                campaign_id=campaign.id,
                subscription_id=sub.id,
                push_service=sub.push_service,
                status="accepted",
                attempts=1,
                next_attempt_at=now,
                consent_reason="opt_in",
                updated_at=now,
            )
            session.add(delivery)
            session.flush()
            return str(delivery.id)

    return make
