"""What the delivery-feedback receiver keeps: each digest received, each cleanup applied."""

from __future__ import annotations

import datetime as dt
import enum
import uuid

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from portal.db import Base, UTCDateTime, uuid7


class DigestResult(enum.StrEnum):
    ACCEPTED = "accepted"  # applied and committed; answered 200
    REJECTED = "rejected"  # refused (422) or not applied (503); the sender retries or fixes


class Outcome(enum.StrEnum):
    """What applying one INVALID_TARGET event did."""

    REVOKED = "revoked"  # a live subscription was revoked
    UNMATCHED = "unmatched"  # no subscription has this target
    ALREADY_ENDED = "already_ended"  # the target had already ended (rotated, unsubscribed, …)


class FeedbackDigest(Base):
    """One signed digest (one page of a run), with what it held and what came of it.

    Bodies are never stored: the counts and flags are enough to follow the sender, and a
    body carries endpoints, which are personal data with a retention rule of their own.
    """

    __tablename__ = "feedback_digest"

    id: Mapped[uuid.UUID] = mapped_column(sa.Uuid, primary_key=True, default=uuid7)
    received_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False, index=True)
    organization: Mapped[str | None] = mapped_column(sa.String(128))
    result: Mapped[str] = mapped_column(sa.String(16), nullable=False)
    reason: Mapped[str | None] = mapped_column(sa.String(64))
    # Which of FEEDBACK_SECRETS verified it (0 or 1 while rotating): never the secret.
    secret_index: Mapped[int | None] = mapped_column(sa.SmallInteger)
    signed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    events: Mapped[int] = mapped_column(sa.Integer, nullable=False, default=0, server_default="0")
    applied: Mapped[int] = mapped_column(sa.Integer, nullable=False, default=0, server_default="0")
    revoked: Mapped[int] = mapped_column(sa.Integer, nullable=False, default=0, server_default="0")
    duplicates: Mapped[int] = mapped_column(
        sa.Integer, nullable=False, default=0, server_default="0"
    )
    ignored: Mapped[int] = mapped_column(sa.Integer, nullable=False, default=0, server_default="0")
    truncated: Mapped[bool] = mapped_column(
        sa.Boolean, nullable=False, default=False, server_default=sa.false()
    )
    # Accepted deliveries the sender summarised instead of listing: a figure, not a loss.
    events_omitted: Mapped[int | None] = mapped_column(sa.Integer)

    __table_args__ = (sa.CheckConstraint("result IN ('accepted', 'rejected')", name="result"),)


class FeedbackApplied(Base):
    """The durable marker of one applied cleanup event, per organization.

    ``event_key_hash`` is the SHA-256 of the seed's event key (``delivery:<id>`` or
    ``classic:<provider>:<len>:<target>:<at>``). The hash, not the key, is stored and
    indexed: a classic key embeds the endpoint, which must not outlive the subscription's
    tombstone, and an endpoint of up to 4096 characters would not fit a PostgreSQL
    B-tree entry.
    """

    __tablename__ = "feedback_applied"

    id: Mapped[uuid.UUID] = mapped_column(sa.Uuid, primary_key=True, default=uuid7)
    organization: Mapped[str] = mapped_column(sa.String(128), nullable=False)
    event_key_hash: Mapped[bytes] = mapped_column(sa.LargeBinary(32), nullable=False)
    key_kind: Mapped[str] = mapped_column(sa.String(16), nullable=False)
    delivery_id: Mapped[str | None] = mapped_column(sa.String(128))
    provider: Mapped[str] = mapped_column(sa.String(64), nullable=False)
    # SHA-256 of the target, as push_subscription.endpoint_hash: kept like a tombstone's.
    target_hash: Mapped[bytes] = mapped_column(sa.LargeBinary(32), nullable=False)
    outcome: Mapped[str] = mapped_column(sa.String(16), nullable=False)
    subscription_id: Mapped[uuid.UUID | None] = mapped_column(
        sa.Uuid, sa.ForeignKey("push_subscription.id", ondelete="SET NULL"), index=True
    )
    # Markers outlive the digest rows: they are what makes a late retry harmless.
    digest_id: Mapped[uuid.UUID | None] = mapped_column(
        sa.Uuid, sa.ForeignKey("feedback_digest.id", ondelete="SET NULL"), index=True
    )
    # Indexed for the retention job (portal/retention/tables.py).
    applied_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False, index=True)

    __table_args__ = (
        sa.UniqueConstraint("organization", "event_key_hash"),
        sa.CheckConstraint(
            "length(event_key_hash) = 32 AND length(target_hash) = 32", name="hash_len"
        ),
        sa.CheckConstraint("key_kind IN ('delivery', 'classic')", name="key_kind"),
        sa.CheckConstraint("outcome IN ('revoked', 'unmatched', 'already_ended')", name="outcome"),
    )
