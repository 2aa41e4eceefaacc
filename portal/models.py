"""Every model, imported in one place so the metadata is complete (Alembic, tests)."""

from portal.consent.models import ConsentEvent, PolicyVersion, Topic, TopicPreference
from portal.subscriptions.models import PushSubscription, Subscriber

__all__ = [
    "ConsentEvent",
    "PolicyVersion",
    "PushSubscription",
    "Subscriber",
    "Topic",
    "TopicPreference",
]
