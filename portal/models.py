"""Every model, imported in one place so the metadata is complete (Alembic, tests)."""

from portal.subscriptions.models import PushSubscription, Subscriber

__all__ = ["PushSubscription", "Subscriber"]
