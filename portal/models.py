"""Every model, imported in one place so the metadata is complete (Alembic, tests)."""

from portal.consent.models import ConsentEvent, PolicyVersion, Topic, TopicPreference
from portal.delivery.models import DeliveryReceipt
from portal.subscriptions.models import PushSubscription, Subscriber

__all__ = [
    "ConsentEvent",
    "DeliveryReceipt",
    "PolicyVersion",
    "PushSubscription",
    "Subscriber",
    "Topic",
    "TopicPreference",
]
