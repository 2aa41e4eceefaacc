"""Topics, policy versions, current preferences and the append-only consent log (seed 002)."""

from __future__ import annotations

import datetime as dt
import enum
import uuid

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from portal.db import Base, UTCDateTime


class PreferenceState(enum.StrEnum):
    OPT_IN = "opt_in"
    OPT_OUT = "opt_out"
    UNSET = "unset"


class EventKind(enum.StrEnum):
    PREFERENCE_CHANGED = "preference_changed"
    PERMISSION_GRANTED = "permission_granted"
    SUBSCRIBED = "subscribed"
    ENDPOINT_ROTATED = "endpoint_rotated"
    REVOKED_BY_PUSH_SERVICE = "revoked_by_push_service"
    REVOKED_BY_FEEDBACK = "revoked_by_feedback"
    EXPIRED = "expired"
    UNSUBSCRIBED = "unsubscribed"
    ACCOUNT_LINKED = "account_linked"
    ERASED = "erased"
    # The person's own frequency cap ("How often" in the preference centre): states
    # ``as_sent`` and ``one_a_day`` (portal/delivery/caps.py applies it).
    FREQUENCY_CHOSEN = "frequency_chosen"
    # The person's own quiet hours ("Do not send between …"): states ``none`` or the
    # window as ``HH:MM-HH:MM`` (portal/delivery/quiet.py applies it).
    QUIET_HOURS_CHOSEN = "quiet_hours_chosen"
    # A sequence number taken by a transaction that rolled back, closed by the sequencer
    # (portal.consent.tree) so the tree never stalls and never hides the hole.
    GAP = "gap"


class Source(enum.StrEnum):
    """Which screen or process a decision came through."""

    SUBSCRIBE_PAGE = "subscribe-page"
    PREFERENCE_CENTRE = "preference-centre"
    API = "api"
    ACCOUNT_LINK = "account-link"
    SERVICE_WORKER = "service-worker"
    STAFF = "staff"
    SYSTEM = "system"


class Topic(Base):
    __tablename__ = "topic"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    slug: Mapped[str] = mapped_column(sa.String(64), nullable=False, unique=True)
    category: Mapped[str] = mapped_column(sa.String(64), nullable=False)
    label: Mapped[str] = mapped_column(sa.String(120), nullable=False)
    description: Mapped[str] = mapped_column(sa.Text, nullable=False, default="", server_default="")
    is_transactional: Mapped[bool] = mapped_column(
        sa.Boolean, nullable=False, default=False, server_default=sa.false()
    )
    default_state: Mapped[str] = mapped_column(
        sa.String(8), nullable=False, default="opt_out", server_default="opt_out"
    )
    position: Mapped[int] = mapped_column(sa.Integer, nullable=False, default=0, server_default="0")
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    retired_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        sa.CheckConstraint("default_state IN ('opt_in', 'opt_out')", name="default_state"),
    )


class PolicyVersion(Base):
    """The exact disclosure text people were shown. Immutable once published (triggers)."""

    __tablename__ = "policy_version"

    version: Mapped[str] = mapped_column(sa.String(32), primary_key=True)
    published_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    text: Mapped[str] = mapped_column(sa.Text, nullable=False)
    text_sha256: Mapped[str] = mapped_column(sa.String(64), nullable=False)


class TopicPreference(Base):
    """Current state, one row per (subscriber, topic). Withdrawals write opt_out, never delete."""

    __tablename__ = "topic_preference"

    subscriber_id: Mapped[uuid.UUID] = mapped_column(
        sa.Uuid, sa.ForeignKey("subscriber.id"), primary_key=True
    )
    topic_id: Mapped[int] = mapped_column(sa.Integer, sa.ForeignKey("topic.id"), primary_key=True)
    state: Mapped[str] = mapped_column(sa.String(8), nullable=False)
    source: Mapped[str] = mapped_column(sa.String(32), nullable=False)
    policy_version: Mapped[str | None] = mapped_column(
        sa.String(32), sa.ForeignKey("policy_version.version")
    )
    decided_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    recorded_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    # The consent event that set this state: the proof a send can point to.
    event_seq: Mapped[int] = mapped_column(sa.BigInteger, nullable=False)

    __table_args__ = (
        sa.CheckConstraint("state IN ('opt_in', 'opt_out', 'unset')", name="state"),
        sa.Index(
            "ix_topic_preference_opt_in",
            "topic_id",
            "subscriber_id",
            postgresql_where=sa.text("state = 'opt_in'"),
            sqlite_where=sa.text("state = 'opt_in'"),
        ),
    )


