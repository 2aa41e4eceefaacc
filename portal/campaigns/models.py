"""A campaign targets one topic; one delivery row per (campaign, subscription)."""

from __future__ import annotations

import datetime as dt
import enum
import uuid

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from portal.db import Base, UTCDateTime, uuid7


class CampaignStatus(enum.StrEnum):
    SCHEDULED = "scheduled"  # launched, waiting for send_at
    SENDING = "sending"  # materialising and sending
    PAUSED = "paused"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"  # "don't deliver after" passed with deliveries left


class DeliveryStatus(enum.StrEnum):
    QUEUED = "queued"
    SENDING = "sending"
    ACCEPTED = "accepted"
    FAILED = "failed"
    REVOKED = "revoked"
    SKIPPED = "skipped"


class Unsendable(enum.StrEnum):
    """Why one delivery could not be built or sent: its ``reason``. Only that delivery
    ends (SPEC §7); the rest of its batch, the job and the campaign go on."""

    # Skipped, as the subscription's fault is not known: the sealed auth secret or the
    # public key cannot be opened or used (a data key missing from this process...).
    UNREADABLE_KEYS = "unreadable_keys"
    # Failed:
    INVALID_ENDPOINT = "invalid_endpoint"  # the stored endpoint is no push endpoint
    PAYLOAD_TOO_LARGE = "payload_too_large"
    INVALID_REQUEST = "invalid_request"  # TTL, urgency or topic no push service takes
    SEND_ERROR = "send_error"  # anything else raised for this one delivery


FINAL_DELIVERY_STATES = (
    DeliveryStatus.ACCEPTED,
    DeliveryStatus.FAILED,
    DeliveryStatus.REVOKED,
    DeliveryStatus.SKIPPED,
)


class Campaign(Base):
    __tablename__ = "campaign"

    id: Mapped[uuid.UUID] = mapped_column(sa.Uuid, primary_key=True, default=uuid7)
    topic_id: Mapped[int] = mapped_column(sa.Integer, sa.ForeignKey("topic.id"), nullable=False)
    title: Mapped[str] = mapped_column(sa.String(200), nullable=False)
    body: Mapped[str] = mapped_column(sa.Text, nullable=False)
    url: Mapped[str | None] = mapped_column(sa.String(2048))
    icon: Mapped[str | None] = mapped_column(sa.String(2048))
    urgency: Mapped[str] = mapped_column(sa.String(8), nullable=False, default="normal")
    ttl: Mapped[int] = mapped_column(sa.Integer, nullable=False, default=86400)
    collapse_key: Mapped[str | None] = mapped_column(sa.String(32))
    send_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    deliver_until: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    status: Mapped[str] = mapped_column(sa.String(16), nullable=False)
    created_by: Mapped[str] = mapped_column(sa.String(255), nullable=False)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    launched_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    # Materialisation walks the recipients by subscription id; this is how far it got, so
    # a crash resumes where it stopped. Set to done when the audience is complete.
    materialised_through: Mapped[uuid.UUID | None] = mapped_column(sa.Uuid)
    materialised_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    is_test: Mapped[bool] = mapped_column(sa.Boolean, nullable=False, default=False)

    __table_args__ = (
        sa.CheckConstraint(
            "status IN ('scheduled', 'sending', 'paused', 'completed', 'cancelled', 'expired')",
            name="status",
        ),
        sa.CheckConstraint("urgency IN ('very-low', 'low', 'normal', 'high')", name="urgency"),
        sa.CheckConstraint("ttl >= 0", name="ttl"),
        sa.Index("ix_campaign_status_send_at", "status", "send_at"),
    )


class Delivery(Base):
    __tablename__ = "delivery"

    id: Mapped[int] = mapped_column(
        sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    campaign_id: Mapped[uuid.UUID] = mapped_column(
        sa.Uuid, sa.ForeignKey("campaign.id"), nullable=False
    )
    # No foreign key: subscriptions are purged after the audit window; deliveries stay.
    subscription_id: Mapped[uuid.UUID] = mapped_column(sa.Uuid, nullable=False)
    push_service: Mapped[str] = mapped_column(sa.String(16), nullable=False)
    status: Mapped[str] = mapped_column(sa.String(10), nullable=False)
    attempts: Mapped[int] = mapped_column(sa.SmallInteger, nullable=False, default=0)
    next_attempt_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    last_status_code: Mapped[int | None] = mapped_column(sa.SmallInteger)
    reason: Mapped[str | None] = mapped_column(sa.String(64))
    # The proof of consent per send: why this subscription may get this campaign.
    consent_reason: Mapped[str] = mapped_column(sa.String(32), nullable=False)
    consent_event_seq: Mapped[int | None] = mapped_column(sa.BigInteger)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)

    __table_args__ = (
        sa.UniqueConstraint(
            "campaign_id", "subscription_id", name="uq_delivery_campaign_subscription"
        ),
        sa.CheckConstraint(
            "status IN ('queued', 'sending', 'accepted', 'failed', 'revoked', 'skipped')",
            name="status",
        ),
        # The claim query: a campaign's due work.
        sa.Index("ix_delivery_claim", "campaign_id", "status", "next_attempt_at"),
        sa.Index("ix_delivery_subscription_id", "subscription_id"),
        # The compliance look-up: deliveries a person's consent events allowed.
        sa.Index(
            "ix_delivery_consent_event_seq",
            "consent_event_seq",
            postgresql_where=sa.text("consent_event_seq IS NOT NULL"),
            sqlite_where=sa.text("consent_event_seq IS NOT NULL"),
        ),
    )


class CircuitState(Base):
    """A push service that keeps answering 429/5xx is slowed down, visibly."""

    __tablename__ = "push_circuit"

    push_service: Mapped[str] = mapped_column(sa.String(16), primary_key=True)
    open_until: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    reason: Mapped[str] = mapped_column(sa.String(64), nullable=False)
    opened_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
