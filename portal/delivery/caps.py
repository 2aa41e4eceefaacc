"""Frequency caps: at most so many marketing notifications per person a day and a week.

The rule, in one place (the engine asks it for every batch it is about to send):

- A person is a subscriber, every device together; a subscription with no subscriber is
  a person of its own. One campaign is one notification, however many of the person's
  devices it reaches.
- Capped and counted: deliveries of marketing campaigns. Transactional topics and test
  sends are never held back and never counted.
- The caps: ``MARKETING_CAP_PER_DAY`` in any 24 hours and ``MARKETING_CAP_PER_WEEK`` in
  any 7 days (zero: no cap), and one a day for a person who chose "at most one a day"
  in the preference centre, whatever the portal-wide caps say.
- Counted against a delivery: the person's other marketing campaigns whose delivery a
  push service accepted inside the window, and those being sent right now with a smaller
  delivery id. Of two sent at the same moment, the earlier goes and the later waits its
  turn, so two sender processes never both hold one back for the other.
- A delivery over a cap is skipped with reason ``frequency_cap`` (counted on the
  campaign's page); it does not wait for the window to pass.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from portal.campaigns.models import Campaign
from portal.config import FrequencyCapSettings
from portal.consent.models import Topic
from portal.db import among
from portal.delivery.models import Delivery, DeliveryStatus
from portal.subscriptions.models import PushSubscription, Subscriber

FREQUENCY_CAP = "frequency_cap"

DAY = dt.timedelta(days=1)
WEEK = dt.timedelta(days=7)

_d = cast(sa.Table, Delivery.__table__)
_s = cast(sa.Table, PushSubscription.__table__)
_c = cast(sa.Table, Campaign.__table__)
_t = cast(sa.Table, Topic.__table__)
_p = cast(sa.Table, Subscriber.__table__)

# What counts as sent: accepted, or out right now (claimed, not yet answered).
_SENT = (DeliveryStatus.ACCEPTED.value, DeliveryStatus.SENDING.value)


@dataclass(frozen=True)
class Candidate:
    """A delivery about to be sent: which campaign, to whom."""

    delivery_id: int
    campaign_id: uuid.UUID
    subscription_id: uuid.UUID
    subscriber_id: uuid.UUID | None

    @property
    def person(self) -> uuid.UUID:
        return self.subscriber_id or self.subscription_id


@dataclass(frozen=True)
class _Sent:
    campaign_id: uuid.UUID
    delivery_id: int
    accepted: bool
    at: dt.datetime


def marketing_campaigns(session: Session, campaigns: Iterable[Campaign]) -> set[uuid.UUID]:
    """Which of these campaigns the caps apply to: not a test, not a transactional topic."""
    campaigns = [c for c in campaigns if not c.is_test]
    if not campaigns:
        return set()
    transactional = set(
        session.scalars(
            sa.select(_t.c.id).where(
                _t.c.id.in_({c.topic_id for c in campaigns}), _t.c.is_transactional
            )
        )
    )
    return {c.id for c in campaigns if c.topic_id not in transactional}


def over_cap(
    session: Session,
    candidates: list[Candidate],
    marketing: set[uuid.UUID],
    *,
    now: dt.datetime,
    caps: FrequencyCapSettings,
) -> set[int]:
    """The delivery ids among ``candidates`` that a cap holds back (see the module)."""
    capped = [c for c in candidates if c.campaign_id in marketing]
    if not capped:
        return set()
    subscribers = {c.subscriber_id for c in capped if c.subscriber_id is not None}
    one_a_day: set[uuid.UUID] = (
        set(
            session.scalars(
                sa.select(_p.c.id).where(among(session, _p.c.id, subscribers), _p.c.one_a_day)
            )
        )
        if subscribers
        else set()
    )
    if not caps.per_day and not caps.per_week:
        # Only the people who chose one a day are capped.
        capped = [c for c in capped if c.subscriber_id in one_a_day]
        if not capped:
            return set()
    since = now - (WEEK if caps.per_week else DAY)
    history = _recent_sends(session, capped, since=since, batch={c.delivery_id for c in candidates})
    held: set[int] = set()
    for item in sorted(capped, key=lambda c: c.delivery_id):
        sent = history[item.person]
        earlier = [
            s
            for s in sent
            if s.campaign_id != item.campaign_id
            and (s.accepted or s.delivery_id < item.delivery_id)
        ]
        today = {s.campaign_id for s in earlier if s.at > now - DAY}
        this_week = {s.campaign_id for s in earlier if s.at > now - WEEK}
        day_caps = [n for n in (caps.per_day, 1 if item.subscriber_id in one_a_day else 0) if n]
        if (day_caps and len(today) >= min(day_caps)) or (
            caps.per_week and len(this_week) >= caps.per_week
        ):
            held.add(item.delivery_id)
        else:
            # Going out in this batch: it counts against the person's later deliveries.
            sent.append(_Sent(item.campaign_id, item.delivery_id, False, now))
    return held


def _recent_sends(
    session: Session, candidates: list[Candidate], *, since: dt.datetime, batch: set[int]
) -> defaultdict[uuid.UUID, list[_Sent]]:
    """Each person's marketing deliveries accepted or out since ``since`` (by their
    updated_at: when accepted, or when claimed), other than this batch's own."""
    people = {c.subscriber_id for c in candidates if c.subscriber_id is not None}
    person_of: dict[uuid.UUID, uuid.UUID] = {
        c.subscription_id: c.person for c in candidates if c.subscriber_id is None
    }
    if people:
        for subscription_id, subscriber_id in session.execute(
            sa.select(_s.c.id, _s.c.subscriber_id).where(among(session, _s.c.subscriber_id, people))
        ):
            person_of[subscription_id] = subscriber_id
    history: defaultdict[uuid.UUID, list[_Sent]] = defaultdict(list)
    rows = session.execute(
        sa.select(_d.c.subscription_id, _d.c.campaign_id, _d.c.id, _d.c.status, _d.c.updated_at)
        .join(_c, _c.c.id == _d.c.campaign_id)
        .join(_t, _t.c.id == _c.c.topic_id)
        .where(
            among(session, _d.c.subscription_id, person_of),
            _d.c.updated_at > since,
            _d.c.status.in_(_SENT),
            sa.not_(among(session, _d.c.id, batch)),
            sa.not_(_c.c.is_test),
            sa.not_(_t.c.is_transactional),
        )
    )
    for subscription_id, campaign_id, delivery_id, status, at in rows:
        history[person_of[subscription_id]].append(
            _Sent(campaign_id, delivery_id, status == DeliveryStatus.ACCEPTED.value, at)
        )
    return history
