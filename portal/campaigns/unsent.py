"""What a cancelled or expired campaign left queued: never sent, so skipped.

Cancelling a campaign (:func:`portal.campaigns.services.control`) and its expiry at its
"don't deliver after" time (the dispatcher) end it at once, by its row alone. Its
deliveries still queued are marked skipped afterwards, a chunk per transaction, by the
dispatcher's tick (:func:`skip_chunk`). Marked inside the cancel's own transaction, one
statement over every queued delivery, a campaign of millions kept the staff member's
request for minutes (``bench/cancel.py``), holding the campaign's row all that time: every
process recording a batch of the campaign waited for it.

Until the dispatcher has marked them, every reader counts a delivery still queued in such
a campaign as the skip it is about to become (:func:`as_shown`, :func:`shown_counts`,
:func:`shown_status`): nothing queues it again or sends it (the claim takes only sending
campaigns' deliveries), so the pages say the same before the mark and after it.

A delivery out to a push service when the campaign ended keeps the answer its sender
writes; if that sender stopped first (its lease ran out), nothing would ever write one,
and the campaign would say "still with a push service" for good and never have its counts
kept: the dispatcher ends it as failed, no answer recorded (:func:`end_lost`).
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from portal.campaigns.models import Campaign, CampaignStatus
from portal.db import affected_rows, is_postgres
from portal.delivery import partitions
from portal.delivery.models import DUE_SQL, Delivery, DeliveryStatus

_d = cast(sa.Table, Delivery.__table__)
_c = cast(sa.Table, Campaign.__table__)

# The skip reason of a delivery whose campaign ended before it was sent.
ENDED_REASONS = {
    CampaignStatus.CANCELLED.value: "cancelled",
    CampaignStatus.EXPIRED.value: "deliver_until_passed",
}
# A delivery out to a push service when its campaign ended whose sending process stopped
# (its lease ran out) before writing the answer: nothing will write it now, and nothing
# sends it again (the claim takes only sending campaigns' deliveries).
NO_ANSWER = "no_answer_recorded"
_QUEUED = DeliveryStatus.QUEUED.value
_SENDING = DeliveryStatus.SENDING.value
_SKIPPED = DeliveryStatus.SKIPPED.value
# SQLite uses ix_delivery_due (its predicate) only when a query repeats it word for word.
_DUE = sa.text(f"{_d.name}.{DUE_SQL}")

Key = tuple[dt.datetime, int]  # (next_attempt_at, id): a place in ix_delivery_due


def as_shown(campaign_status: str, status: str, reason: str | None) -> tuple[str, str | None]:
    """A delivery's status and reason as its campaign's pages count it: still queued in a
    campaign that ended, it is the skip the dispatcher is about to write."""
    ended = ENDED_REASONS.get(campaign_status)
    if ended is not None and status == _QUEUED:
        return _SKIPPED, ended
    return status, reason


def shown_counts(campaign_status: str, counts: dict[str, int]) -> dict[str, int]:
    """Counts by status (:func:`as_shown`): an ended campaign's queued ones are skipped."""
    if campaign_status not in ENDED_REASONS or not counts.get(_QUEUED):
        return counts
    shown = dict(counts)
    shown[_SKIPPED] = shown.get(_SKIPPED, 0) + shown.pop(_QUEUED)
    shown[_QUEUED] = 0
    return shown


def shown_columns(campaign_status: str) -> tuple[sa.ColumnElement[str], sa.ColumnElement[Any]]:
    """:func:`as_shown`'s status and reason, in SQL, for a query over one campaign's
    deliveries."""
    ended = ENDED_REASONS.get(campaign_status)
    if ended is None:
        return _d.c.status, _d.c.reason
    queued = _d.c.status == _QUEUED
    return (
        sa.case((queued, _SKIPPED), else_=_d.c.status),
        sa.case((queued, ended), else_=_d.c.reason),
    )


def shown_status(
    campaign_status: sa.SQLColumnExpression[str], status: sa.SQLColumnExpression[str]
) -> sa.ColumnElement[str]:
    """:func:`as_shown`'s status, in SQL, for a query that joins the campaign."""
    return sa.case(
        (sa.and_(status == _QUEUED, campaign_status.in_(list(ENDED_REASONS))), _SKIPPED),
        else_=status,
    )


