"""Test data: browser subscriptions with real P-256 key pairs and auth secrets."""

from __future__ import annotations

import datetime as dt
import os
import secrets
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from portal.config import b64url_encode

HOSTS = {
    "fcm": "https://fcm.googleapis.com/fcm/send/",
    "autopush": "https://updates.push.services.mozilla.com/wpush/v2/",
    "apple": "https://web.push.apple.com/",
    "wns": "https://wns2-by3p.notify.windows.com/w/?token=",
    "local": "https://127.0.0.1:8443/push/",
}


@dataclass
class BrowserSubscription:
    """What ``pushManager.subscribe()`` gives a page, plus the keys only the browser has."""

    endpoint: str
    private_key: ec.EllipticCurvePrivateKey
    auth: bytes
    expiration_time: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def p256dh(self) -> str:
        return b64url_encode(
            self.private_key.public_key().public_bytes(
                serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
            )
        )

    @property
    def auth_b64(self) -> str:
        return b64url_encode(self.auth)

    def to_json(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "expirationTime": self.expiration_time,
            "keys": {"p256dh": self.p256dh, "auth": self.auth_b64},
        }


class SubscriptionFactory:
    def __init__(self) -> None:
        self.count = 0

    def __call__(
        self,
        service: str = "fcm",
        *,
        base: str | None = None,
        token: str | None = None,
        **kwargs: Any,
    ) -> BrowserSubscription:
        """A new browser subscription on ``service``'s host, or under ``base`` (e.g. a
        fake push service's ``https://127.0.0.1:<port>/push/``) with an optional ``token``."""
        self.count += 1
        token = token or secrets.token_urlsafe(96)
        return BrowserSubscription(
            endpoint=(base or HOSTS[service]) + token,
            private_key=ec.generate_private_key(ec.SECP256R1()),
            auth=os.urandom(16),
            **kwargs,
        )


class FunnelFactory:
    """A campaign with deliveries in given states and the receipts their browsers sent,
    written straight to the database as the sender and ``POST /api/push/receipt`` write
    them (tests of the delivery funnel, ``portal.campaigns.funnel``)."""

    def __init__(self, session: Any, *, sent_at: Any, topic: str = "security-alerts") -> None:
        import sqlalchemy as sa

        from portal.campaigns.models import Campaign
        from portal.consent.models import Topic
        from portal.db import uuid7

        self.session = session
        self.sent_at = sent_at
        topic_id = session.execute(sa.select(Topic.id).where(Topic.slug == topic)).scalar_one()
        self.campaign = Campaign(
            # Made when it was sent: on PostgreSQL its deliveries are in that month's
            # partition, or the default one (portal/delivery/partitions.py).
            id=uuid7(at=sent_at),
            topic_id=topic_id,
            title="New sign-in",
            body="A new device signed in.",
            send_at=sent_at,
            status="completed",
            created_by="test",
            created_at=sent_at,
            materialised_at=sent_at,
            finished_at=sent_at,
        )
        session.add(self.campaign)
        session.flush()

    def delivery(
        self,
        status: str = "accepted",
        *,
        after: Any = None,
        shown: Any = None,
        clicked: Any = None,
        button_1: Any = None,
        button_2: Any = None,
    ) -> str:
        """A delivery answered ``after`` the send (a timedelta; its status ``status``) and
        the receipts its browser sent ``shown``, ``clicked`` (on the notification) and
        ``button_1`` / ``button_2`` (on a button: ``action-1``, ``action-2``) after the
        send (None: none sent). Returns its ``deliveryId``."""
        import datetime as dt
        import uuid

        from portal.delivery.models import Delivery, DeliveryReceipt

        answered = self.sent_at + (after if after is not None else dt.timedelta(seconds=1))
        delivery = Delivery(
            campaign_id=self.campaign.id,
            subscription_id=uuid.uuid4(),
            push_service="fcm",
            status=status,
            attempts=1,
            next_attempt_at=self.sent_at,
            last_status_code=201 if status == "accepted" else None,
            consent_reason="transactional_grant",
            updated_at=answered,
        )
        self.session.add(delivery)
        self.session.flush()
        receipts = (
            ("shown", shown),
            ("clicked", clicked),
            ("action-1", button_1),
            ("action-2", button_2),
        )
        for event, delay in receipts:
            if delay is not None:
                self.session.add(
                    DeliveryReceipt(
                        delivery_id=str(delivery.id), event=event, at=self.sent_at + delay
                    )
                )
        self.session.flush()
        return str(delivery.id)

    def many(self, n: int, status: str = "accepted", **options: Any) -> None:
        for _ in range(n):
            self.delivery(status, **options)


# When a subscriber made by the factories below first came, unless a test says otherwise.
SUBSCRIBER_CREATED = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def make_subscriber(
    session: Any,
    external_user_id: str | None = None,
    *,
    reference: str | None = None,
    created_at: dt.datetime | None = None,
) -> Any:
    """A subscriber row (an account when ``external_user_id`` is given), flushed."""
    from portal.subscriptions.models import Subscriber

    columns: dict[str, Any] = {"reference": reference} if reference is not None else {}
    subscriber = Subscriber(
        external_user_id=external_user_id,
        created_at=created_at or SUBSCRIBER_CREATED,
        **columns,
    )
    session.add(subscriber)
    session.flush()
    return subscriber


def make_accounts(session: Any, names: list[str], *, created_at: dt.datetime | None = None) -> None:
    """A subscriber for each account ID in ``names``, in one INSERT (a thousand
    ``make_subscriber`` calls flush a thousand times)."""
    import sqlalchemy as sa

    from portal.db import uuid7
    from portal.subscriptions.models import Subscriber

    when = created_at or SUBSCRIBER_CREATED
    session.execute(
        sa.insert(Subscriber),
        [{"id": uuid7(), "external_user_id": name, "created_at": when} for name in names],
    )
