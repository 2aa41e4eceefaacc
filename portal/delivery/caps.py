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
  push service accepted inside the window, or that is out right now (claimed, not yet
  answered). The check and its outcome are one transaction that holds a lock per person
  (PostgreSQL; SQLite's write lock serialises every transaction): a delivery held back is
  marked skipped before the lock goes, so whichever of two deliveries reaching one person
  at once is checked second sees the first, sent or held, and never both go over the cap
  nor both wait for each other, whichever processes send them.
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
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from portal.campaigns.models import Campaign
from portal.config import FrequencyCapSettings
from portal.consent.models import Topic
from portal.db import among, is_postgres
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
    at: dt.datetime  # when accepted, or when claimed


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
    if is_postgres(session):
        _lock_people(session, {c.person for c in capped})
    since = now - (WEEK if caps.per_week else DAY)
    history = _recent_sends(session, capped, since=since, batch={c.delivery_id for c in candidates})
    held: set[int] = set()
    for item in sorted(capped, key=lambda c: c.delivery_id):
        sent = history[item.person]
        others = [s for s in sent if s.campaign_id != item.campaign_id]
        today = {s.campaign_id for s in others if s.at > now - DAY}
        this_week = {s.campaign_id for s in others if s.at > now - WEEK}
        day_caps = [n for n in (caps.per_day, 1 if item.subscriber_id in one_a_day else 0) if n]
        if (day_caps and len(today) >= min(day_caps)) or (
            caps.per_week and len(this_week) >= caps.per_week
        ):
            held.add(item.delivery_id)
        else:
            # Going out in this batch: it counts against the person's later deliveries.
            sent.append(_Sent(item.campaign_id, now))
    if held:
        # Before the locks go: a check of the same person after this one sees these as
        # held back, not as out.
        session.execute(
            sa.update(_d)
            .where(among(session, _d.c.id, held))
            .values(status=DeliveryStatus.SKIPPED.value, reason=FREQUENCY_CAP, updated_at=now)
        )
    return held


# pg_advisory_xact_lock(class, key)'s class for a person's frequency-cap check ("cap").
_CAP_LOCK = 0x636170


def _lock_people(session: Session, people: set[uuid.UUID]) -> None:
    """Hold each person's cap lock until this transaction ends, taken in one order (so
    two batches sharing people never wait for each other in a circle). The key is 32
    bits of the id: two people sharing one only wait for each other's check."""
    keys = sorted({int.from_bytes(person.bytes[-4:], "big", signed=True) for person in people})
    session.execute(
        sa.select(
            sa.func.count(sa.func.pg_advisory_xact_lock(_CAP_LOCK, sa.column("key")))
        ).select_from(
            sa.func.unnest(sa.bindparam("keys", keys, type_=postgresql.ARRAY(sa.Integer))).alias(
                "key"
            )
        )
    )


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
        sa.select(_d.c.subscription_id, _d.c.campaign_id, _d.c.updated_at)
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
    for subscription_id, campaign_id, at in rows:
        history[person_of[subscription_id]].append(_Sent(campaign_id, at))
    return history
