"""A finished campaign's deliveries by status: counted once, when nothing can change them.

The campaign list shows each campaign's deliveries by status and its headline. Counted from
the rows, every view read every delivery of the fifty campaigns it lists: deliveries are
kept for the audit window (13 months), so with a large audience one view counted hundreds
of millions of rows, and more with every campaign sent.

A campaign is *settled* once it has finished (completed, cancelled or expired) and none of
its deliveries is queued or out to a push service. From then on no delivery of it changes
status: nothing queues a finished campaign's delivery again, the engine records an answer
only over a delivery still ``sending`` (``portal.delivery.engine._one``), and retention
folds rows into counters that add up to the same (``portal.campaigns.tally``). So its
counts are taken once, kept in ``campaign.settled_counts``, and read from there:

- a campaign the dispatcher completes is settled in the same transaction (nothing of it is
  queued or out then: that is what completes it);
- a cancelled or expired campaign by the dispatcher, once it has marked skipped what the
  campaign left queued (``Dispatcher.skip_unsent``, portal/campaigns/unsent.py), if its
  last batch is back by then;
- one whose last batch was still out then, and a campaign that finished before the column
  existed, by the ``table-retention`` job once its last delivery has come back
  (:func:`to_settle`).

Until then a campaign's counts are read from its rows, as before.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable
from typing import cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from portal.campaigns import tally, unsent
from portal.campaigns.models import Campaign
from portal.delivery.models import Delivery, DeliveryStatus

_d = cast(sa.Table, Delivery.__table__)
_c = cast(sa.Table, Campaign.__table__)

_OUT = (DeliveryStatus.QUEUED.value, DeliveryStatus.SENDING.value)


def _zero() -> dict[str, int]:
    return {status.value: 0 for status in DeliveryStatus}


def counted(
    session: Session, campaign_ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, dict[str, int]]:
    """Each campaign's deliveries by status, counted from its rows and the counters its
    folded rows left (``delivery_tally``); every status named, zero where none."""
    counts = {campaign_id: _zero() for campaign_id in campaign_ids}
    if not counts:
        return counts
    ids = list(counts)
    here = (
        sa.select(_d.c.campaign_id, _d.c.status, sa.func.count())
        .where(_d.c.campaign_id.in_(ids))
        .group_by(_d.c.campaign_id, _d.c.status)
    )
    t = tally.TALLY.c
    gone = sa.select(t.campaign_id, t.status, t.deliveries).where(t.campaign_id.in_(ids))
    for campaign_id, status, n in session.execute(sa.union_all(here, gone)):
        counts[campaign_id][status] += int(n)
    return counts


def counts(session: Session, campaigns: Iterable[Campaign]) -> dict[uuid.UUID, dict[str, int]]:
    """The campaigns' deliveries by status: a settled campaign's as kept, the others'
    counted now (an ended campaign's queued ones as the skips they are about to be:
    portal/campaigns/unsent.py)."""
    kept: dict[uuid.UUID, dict[str, int]] = {}
    unsettled: dict[uuid.UUID, str] = {}
    for campaign in campaigns:
        if campaign.settled_counts is None:
            unsettled[campaign.id] = campaign.status
        else:
            kept[campaign.id] = _zero() | {
                status: int(n) for status, n in campaign.settled_counts.items()
            }
    now = counted(session, list(unsettled))
    return kept | {
        campaign_id: unsent.shown_counts(unsettled[campaign_id], found)
        for campaign_id, found in now.items()
    }


def none_out(campaign_id: sa.ColumnElement[uuid.UUID]) -> sa.ColumnElement[bool]:
    """The campaign whose id the column gives has no delivery queued or out; read from
    ``ix_delivery_due``, which holds exactly those."""
    return ~(
        sa.select(_d.c.id).where(_d.c.campaign_id == campaign_id, _d.c.status.in_(_OUT)).exists()
    )


def _settleable() -> sa.ColumnElement[bool]:
    """The campaign is settled and its counts not kept yet: finished, nothing out."""
    return sa.and_(
        _c.c.status.in_(tally.FINISHED), _c.c.settled_counts.is_(None), none_out(_c.c.id)
    )


def settle(session: Session, campaign_ids: Collection[uuid.UUID]) -> list[uuid.UUID]:
    """Keep the counts of those of these campaigns that are settled and not kept yet, in
    the caller's transaction; the ones kept.

    Whether a campaign has a delivery out is read before its rows are counted: once it
    has none, nothing adds one, so the count taken after is its last."""
    settled: list[uuid.UUID] = []
    for campaign_id in sorted(campaign_ids):
        ready = session.execute(
            sa.select(_c.c.id).where(_c.c.id == campaign_id, _settleable())
        ).scalar_one_or_none()
        if ready is None:
            continue
        found = counted(session, [campaign_id])[campaign_id]
        # An ORM update, so that the session's copy of the campaign, if it holds one,
        # shows the kept counts too.
        session.execute(
            sa.update(Campaign)
            .where(Campaign.id == campaign_id, Campaign.settled_counts.is_(None))
            .values(settled_counts={status: n for status, n in found.items() if n})
        )
        settled.append(campaign_id)
    return settled


def to_settle(session: Session, limit: int) -> list[uuid.UUID]:
    """Up to ``limit`` finished campaigns whose counts are not kept yet and that have no
    delivery out, oldest first."""
    return list(
        session.execute(
            sa.select(_c.c.id).where(_settleable()).order_by(_c.c.finished_at, _c.c.id).limit(limit)
        ).scalars()
    )
