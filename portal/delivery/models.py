"""Deliveries (one campaign to one subscription, and how its sending went) and the
display receipts the service worker reports for them."""

from __future__ import annotations

import datetime as dt
import enum
import uuid

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from portal.db import Base, UTCDateTime


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


# The rows a claim may take (queued, or out under a lease that may have run out): the
# predicate of the partial index ``ix_delivery_due``, repeated word for word in the
# claim query so both databases' planners see the index applies.
DUE_SQL = "status IN ('queued', 'sending')"


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
    # The A/B variant this subscription was given (0 = A; portal/campaigns/variants.py),
    # NULL for a campaign without variants.
    variant: Mapped[int | None] = mapped_column(sa.SmallInteger)
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
        # A campaign's progress counts and "anything left?" checks (its prefix).
        sa.Index("ix_delivery_claim", "campaign_id", "status", "next_attempt_at"),
        # The claim query: each campaign's rows still to send, by when they are due,
        # then id (migrations 0017, 0026, 0033). A row leaves it once answered, so a
        # claim's cost does not grow with what was sent; it reads only the rows already
        # due, so nor with what waits for later (a local time, a retry); and only the
        # sending campaigns' part, so nor with a paused campaign's queue.
        sa.Index(
            "ix_delivery_due",
            "campaign_id",
            "next_attempt_at",
            "id",
            postgresql_where=sa.text(DUE_SQL),
            sqlite_where=sa.text(DUE_SQL),
        ),
        # A subscription's deliveries; with updated_at, its recent sends, which the
        # frequency caps count (portal/delivery/caps.py, migration 0023).
        sa.Index("ix_delivery_subscription_sent", "subscription_id", "updated_at"),
        # The compliance look-up: deliveries a person's consent events allowed.
        sa.Index(
            "ix_delivery_consent_event_seq",
            "consent_event_seq",
            postgresql_where=sa.text("consent_event_seq IS NOT NULL"),
            sqlite_where=sa.text("consent_event_seq IS NOT NULL"),
        ),
        # An id is the deliveryId a notification carries: never handed out twice, even
        # after retention deleted the newest rows (PostgreSQL: a sequence; migration 0032).
        {"sqlite_autoincrement": True},
    )


class ReceiptEvent(enum.StrEnum):
    """What the browser saw happen. A push service accepting a message (a 201) is a
    third, separate fact, recorded on the delivery itself, not here."""

    SHOWN = "shown"
    CLICKED = "clicked"
    # A click on one of the notification's buttons (the payload's ``actions[].action``).
    ACTION_1 = "action-1"
    ACTION_2 = "action-2"


class DeliveryReceipt(Base):
    """One fact per (delivery, event): a repeated report is the same fact."""

    __tablename__ = "delivery_receipt"

    id: Mapped[int] = mapped_column(
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True
    )
    # The id as the worker reported it (text, no foreign key); only ids of our
    # deliveries to the reporting browser are accepted (portal/delivery/receipts.py).
    delivery_id: Mapped[str] = mapped_column(sa.String(64), nullable=False)
    event: Mapped[str] = mapped_column(sa.String(16), nullable=False)
    # Indexed for the retention job (portal/retention/tables.py).
    at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False, index=True)
    # Only the hash: a receipt never stores a credential.
    endpoint_hash: Mapped[bytes | None] = mapped_column(sa.LargeBinary(32))

    __table_args__ = (
        sa.UniqueConstraint("delivery_id", "event", name="uq_delivery_receipt_delivery_event"),
        sa.CheckConstraint("event IN ('shown', 'clicked', 'action-1', 'action-2')", name="event"),
        sa.CheckConstraint(
            "endpoint_hash IS NULL OR length(endpoint_hash) = 32", name="endpoint_hash_len"
        ),
    )


class DeliveryTally(Base):
    """Deliveries folded away by the delivery retention (portal/campaigns/tally.py): how
    many of a campaign's deliveries ended each way, counted before their rows were
    deleted, so its pages show the same figures afterwards. One row per folded batch and
    group; a campaign folded to the end is compacted to one row per group."""

    __tablename__ = "delivery_tally"

    id: Mapped[int] = mapped_column(
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True
    )
    campaign_id: Mapped[uuid.UUID] = mapped_column(
        sa.Uuid, sa.ForeignKey("campaign.id"), nullable=False, index=True
    )
    # The group: what the campaign pages group deliveries by.
    status: Mapped[str] = mapped_column(sa.String(10), nullable=False)
    reason: Mapped[str | None] = mapped_column(sa.String(64))
    last_status_code: Mapped[int | None] = mapped_column(sa.SmallInteger)
    push_service: Mapped[str] = mapped_column(sa.String(16), nullable=False)
    variant: Mapped[int | None] = mapped_column(sa.SmallInteger)
    # The counts: deliveries, the most attempts any took, how many took more than one,
    # and how many accepted ones the browser reported shown (or clicked) and clicked.
    deliveries: Mapped[int] = mapped_column(sa.BigInteger, nullable=False)
    most_attempts: Mapped[int] = mapped_column(sa.SmallInteger, nullable=False)
    retried: Mapped[int] = mapped_column(sa.BigInteger, nullable=False)
    shown: Mapped[int] = mapped_column(sa.BigInteger, nullable=False)
    clicked: Mapped[int] = mapped_column(sa.BigInteger, nullable=False)


class FunnelTally(Base):
    """The delivery funnel of folded deliveries (portal/campaigns/funnel.py): each
    stage's count per minute (``at``, minutes since 1970), the counts with no time
    (``at`` NULL), and the first acceptance and the latest event (``kind`` ``first`` and
    ``last``, ``at`` in seconds) — the rows :func:`portal.campaigns.funnel.read` adds up."""

    __tablename__ = "funnel_tally"

    id: Mapped[int] = mapped_column(
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True
    )
    campaign_id: Mapped[uuid.UUID] = mapped_column(
        sa.Uuid, sa.ForeignKey("campaign.id"), nullable=False, index=True
    )
    kind: Mapped[str] = mapped_column(sa.String(16), nullable=False)
    at: Mapped[int | None] = mapped_column(sa.BigInteger)
    n: Mapped[int] = mapped_column(sa.BigInteger, nullable=False)