class ConsentEvent(Base):
    """One row per transition, one leaf of the log's Merkle tree; the database refuses
    UPDATE and DELETE.

    Holds no raw personal data (ids and a user-agent family, never an IP or endpoint),
    so erasure never has to edit it.
    """

    __tablename__ = "consent_event"

    # PostgreSQL: from the sequence (migration 0018), with no lock; SQLite: max + 1 under
    # the write lock (portal.consent.log.append_many).
    seq: Mapped[int] = mapped_column(
        sa.BigInteger, sa.Sequence("consent_event_seq"), primary_key=True, autoincrement=False
    )
    subscriber_id: Mapped[uuid.UUID] = mapped_column(sa.Uuid, nullable=False, index=True)
    subscription_id: Mapped[uuid.UUID | None] = mapped_column(sa.Uuid)
    topic_id: Mapped[int | None] = mapped_column(sa.Integer, sa.ForeignKey("topic.id"))
    kind: Mapped[str] = mapped_column(sa.String(32), nullable=False)
    previous_state: Mapped[str | None] = mapped_column(sa.String(16))
    new_state: Mapped[str | None] = mapped_column(sa.String(16))
    source: Mapped[str] = mapped_column(sa.String(32), nullable=False)
    policy_version: Mapped[str | None] = mapped_column(sa.String(32))
    decided_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    recorded_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False, index=True)
    actor: Mapped[str] = mapped_column(sa.String(64), nullable=False)
    context: Mapped[str] = mapped_column(sa.Text, nullable=False, default="{}")
    # The hash chain of the events written before the tree (migration 0018): kept and
    # verified as history; NULL on every event written since.
    prev_hash: Mapped[bytes | None] = mapped_column(sa.LargeBinary(32), unique=True)
    hash: Mapped[bytes | None] = mapped_column(sa.LargeBinary(32), unique=True)

    __table_args__ = (
        sa.CheckConstraint("length(hash) = 32 AND length(prev_hash) = 32", name="hash_len"),
    )


class ConsentLogNode(Base):
    """A complete subtree of the log's tree (``portal.consent.merkle``'s stored layout):
    leaves ``[idx·2^level, (idx+1)·2^level)``. Level 0 is the leaf hashes. Append-only."""

    __tablename__ = "consent_log_node"

    level: Mapped[int] = mapped_column(sa.SmallInteger, primary_key=True, autoincrement=False)
    idx: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    hash: Mapped[bytes] = mapped_column(sa.LargeBinary(32), nullable=False)

    __table_args__ = (
        sa.CheckConstraint("length(hash) = 32", name="hash_len"),
        sa.Index(
            "ix_consent_log_node_leaf_hash",
            "hash",
            postgresql_where=sa.text("level = 0"),
            sqlite_where=sa.text("level = 0"),
        ),
    )


class ConsentLogState(Base):
    """The sequencer's one row: how far the tree goes, its frontier, the gap it waits on.

    Integration holds this row's lock (SELECT … FOR UPDATE) from reading the state to
    COMMIT, so two sequencers never integrate the same leaf.
    """

    __tablename__ = "consent_log_state"

    id: Mapped[int] = mapped_column(sa.SmallInteger, primary_key=True, autoincrement=False)
    tree_size: Mapped[int] = mapped_column(sa.BigInteger, nullable=False)
    frontier: Mapped[bytes] = mapped_column(sa.LargeBinary, nullable=False)
    gap_seq: Mapped[int | None] = mapped_column(sa.BigInteger)
    gap_seen_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    updated_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (sa.CheckConstraint("id = 1", name="one_row"),)


class ConsentTreeHead(Base):
    """A signed tree head (RFC 6962 §3.5 layout, Ed25519), one per tree size. Immutable."""

    __tablename__ = "consent_tree_head"

    tree_size: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    timestamp_ms: Mapped[int] = mapped_column(sa.BigInteger, nullable=False)
    root_hash: Mapped[bytes] = mapped_column(sa.LargeBinary(32), nullable=False)
    signature: Mapped[bytes] = mapped_column(sa.LargeBinary(64), nullable=False)
    # The key that signed it, so a head outlives a key rotation readably.
    public_key: Mapped[bytes] = mapped_column(sa.LargeBinary(32), nullable=False)


class DecisionWeek(Base):
    """One past week's opt-ins and opt-outs per topic, counted once from the consent log
    for the compliance dashboard's chart (``portal.compliance.services.weekly_decisions``):
    ``{"<topic id>:opt_in": n, …}`` (pairs with none left out). Kept once no event
    recorded in the week can still commit; the chart's older weeks are deleted by the
    ``table-retention`` job."""

    __tablename__ = "decision_week"

    week: Mapped[dt.date] = mapped_column(sa.Date, primary_key=True)  # its Monday (UTC)
    counts: Mapped[dict[str, int]] = mapped_column(sa.JSON, nullable=False)
    counted_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
