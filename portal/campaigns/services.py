"""Campaigns: creation rules, launch and control, materialisation, claims and progress.

The payload limit is enforced here, when the campaign is created, never at send time:
the encrypted message must fit 4096 bytes, so the plaintext — the JSON the service
worker reads, with the largest delivery id it could carry — at most 3993.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
import zlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from portal.campaigns.models import Campaign, CampaignStatus, Delivery, DeliveryStatus
from portal.consent.catalogue import topic_by_slug
from portal.consent.models import Topic
from portal.consent.recipients import recipient_query
from portal.db import is_postgres
from portal.errors import Conflict, ValidationError

MAX_PLAINTEXT = 3993
MAX_TTL = 28 * 24 * 3600  # the longest any push service keeps a message
URGENCIES = ("very-low", "low", "normal", "high")
_COLLAPSE_KEY = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_LARGEST_DELIVERY_ID = 2**63 - 1
_d = Delivery.__table__
_c = Campaign.__table__
_MATERIALISED = (
    "campaign_id",
    "subscription_id",
    "push_service",
    "status",
    "attempts",
    "next_attempt_at",
    "consent_reason",
    "consent_event_seq",
    "updated_at",
)


@dataclass(frozen=True)
class CampaignDraft:
    topic: str
    title: str
    body: str
    url: str | None = None
    icon: str | None = None
    urgency: str = "normal"
    ttl: int = 86400
    collapse_key: str | None = None
    send_at: dt.datetime | None = None
    deliver_until: dt.datetime | None = None


def payload(campaign: Campaign, delivery_id: int) -> bytes:
    """What the service worker receives (decrypted): compact JSON."""
    message: dict[str, Any] = {
        "deliveryId": str(delivery_id),
        "campaignId": str(campaign.id),
        "title": campaign.title,
        "body": campaign.body,
        "tag": f"campaign-{campaign.id}",
    }
    if campaign.url:
        message["url"] = campaign.url
    if campaign.icon:
        message["icon"] = campaign.icon
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def payload_size(draft: CampaignDraft) -> int:
    """The plaintext size of the largest message this draft can produce."""
    probe = Campaign(
        id=uuid.UUID(int=0), title=draft.title, body=draft.body, url=draft.url, icon=draft.icon
    )
    return len(payload(probe, _LARGEST_DELIVERY_ID))


def _link(value: str | None, field: str) -> str | None:
    if not value:
        return None
    value = value.strip()
    if value.startswith("/") and not value.startswith("//"):
        return value  # same origin
    parts = urlsplit(value)
    if parts.scheme != "https" or not parts.hostname or "@" in parts.netloc:
        raise ValidationError(
            "invalid_link", "a link is an https:// URL or a path on this site", field
        )
    return value


def validate_draft(
    session: Session, draft: CampaignDraft, *, now: dt.datetime
) -> list[ValidationError]:
    """Every problem with a draft, in form order (empty when it can be created)."""
    problems: list[ValidationError] = []

    def check(condition: bool, code: str, message: str, field: str) -> None:
        if not condition:
            problems.append(ValidationError(code, message, field))

    topic = session.scalars(sa.select(Topic).where(Topic.slug == draft.topic)).first()
    check(
        topic is not None and topic.retired_at is None,
        "unknown_topic",
        "Choose an active topic",
        "topic",
    )
    check(bool(draft.title.strip()), "missing_field", "Enter a title", "title")
    check(len(draft.title) <= 200, "too_long", "The title must be 200 characters or fewer", "title")
    check(bool(draft.body.strip()), "missing_field", "Enter the message", "body")
    for field, value in (("url", draft.url), ("icon", draft.icon)):
        try:
            _link(value, field)
        except ValidationError as problem:
            problems.append(problem)
    check(draft.urgency in URGENCIES, "invalid_value", "Choose an urgency", "urgency")
    check(
        0 <= draft.ttl <= MAX_TTL, "invalid_value", f"Time to live is 0 to {MAX_TTL} seconds", "ttl"
    )
    check(
        draft.collapse_key is None or bool(_COLLAPSE_KEY.fullmatch(draft.collapse_key)),
        "invalid_value",
        "The collapse key is at most 32 letters, digits, '-' or '_'",
        "collapse_key",
    )
    send_at = draft.send_at or now
    check(send_at.tzinfo is not None, "invalid_value", "The send time needs a time zone", "send_at")
    if draft.deliver_until is not None:
        check(
            draft.deliver_until > send_at,
            "invalid_value",
            "“Don't deliver after” must be later than the send time",
            "deliver_until",
        )
    size = payload_size(draft)
    check(
        size <= MAX_PLAINTEXT,
        "payload_too_large",
        f"The message is {size} bytes; it must be at most {MAX_PLAINTEXT} bytes once encrypted "
        f"into 4096 — shorten it by {size - MAX_PLAINTEXT} bytes",
        "body",
    )
    return problems


def create_campaign(
    session: Session,
    draft: CampaignDraft,
    *,
    created_by: str,
    now: dt.datetime,
    is_test: bool = False,
) -> Campaign:
    """Create and launch: it is scheduled for ``send_at`` (now when not given)."""
    problems = validate_draft(session, draft, now=now)
    if problems:
        raise problems[0]
    topic = topic_by_slug(session, draft.topic)
    campaign = Campaign(
        topic_id=topic.id,
        title=draft.title.strip(),
        body=draft.body.strip(),
        url=_link(draft.url, "url"),
        icon=_link(draft.icon, "icon"),
        urgency=draft.urgency,
        ttl=draft.ttl,
        collapse_key=draft.collapse_key or None,
        send_at=draft.send_at or now,
        deliver_until=draft.deliver_until,
        status=CampaignStatus.SCHEDULED.value,
        created_by=created_by,
        created_at=now,
        launched_at=now,
        is_test=is_test,
    )
    session.add(campaign)
    session.flush()
    return campaign


_TRANSITIONS = {
    "pause": ({CampaignStatus.SCHEDULED, CampaignStatus.SENDING}, CampaignStatus.PAUSED),
    "resume": ({CampaignStatus.PAUSED}, CampaignStatus.SENDING),
    "cancel": (
        {CampaignStatus.SCHEDULED, CampaignStatus.SENDING, CampaignStatus.PAUSED},
        CampaignStatus.CANCELLED,
    ),
}


def control(session: Session, campaign_id: uuid.UUID, action: str, *, now: dt.datetime) -> Campaign:
    """Pause, resume or cancel. Cancelling leaves nothing queued."""
    campaign = session.get(Campaign, campaign_id, with_for_update=True)
    if campaign is None:
        raise ValidationError("unknown_campaign", "no such campaign", "campaign", status=404)
    allowed, target = _TRANSITIONS[action]
    if CampaignStatus(campaign.status) not in allowed:
        raise Conflict(
            "invalid_transition", f"a {campaign.status} campaign cannot {action}", "status"
        )
    campaign.status = target.value
    if target == CampaignStatus.CANCELLED:
        campaign.finished_at = now
        session.execute(
            sa.update(_d)
            .where(_d.c.campaign_id == campaign_id, _d.c.status == DeliveryStatus.QUEUED.value)
            .values(status=DeliveryStatus.SKIPPED.value, reason="cancelled", updated_at=now)
        )
    session.flush()
    return campaign


def _campaign_lock(session: Session, campaign_id: uuid.UUID) -> bool:
    """Only one process materialises a campaign at a time (SQLite: its write lock)."""
    if not is_postgres(session):
        return True
    key = zlib.crc32(campaign_id.bytes) & 0x7FFFFFFF
    return bool(
        session.execute(sa.select(sa.func.pg_try_advisory_xact_lock(0x6D6174, key))).scalar_one()
    )


def materialise_batch(
    session: Session, campaign: Campaign, *, now: dt.datetime, batch: int = 5000
) -> int:
    """Insert the next batch of deliveries from the recipient query; 0 when complete.

    Set-based (INSERT … SELECT), keyset-paginated by subscription id, one batch per
    transaction, resumable from ``materialised_through`` after a crash.
    """
    if campaign.materialised_at is not None or not _campaign_lock(session, campaign.id):
        return 0
    ids = recipient_query(campaign.topic_id).subquery()
    window = sa.select(ids.c.id)
    if campaign.materialised_through is not None:
        window = window.where(ids.c.id > campaign.materialised_through)
    window = window.order_by(ids.c.id).limit(batch)
    batch_ids = window.subquery()
    # The batch's last id (PostgreSQL has no max() over uuid).
    upper = session.execute(
        sa.select(batch_ids.c.id).order_by(batch_ids.c.id.desc()).limit(1)
    ).scalar_one_or_none()
    if upper is None:
        campaign.materialised_at = now
        session.flush()
        return 0
    lower = campaign.materialised_through
    chosen = sa.select(
        sa.literal(campaign.id, sa.Uuid).label("campaign_id"),
        ids.c.id.label("subscription_id"),
        ids.c.push_service,
        sa.literal(DeliveryStatus.QUEUED.value).label("status"),
        sa.literal(0).label("attempts"),
        sa.literal(campaign.send_at, _d.c.next_attempt_at.type).label("next_attempt_at"),
        ids.c.reason.label("consent_reason"),
        ids.c.event_seq.label("consent_event_seq"),
        sa.literal(now, _d.c.updated_at.type).label("updated_at"),
    ).where(ids.c.id <= upper)
    if lower is not None:
        chosen = chosen.where(ids.c.id > lower)
    dialect_insert = postgresql.insert if is_postgres(session) else sqlite.insert
    statement = dialect_insert(_d).from_select(list(_MATERIALISED), chosen).on_conflict_do_nothing()
    inserted = session.execute(statement).rowcount
    campaign.materialised_through = upper
    session.flush()
    return max(inserted, 0)


@dataclass(frozen=True)
class Progress:
    counts: dict[str, int]
    total: int
    materialised: bool

    @property
    def done(self) -> int:
        return sum(
            self.counts.get(s.value, 0)
            for s in (
                DeliveryStatus.ACCEPTED,
                DeliveryStatus.FAILED,
                DeliveryStatus.REVOKED,
                DeliveryStatus.SKIPPED,
            )
        )


def progress(session: Session, campaign: Campaign) -> Progress:
    rows = session.execute(
        sa.select(_d.c.status, sa.func.count())
        .where(_d.c.campaign_id == campaign.id)
        .group_by(_d.c.status)
    ).all()
    counts = {s.value: 0 for s in DeliveryStatus}
    counts.update({status: int(n) for status, n in rows})
    return Progress(counts, sum(counts.values()), campaign.materialised_at is not None)


def outcome_by_service(session: Session, campaign_id: uuid.UUID) -> list[tuple[str, str, int]]:
    """(push service, answer, count): the campaign's outcome chart."""
    answer = sa.case(
        (_d.c.last_status_code.is_not(None), sa.cast(_d.c.last_status_code, sa.String)),
        else_=_d.c.status,
    )
    rows = session.execute(
        sa.select(_d.c.push_service, answer.label("answer"), sa.func.count())
        .where(_d.c.campaign_id == campaign_id)
        .group_by(_d.c.push_service, answer)
        .order_by(_d.c.push_service, answer)
    ).all()
    return [(service, str(label), int(n)) for service, label, n in rows]
