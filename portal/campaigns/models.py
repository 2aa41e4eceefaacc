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


class Campaign(Base):
    __tablename__ = "campaign"

    id: Mapped[uuid.UUID] = mapped_column(sa.Uuid, primary_key=True, default=uuid7)
    topic_id: Mapped[int] = mapped_column(sa.Integer, sa.ForeignKey("topic.id"), nullable=False)
    title: Mapped[str] = mapped_column(sa.String(200), nullable=False)
    body: Mapped[str] = mapped_column(sa.Text, nullable=False)
    url: Mapped[str | None] = mapped_column(sa.String(2048))
    icon: Mapped[str | None] = mapped_column(sa.String(2048))
    # Rich notifications: a large image, a small monochrome badge, up to two action
    # buttons ([{"title": …, "url": …}], in order), and the two display flags.
    image: Mapped[str | None] = mapped_column(sa.String(2048))
    badge: Mapped[str | None] = mapped_column(sa.String(2048))
    actions: Mapped[list[dict[str, str]] | None] = mapped_column(sa.JSON)
    require_interaction: Mapped[bool] = mapped_column(
        sa.Boolean, nullable=False, default=False, server_default=sa.false()
    )
    silent: Mapped[bool] = mapped_column(
        sa.Boolean, nullable=False, default=False, server_default=sa.false()
    )
    urgency: Mapped[str] = mapped_column(sa.String(8), nullable=False, default="normal")
    ttl: Mapped[int] = mapped_column(sa.Integer, nullable=False, default=86400)
    collapse_key: Mapped[str | None] = mapped_column(sa.String(32))
    send_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    deliver_until: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    # The IANA zone the times were chosen in, for showing them as chosen (they are stored
    # in UTC). NULL: launched before the zone was kept, and shown in UTC only.
    time_zone: Mapped[str | None] = mapped_column(sa.String(64))
    # Local-time delivery (portal/campaigns/local_time.py): each person's delivery is due
    # when their zone's clocks first show ``local_time`` at or after ``send_at``; people
    # with no known zone use ``fallback_zone``. Both NULL: everyone at ``send_at``.
    local_time: Mapped[dt.time | None] = mapped_column(sa.Time)
    fallback_zone: Mapped[str | None] = mapped_column(sa.String(64))
    # A/B variants (portal/campaigns/variants.py): [{"title", "body", "image"}, …] in
    # order A, B(, C); A is the campaign's own title, body and image. NULL: no test.
    variants: Mapped[list[dict[str, str | None]] | None] = mapped_column(sa.JSON)
    # Test on ``test_share`` percent of the audience, then ``winner_after`` seconds after
    # ``send_at`` send the best variant (``winner``) to the rest. NULL: everyone at once.
    test_share: Mapped[int | None] = mapped_column(sa.SmallInteger)
    winner_after: Mapped[int | None] = mapped_column(sa.Integer)
    winner: Mapped[int | None] = mapped_column(sa.SmallInteger)
    winner_chosen_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
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
    # Its deliveries by status ({"accepted": n, …}; statuses with none left out), kept
    # once it is settled: finished, nothing queued or out (portal/campaigns/settled.py).
    # NULL: counted from its rows.
    settled_counts: Mapped[dict[str, int] | None] = mapped_column(sa.JSON)

    __table_args__ = (
        sa.CheckConstraint(
            "status IN ('scheduled', 'sending', 'paused', 'completed', 'cancelled', 'expired')",
            name="status",
        ),
        sa.CheckConstraint("urgency IN ('very-low', 'low', 'normal', 'high')", name="urgency"),
        sa.CheckConstraint("ttl >= 0", name="ttl"),
        sa.CheckConstraint(
            "(local_time IS NULL) = (fallback_zone IS NULL)", name="local_time_fallback"
        ),
        sa.Index("ix_campaign_status_send_at", "status", "send_at"),
    )


class Draft(Base):
    """A campaign not launched yet: the form as it was typed, kept to edit later.

    Never read by the engine (a draft has no deliveries and no status a dispatcher looks
    for); launching it makes a :class:`Campaign` through the form's review and launch,
    and records which one here. ``version`` goes up with every save, and every save and
    the launch are conditional on it, so neither overwrites what another tab did.
    """

    __tablename__ = "campaign_draft"

    id: Mapped[uuid.UUID] = mapped_column(sa.Uuid, primary_key=True, default=uuid7)
    # The campaign form's fields as typed (strings): what the edit page shows again.
    fields: Mapped[dict[str, str]] = mapped_column(sa.JSON, nullable=False)
    title: Mapped[str] = mapped_column(sa.String(200), nullable=False)
    version: Mapped[int] = mapped_column(sa.Integer, nullable=False, default=1)
    created_by: Mapped[str] = mapped_column(sa.String(255), nullable=False)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    updated_by: Mapped[str] = mapped_column(sa.String(255), nullable=False)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    cloned_from: Mapped[uuid.UUID | None] = mapped_column(sa.Uuid, sa.ForeignKey("campaign.id"))
    launched_campaign_id: Mapped[uuid.UUID | None] = mapped_column(
        sa.Uuid, sa.ForeignKey("campaign.id"), unique=True
    )
    launched_by: Mapped[str | None] = mapped_column(sa.String(255))
    launched_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        sa.CheckConstraint("version >= 1", name="version"),
        sa.Index("ix_campaign_draft_updated_at", "updated_at"),
    )


class CircuitState(Base):
    """A push service that keeps answering 429/5xx is slowed down, visibly."""

    __tablename__ = "push_circuit"

    push_service: Mapped[str] = mapped_column(sa.String(16), primary_key=True)
    open_until: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    reason: Mapped[str] = mapped_column(sa.String(64), nullable=False)
    opened_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