def _lease_ran_out(now: dt.datetime) -> sa.ColumnElement[bool]:
    return sa.and_(_d.c.status == _SENDING, _d.c.lease_expires_at < now)


def left_behind(
    campaign_id: sa.ColumnElement[uuid.UUID], now: dt.datetime
) -> sa.ColumnElement[bool]:
    """The campaign whose id the column gives has a delivery queued, or one out whose
    sending process stopped (its lease ran out); read from ix_delivery_due."""
    return (
        sa.select(_d.c.id)
        .where(
            _d.c.campaign_id == campaign_id,
            _DUE,
            sa.or_(_d.c.status == _QUEUED, _lease_ran_out(now)),
        )
        .exists()
    )


def waiting(now: dt.datetime) -> sa.ColumnElement[bool]:
    """The campaign (a row of ``campaign``) ended with deliveries still to mark: queued
    ones, or ones whose sending process stopped. Its counts are not kept until they are
    (``settled_counts`` NULL): that bounds the campaigns looked at to the few ended
    lately."""
    return sa.and_(
        _c.c.status.in_(list(ENDED_REASONS)),
        _c.c.settled_counts.is_(None),
        left_behind(_c.c.id, now),
    )


def to_skip(session: Session, now: dt.datetime) -> list[tuple[uuid.UUID, str]]:
    """The ended campaigns with deliveries still to mark (id, skip reason), oldest first."""
    rows = session.execute(
        sa.select(_c.c.id, _c.c.status).where(waiting(now)).order_by(_c.c.finished_at, _c.c.id)
    ).all()
    return [(campaign_id, ENDED_REASONS[status]) for campaign_id, status in rows]


def end_lost(session: Session, campaign_id: uuid.UUID, *, now: dt.datetime) -> int:
    """The campaign's deliveries out when it ended whose sending process stopped before
    writing the answer (the lease it renews while a batch is out ran out): failed, with
    no answer recorded; the page says they may have arrived. How many."""
    return affected_rows(
        session,
        sa.update(_d)
        .where(_d.c.campaign_id == campaign_id, _DUE, _lease_ran_out(now))
        .values(
            status=DeliveryStatus.FAILED.value,
            reason=NO_ANSWER,
            lease_expires_at=None,
            updated_at=now,
        ),
    )


def skip_chunk(
    session: Session,
    campaign_id: uuid.UUID,
    reason: str,
    *,
    now: dt.datetime,
    after: Key | None,
    limit: int,
) -> tuple[int, Key | None]:
    """Mark up to ``limit`` of the campaign's queued deliveries skipped, in due order from
    after ``after`` (None: from its first); how many, and the place of the last marked
    (None when none was left there).

    Each chunk starts where the one before it ended (a keyset on ix_delivery_due): the
    rows marked leave the index only once vacuumed, and a walk from the start would step
    over all of them again, so the last chunk of a large campaign would cost many times
    the first. Rows another transaction holds are passed by (PostgreSQL: SKIP LOCKED)."""
    where: list[sa.ColumnElement[bool] | sa.TextClause] = [
        _d.c.campaign_id == campaign_id,
        _d.c.status == _QUEUED,
    ]
    if not is_postgres(session):
        # As in the claim: PostgreSQL proves ix_delivery_due's predicate from the status,
        # and repeated there it would be counted twice in the row estimates.
        where.append(_DUE)
    if after is not None:
        where.append(sa.tuple_(_d.c.next_attempt_at, _d.c.id) > after)
    chosen_rows = (
        sa.select(_d.c.id).where(*where).order_by(_d.c.next_attempt_at, _d.c.id).limit(limit)
    )
    chosen = partitions.picked(session, chosen_rows, campaign_id)
    marked = session.execute(
        sa.update(_d)
        .where(chosen)
        .values(status=_SKIPPED, reason=reason, updated_at=now)
        .returning(_d.c.next_attempt_at, _d.c.id)
    ).all()
    if not marked:
        return 0, None
    return len(marked), cast(Key, max((at, delivery_id) for at, delivery_id in marked))
