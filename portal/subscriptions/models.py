"""Subscribers and their push subscriptions (SPEC §3, seed 000 §3)."""

from __future__ import annotations

import datetime as dt
import enum
import uuid

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from portal.db import Base, UTCDateTime, uuid7


class SubscriptionState(enum.StrEnum):
    PENDING = "pending"
    ACTIVE = "active"
    STALE = "stale"
    EXPIRED = "expired"
    REVOKED = "revoked"


LIVE_STATES = (SubscriptionState.PENDING, SubscriptionState.ACTIVE)

subscription_state_type = sa.Enum(
    SubscriptionState,
    name="push_subscription_state",
    values_callable=lambda states: [s.value for s in states],
    create_constraint=True,
    native_enum=True,
    validate_strings=True,
)


class PushService(enum.StrEnum):
    FCM = "fcm"
    AUTOPUSH = "autopush"
    APPLE = "apple"
    WNS = "wns"
    OTHER = "other"


class EndReason(enum.StrEnum):
    """How a subscription ended; kept on the tombstone and in the retention counters."""

    UNSUBSCRIBED = "unsubscribed"
    ROTATED = "rotated"
    REVOKED_BY_PUSH_SERVICE = "revoked_by_push_service"
    REVOKED_BY_FEEDBACK = "revoked_by_feedback"
    EXPIRED = "expired"
    ERASED = "erased"


class Subscriber(Base):
    """Whoever holds preferences: an account or an anonymous browser."""

    __tablename__ = "subscriber"

    id: Mapped[uuid.UUID] = mapped_column(sa.Uuid, primary_key=True, default=uuid7)
    external_user_id: Mapped[str | None] = mapped_column(sa.String(255), unique=True)
    region_code: Mapped[str | None] = mapped_column(sa.String(8))
    locale: Mapped[str | None] = mapped_column(sa.String(35))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    erased_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    # The short reference the person quotes to staff (portal/subscriptions/reference.py):
    # given when their preference centre first shows it, removed by erasure.
    reference: Mapped[str | None] = mapped_column(sa.String(8))
    # The zone the person's browser reported when subscribing (canonical IANA name; see
    # portal/campaigns/zones.py browser_zone); None where no browser said.
    time_zone: Mapped[str | None] = mapped_column(sa.String(64))
    # "At most one a day", chosen in the preference centre: caps this person's marketing
    # notifications at one per rolling day (portal/delivery/caps.py).
    one_a_day: Mapped[bool] = mapped_column(
        sa.Boolean, nullable=False, default=False, server_default=sa.false()
    )
    # The person's own quiet hours ("Do not send between …" in the preference centre),
    # local times in ``time_zone``: both or neither (portal/delivery/quiet.py).
    quiet_from: Mapped[dt.time | None] = mapped_column(sa.Time)
    quiet_until: Mapped[dt.time | None] = mapped_column(sa.Time)

    __table_args__ = (
        sa.Index("ix_subscriber_reference", "reference", unique=True),
        # The compliance look-up's "account ID starts with": LIKE 'prefix%' can read a
        # b-tree only in byte order, which the unique constraint's index under the
        # database's collation is not (migration 0035).
        sa.Index(
            "ix_subscriber_external_user_id_prefix",
            "external_user_id",
            postgresql_ops={"external_user_id": "text_pattern_ops"},
        ),
        # The erased, few among everyone: the compliance dashboard's check that each
        # erased person's devices are tombstoned and told (migration 0035).
        sa.Index(
            "ix_subscriber_erased",
            "erased_at",
            postgresql_where=sa.text("erased_at IS NOT NULL"),
            sqlite_where=sa.text("erased_at IS NOT NULL"),
        ),
        sa.CheckConstraint("(quiet_from IS NULL) = (quiet_until IS NULL)", name="quiet_hours"),
    )


# The partial index's predicate; its text must stay as the migration wrote it.
_LIVE = f"state IN ({', '.join(repr(s.value) for s in LIVE_STATES)}) AND deleted_at IS NULL"


