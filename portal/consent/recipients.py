"""Who may receive a message on one topic: consent enforced in the query (seed 002).

The LEFT JOIN keeps the tri-state model honest: an explicit opt_out excludes, an
explicit opt_in includes, and only an absent or unset decision consults the topic's
default, its class and the subscriber's region — the same rule as
:func:`portal.consent.preferences.effective_state`, which a test holds them to.
Rows stream (a server-side cursor on PostgreSQL); the audience is never loaded whole.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from portal.consent.models import Topic, TopicPreference
from portal.consent.preferences import RESTRICTED_REGIONS, Reason
from portal.subscriptions.models import LIVE_STATES, PushSubscription, Subscriber

_s = cast(sa.Table, PushSubscription.__table__)
_sub = cast(sa.Table, Subscriber.__table__)
_p = cast(sa.Table, TopicPreference.__table__)
_topic = cast(sa.Table, Topic.__table__)


@dataclass(frozen=True, slots=True)
class Recipient:
    subscription_id: uuid.UUID
    subscriber_id: uuid.UUID
    push_service: str
    reason: Reason
    # The consent event that allows the send: the opt-in, or for a transactional topic the
    # subscription's permission grant. None when a regional default allows it (the rule
    # is the justification, named by ``reason``).
    event_seq: int | None


def recipient_query(topic_id: int) -> sa.Select[tuple]:
    unset = sa.func.coalesce(_p.c.state, "unset") == "unset"
    default_allows = sa.and_(
        unset,
        _topic.c.default_state == "opt_in",
        sa.or_(
            _topic.c.is_transactional,
            # NULL region: NOT IN yields NULL, so unknown regions get no marketing default.
            _sub.c.region_code.not_in(sorted(RESTRICTED_REGIONS)),
        ),
    )
    reason = sa.case(
        (_p.c.state == "opt_in", sa.literal(Reason.EXPLICIT_OPT_IN.value)),
        (_topic.c.is_transactional, sa.literal(Reason.TRANSACTIONAL_GRANT.value)),
        else_=sa.literal(Reason.DEFAULT_BY_REGION.value),
    )
    event = sa.case(
        (_p.c.state == "opt_in", _p.c.event_seq),
        (_topic.c.is_transactional, _s.c.grant_event_seq),
        else_=sa.null(),
    )
    return (
        sa.select(
            _s.c.id,
            _s.c.subscriber_id,
            _s.c.push_service,
            reason.label("reason"),
            event.label("event_seq"),
            # The person's zone and quiet hours, for local-time delivery
            # (portal/campaigns/local_time.py) and quiet hours (portal/delivery/quiet.py).
            _sub.c.time_zone,
            _sub.c.quiet_from,
            _sub.c.quiet_until,
        )
        .select_from(_s)
        .join(_sub, sa.and_(_sub.c.id == _s.c.subscriber_id, _sub.c.erased_at.is_(None)))
        .join(_topic, sa.and_(_topic.c.id == topic_id, _topic.c.retired_at.is_(None)))
        .outerjoin(
            _p, sa.and_(_p.c.subscriber_id == _s.c.subscriber_id, _p.c.topic_id == _topic.c.id)
        )
        .where(
            _s.c.state.in_([s.value for s in LIVE_STATES]),
            _s.c.deleted_at.is_(None),
            sa.or_(_p.c.state == "opt_in", default_allows),
        )
    )


# A dict lookup, not Reason(value): the enum call is ten times slower, and over a
# million-row audience it was about 15% of the client's CPU time (docs/BENCHMARKS.md).
_REASONS = {reason.value: reason for reason in Reason}


def recipients(session: Session, topic_id: int, *, batch: int = 2000) -> Iterator[Recipient]:
    """Stream one topic's recipients with the justification of each."""
    result = session.execute(
        recipient_query(topic_id), execution_options={"yield_per": batch, "stream_results": True}
    )
    for row in result:
        yield Recipient(row[0], row[1], row[2], _REASONS[row[3]], row[4])


# (reason, the person's time zone or None when not known) → subscriptions
AudienceCounts = dict[tuple[str, str | None], int]


def audience_counts(session: Session, topic_id: int) -> AudienceCounts:
    """Counts by reason and time zone, in one reading of the recipients: what the review
    page shows before launch (:func:`by_reason`, and :func:`by_zone` for a local-time
    campaign's deliveries per hour)."""
    query = recipient_query(topic_id).subquery()
    rows = session.execute(
        sa.select(query.c.reason, query.c.time_zone, sa.func.count()).group_by(
            query.c.reason, query.c.time_zone
        )
    ).all()
    return {(str(reason), zone): int(count) for reason, zone, count in rows}


def by_reason(counts: AudienceCounts) -> dict[str, int]:
    found: dict[str, int] = {}
    for (reason, _), n in counts.items():
        found[reason] = found.get(reason, 0) + n
    return found


def by_zone(counts: AudienceCounts) -> dict[str | None, int]:
    found: dict[str | None, int] = {}
    for (_, zone), n in counts.items():
        found[zone] = found.get(zone, 0) + n
    return found


def audience_breakdown(session: Session, topic_id: int) -> dict[str, int]:
    """Counts by reason (``portal campaign create``)."""
    return by_reason(audience_counts(session, topic_id))
