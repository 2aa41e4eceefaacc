"""Delivery retention: a finished campaign's deliveries folded into per-campaign counters.

A delivery row is the proof of consent for one send (its subscription, the consent reason
and the consent event that allowed it), so it is kept as long as the consent log's audit
window (``DELIVERY_RETENTION_MONTHS``, never shorter than ``AUDIT_WINDOW_MONTHS``). Once
its campaign finished that long ago, the ``table-retention`` job folds the campaign's
deliveries, a keyset batch at a time, into two tables of counters and deletes them with
their display receipts, in the same transaction:

- ``delivery_tally``: deliveries per (status, reason, last answer, push service, variant),
  with the most attempts, how many were retried, and how many accepted ones were shown
  and clicked — what the campaign page, its outcome chart, the campaign list and the A/B
  results count (:func:`groups`);
- ``funnel_tally``: the delivery funnel's rows (:func:`portal.campaigns.funnel.minute_rows`),
  so the funnel and its chart over time are drawn the same.

Every reader adds the counters to what the rows still here give, so a page shows the same
figures before, during and after the fold. A campaign folded to the end is compacted to
one counter row per group (:func:`compact`).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from portal.campaigns.funnel import minute_rows
from portal.campaigns.models import Campaign, CampaignStatus
from portal.db import affected_rows, is_postgres
from portal.delivery.models import (
    Delivery,
    DeliveryReceipt,
    DeliveryStatus,
    DeliveryTally,
    FunnelTally,
    ReceiptEvent,
)

_d = cast(sa.Table, Delivery.__table__)
_r = cast(sa.Table, DeliveryReceipt.__table__)
_c = cast(sa.Table, Campaign.__table__)
TALLY = cast(sa.Table, DeliveryTally.__table__)
FUNNEL = cast(sa.Table, FunnelTally.__table__)

FINISHED = (
    CampaignStatus.COMPLETED.value,
    CampaignStatus.CANCELLED.value,
    CampaignStatus.EXPIRED.value,
)
GROUP = ("status", "reason", "last_status_code", "push_service", "variant")
CLICKS = (ReceiptEvent.CLICKED, ReceiptEvent.ACTION_1, ReceiptEvent.ACTION_2)


def reported(*events: ReceiptEvent) -> sa.ColumnElement[bool]:
    """The delivery has a receipt for one of ``events``."""
    return (
        sa.select(_r.c.id)
        .where(
            _r.c.delivery_id == sa.cast(_d.c.id, sa.String),
            _r.c.event.in_([e.value for e in events]),
        )
        .exists()
    )


def _count(condition: sa.ColumnElement[bool]) -> sa.ColumnElement[Any]:
    return sa.func.coalesce(sa.func.sum(sa.case((condition, 1), else_=0)), 0)


def groups(deliveries: sa.ColumnElement[bool]) -> sa.Select[Any]:
    """The counters of the deliveries ``deliveries`` selects, one row per group, in the
    columns of ``delivery_tally``. Shown counts a click too (the funnel's rule: a click
    means the notification was on screen)."""
    accepted = _d.c.status == DeliveryStatus.ACCEPTED.value
    return (
        sa.select(
            *(_d.c[name] for name in GROUP),
            sa.func.count().label("deliveries"),
            sa.func.max(_d.c.attempts).label("most_attempts"),
            _count(_d.c.attempts > 1).label("retried"),
            _count(sa.and_(accepted, reported(ReceiptEvent.SHOWN, *CLICKS))).label("shown"),
            _count(sa.and_(accepted, reported(*CLICKS))).label("clicked"),
        )
        .where(deliveries)
        .group_by(*(_d.c[name] for name in GROUP))
    )


def folded(campaign_ids: Sequence[uuid.UUID] | uuid.UUID) -> sa.Select[Any]:
    """The counter rows of these campaigns (one campaign, or several), in the columns
    of :func:`groups` plus ``campaign_id``."""
    ids = [campaign_ids] if isinstance(campaign_ids, uuid.UUID) else list(campaign_ids)
    return sa.select(
        TALLY.c.campaign_id,
        *(TALLY.c[name] for name in GROUP),
        TALLY.c.deliveries,
        TALLY.c.most_attempts,
        TALLY.c.retried,
        TALLY.c.shown,
        TALLY.c.clicked,
    ).where(TALLY.c.campaign_id.in_(ids))


def campaigns_to_fold(
    session: Session,
    cutoff: dt.datetime,
    spared: Sequence[tuple[uuid.UUID, uuid.UUID]] = (),
) -> list[uuid.UUID]:
    """Campaigns that finished before ``cutoff`` and still have deliveries, oldest first;
    none whose id is in one of the ``spared`` ranges [low, high) (a partition that will
    be dropped whole: portal/delivery/partitions.py)."""
    left = sa.exists().where(_d.c.campaign_id == _c.c.id)
    query = sa.select(_c.c.id).where(_c.c.status.in_(FINISHED), _c.c.finished_at < cutoff, left)
    for low, high in spared:
        query = query.where(sa.not_(sa.and_(_c.c.id >= low, _c.c.id < high)))
    return list(session.execute(query.order_by(_c.c.finished_at, _c.c.id)).scalars())


def fold(session: Session, campaign_id: uuid.UUID, ids: Sequence[int]) -> int:
    """Fold these deliveries of the campaign into its counters and delete them and their
    receipts; how many deliveries were deleted. One transaction (the caller's), so a
    delivery is counted exactly when it is gone."""
    chosen = sa.and_(_d.c.campaign_id == campaign_id, _d.c.id.in_(list(ids)))
    _count_into_tallies(session, campaign_id, chosen)
    session.execute(sa.delete(_r).where(_r.c.delivery_id.in_([str(i) for i in ids])))
    return affected_rows(session, sa.delete(_d).where(chosen))


def fold_campaign(session: Session, campaign_id: uuid.UUID) -> int:
    """Fold all of the campaign's deliveries into its counters and delete their receipts,
    set-wise; how many deliveries it has. The rows stay: their partition is dropped in the
    same transaction (portal/delivery/partitions.py), so they are counted exactly when
    they are gone."""
    chosen = _d.c.campaign_id == campaign_id
    _count_into_tallies(session, campaign_id, chosen)
    session.execute(
        sa.delete(_r).where(
            _r.c.delivery_id.in_(sa.select(sa.cast(_d.c.id, sa.String)).where(chosen))
        )
    )
    return int(
        session.execute(sa.select(sa.func.count()).select_from(_d).where(chosen)).scalar_one()
    )


def _count_into_tallies(
    session: Session, campaign_id: uuid.UUID, chosen: sa.ColumnElement[bool]
) -> None:
    tally = [
        {"campaign_id": campaign_id, **row._mapping}
        for row in session.execute(groups(chosen)).all()
    ]
    if tally:
        session.execute(sa.insert(TALLY), tally)
    funnel = [
        {"campaign_id": campaign_id, "kind": kind, "at": at, "n": int(n)}
        for kind, at, n in session.execute(minute_rows(session, chosen)).all()
        # A count of none, and a first or last that never happened, add nothing.
        if int(n) > 0 or (kind in ("first", "last") and at is not None)
    ]
    if funnel:
        session.execute(sa.insert(FUNNEL), funnel)


def compact(session: Session, campaign_id: uuid.UUID) -> bool:
    """Once none of the campaign's deliveries is left, its counters become one row per
    group (and per funnel kind and minute). Holds the campaign's row, so two processes
    compact one after the other; the rows it read are the ones it replaces, so a fold
    committed meanwhile is neither lost nor counted twice. False if deliveries are left."""
    query = sa.select(_c.c.id).where(_c.c.id == campaign_id)
    if is_postgres(session):
        query = query.with_for_update()
    session.execute(query)
    if session.execute(sa.select(sa.exists().where(_d.c.campaign_id == campaign_id))).scalar():
        return False
    rows = session.execute(folded(campaign_id)).all()
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        values = row._mapping
        key = tuple(values[name] for name in GROUP)
        into = merged.get(key)
        if into is None:
            merged[key] = {name: values[name] for name in ("campaign_id", *GROUP)} | {
                "deliveries": 0,
                "most_attempts": 0,
                "retried": 0,
                "shown": 0,
                "clicked": 0,
            }
            into = merged[key]
        for name in ("deliveries", "retried", "shown", "clicked"):
            into[name] += int(values[name])
        into["most_attempts"] = max(into["most_attempts"], int(values["most_attempts"]))
    if len(merged) < len(rows):
        session.execute(sa.delete(TALLY).where(TALLY.c.campaign_id == campaign_id))
        session.execute(sa.insert(TALLY), list(merged.values()))
    lines = session.execute(
        sa.select(FUNNEL.c.kind, FUNNEL.c.at, FUNNEL.c.n).where(FUNNEL.c.campaign_id == campaign_id)
    ).all()
    counts: dict[tuple[str, int | None], int] = {}
    for kind, at, n in lines:
        if kind == "first":
            key = (kind, None)
            counts[key] = at if key not in counts else min(counts[key], at)
        elif kind == "last":
            key = (kind, None)
            counts[key] = at if key not in counts else max(counts[key], at)
        else:
            counts[(kind, at)] = counts.get((kind, at), 0) + int(n)
    if len(counts) < len(lines):
        session.execute(sa.delete(FUNNEL).where(FUNNEL.c.campaign_id == campaign_id))
        session.execute(
            sa.insert(FUNNEL),
            [
                {"campaign_id": campaign_id, "kind": kind, "at": value, "n": 0}
                if kind in ("first", "last")
                else {"campaign_id": campaign_id, "kind": kind, "at": at, "n": value}
                for (kind, at), value in counts.items()
            ],
        )
    return True