class PushSubscription(Base):
    """A push subscription: a credential issued by a push service, addressed by its hash.

    Tombstones (``deleted_at`` set) keep only the hash, the subscriber and the dates;
    the credential columns are emptied, so they are nullable, and a CHECK makes sure a
    live row always has them.
    """

    __tablename__ = "push_subscription"

    id: Mapped[uuid.UUID] = mapped_column(sa.Uuid, primary_key=True, default=uuid7)
    endpoint: Mapped[str | None] = mapped_column(sa.Text)
    endpoint_hash: Mapped[bytes] = mapped_column(sa.LargeBinary(32), nullable=False, unique=True)
    push_service: Mapped[str] = mapped_column(sa.String(16), nullable=False)
    p256dh: Mapped[str | None] = mapped_column(sa.String(96))
    auth_sealed: Mapped[bytes | None] = mapped_column(sa.LargeBinary(64))
    auth_key_version: Mapped[int] = mapped_column(sa.SmallInteger, nullable=False, default=1)
    content_encoding: Mapped[str] = mapped_column(
        sa.String(16), nullable=False, default="aes128gcm", server_default="aes128gcm"
    )
    expiration_time: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    subscriber_id: Mapped[uuid.UUID | None] = mapped_column(
        sa.Uuid, sa.ForeignKey("subscriber.id", ondelete="SET NULL")
    )
    user_agent: Mapped[str | None] = mapped_column(sa.String(400))
    locale: Mapped[str | None] = mapped_column(sa.String(35))
    origin: Mapped[str] = mapped_column(sa.String(255), nullable=False)
    state: Mapped[SubscriptionState] = mapped_column(
        subscription_state_type, nullable=False, default=SubscriptionState.PENDING
    )
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    last_seen_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    last_success_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    last_failure_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    last_status_code: Mapped[int | None] = mapped_column(sa.SmallInteger)
    consecutive_failures: Mapped[int] = mapped_column(
        sa.SmallInteger, nullable=False, default=0, server_default="0"
    )
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    end_reason: Mapped[str | None] = mapped_column(sa.String(32))
    # The consent event recording the browser's permission grant for this subscription:
    # the justification of a transactional send.
    grant_event_seq: Mapped[int | None] = mapped_column(sa.BigInteger)
    # When the row turned stale, and when it ended (revoked or expired): the clocks of the
    # expiry sweep and the tombstone grace period.
    stale_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    ended_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    deleted_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    # When the browser was first told to drop this ended subscription (the heartbeat's
    # "unsubscribe"): an erasure is complete on the device only from then on.
    browser_told_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        sa.CheckConstraint("length(endpoint_hash) = 32", name="endpoint_hash_len"),
        sa.CheckConstraint("length(p256dh) BETWEEN 80 AND 96", name="p256dh_len"),
        sa.CheckConstraint(
            "deleted_at IS NOT NULL OR "
            "(endpoint IS NOT NULL AND p256dh IS NOT NULL AND auth_sealed IS NOT NULL)",
            name="live_has_credentials",
        ),
        sa.CheckConstraint(
            "push_service IN ('fcm', 'autopush', 'apple', 'wns', 'other')", name="push_service"
        ),
        sa.CheckConstraint("consecutive_failures >= 0", name="failures_not_negative"),
        # Fan-out: every live subscription of one subscriber.
        sa.Index(
            "ix_push_subscription_subscriber_live",
            "subscriber_id",
            postgresql_where=sa.text(_LIVE),
            sqlite_where=sa.text(_LIVE),
        ),
        # A person's devices, stale ones included (the preference centre), and whether an
        # identity still holds any subscription, ended ones included (a preference link
        # to it, portal.consent.accounts.link_manages): every row (migration 0034).
        sa.Index("ix_push_subscription_subscriber", "subscriber_id"),
        # Ageing sweeps: rows that have gone quiet. Tombstones stay out.
        sa.Index(
            "ix_push_subscription_sweep",
            "state",
            "last_seen_at",
            postgresql_where=sa.text("deleted_at IS NULL"),
            sqlite_where=sa.text("deleted_at IS NULL"),
        ),
        # Per-provider accounting and routing.
        sa.Index(
            "ix_push_subscription_service",
            "push_service",
            "state",
            postgresql_where=sa.text("deleted_at IS NULL"),
            sqlite_where=sa.text("deleted_at IS NULL"),
        ),
    )
