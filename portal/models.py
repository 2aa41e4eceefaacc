"""Every model, imported in one place so the metadata is complete (Alembic, tests)."""

from portal.campaigns.media_models import Picture
from portal.campaigns.models import Campaign, CircuitState, Draft
from portal.campaigns.testdevice_models import TestDevice, TestSend
from portal.consent.models import (
    ConsentEvent,
    DecisionWeek,
    PolicyVersion,
    Topic,
    TopicPreference,
)
from portal.delivery.models import Delivery, DeliveryReceipt
from portal.feedback.models import FeedbackApplied, FeedbackDigest
from portal.operations.models import JobRun, JobState
from portal.ratelimit import RateLimitCounter
from portal.retention.models import RetentionCounter
from portal.staff.models import StaffAudit, StaffLoginThrottle, StaffRole, StaffSession, StaffUser
from portal.subscriptions.models import PushSubscription, Subscriber

__all__ = [
    "Campaign",
    "CircuitState",
    "ConsentEvent",
    "DecisionWeek",
    "Delivery",
    "DeliveryReceipt",
    "Draft",
    "FeedbackApplied",
    "FeedbackDigest",
    "JobRun",
    "JobState",
    "Picture",
    "PolicyVersion",
    "PushSubscription",
    "RateLimitCounter",
    "RetentionCounter",
    "StaffAudit",
    "StaffLoginThrottle",
    "StaffRole",
    "StaffSession",
    "StaffUser",
    "Subscriber",
    "TestDevice",
    "TestSend",
    "Topic",
    "TopicPreference",
]
