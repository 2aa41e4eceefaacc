"""Every model, imported in one place so the metadata is complete (Alembic, tests)."""

from portal.staff.models import StaffAudit, StaffLoginThrottle, StaffRole, StaffSession, StaffUser
from portal.subscriptions.models import PushSubscription, Subscriber

__all__ = [
    "PushSubscription",
    "StaffAudit",
    "StaffLoginThrottle",
    "StaffRole",
    "StaffSession",
    "StaffUser",
    "Subscriber",
]
