"""A campaign's delivery funnel: accepted → shown → clicked, as counts and over time.

:func:`read` is the one place that counts it, in two aggregate queries over the
campaign's deliveries and their receipts (nothing is loaded row by row), on SQLite and
PostgreSQL alike. The rules (docs/campaigns.md, "Delivery funnel"):

- **Accepted**: deliveries whose push service answered 2xx (status ``accepted``), counted
  from the time that answer was recorded (``delivery.updated_at``, never changed after).
- **Shown**: accepted deliveries the browser reported showing, or reported clicked — a
  click means the notification was on screen, and a worker offline when it showed it
  sends no ``shown`` receipt. Counted from the earlier of the two receipts.
- **Clicked**: accepted deliveries the browser reported clicked: on the notification
  itself (``clicked``) or on one of its buttons (``action-1``, ``action-2``), each counted
  also by where it was clicked.

Each counts deliveries, not reports: a receipt is one row per (delivery, event)
(``uq_delivery_receipt_delivery_event``), so a repeated report is counted once. Receipts
for deliveries not recorded as accepted (an answer lost, or not yet written) are counted
apart, in :attr:`Funnel.unaccepted`, so every stage stays within the one before it. A
delivery counts as accepted no later than its first receipt: the push service had it
before the browser did.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from portal.campaigns.models import Campaign
from portal.db import is_postgres, without_jit
from portal.delivery.models import (
    Delivery,
    DeliveryReceipt,
    DeliveryStatus,
    FunnelTally,
    ReceiptEvent,
)

_d = cast(sa.Table, Delivery.__table__)
_r = cast(sa.Table, DeliveryReceipt.__table__)
_f = cast(sa.Table, FunnelTally.__table__)

# The stages counted per minute, and every count :func:`minute_rows` gives (its
# ``minute`` and ``when``, in this order).
STAGES = ("accepted", "shown", "clicked")
KINDS = (*STAGES, "unreported", "unaccepted", "body", "button-1", "button-2")

MINUTE, HOUR, DAY = 60, 3600, 86400
# Period lengths, shortest first: the chart takes the shortest giving at most MAX_BUCKETS
# periods, so a campaign over in minutes is drawn by the minute, one that runs for days by
# the day (longer still: whole weeks).
BUCKET_WIDTHS = (
    MINUTE,
    2 * MINUTE,
    5 * MINUTE,
    10 * MINUTE,
    15 * MINUTE,
    30 * MINUTE,
    HOUR,
    2 * HOUR,
    3 * HOUR,
    6 * HOUR,
    12 * HOUR,
    DAY,
    2 * DAY,
    7 * DAY,
)
MAX_BUCKETS = 24
# Periods are whole multiples of their length from a Monday 00:00 UTC: hours start on the
# hour, days at midnight UTC, weeks on Mondays.
_ORIGIN = dt.datetime(1970, 1, 5, tzinfo=dt.UTC)
_ORIGIN_SECONDS = int(_ORIGIN.timestamp())


@dataclass(frozen=True)
class Rate:
    """A share with its figures: never made from a zero denominator (see :func:`rate`)."""

    numerator: int
    denominator: int

    @property
    def percent(self) -> float:
        return 100 * self.numerator / self.denominator

    def __str__(self) -> str:
        return f"{self.percent:.1f}%"


def rate(numerator: int, denominator: int) -> Rate | None:
    """``numerator`` ÷ ``denominator``, or None when there is nothing to divide by."""
    return Rate(numerator, denominator) if denominator > 0 else None


@dataclass(frozen=True)
class Bucket:
    """One period of the chart: what happened in it, and the running totals at its end."""

    start: dt.datetime
    end: dt.datetime
    accepted: int
    shown: int
    clicked: int
    accepted_by: int
    shown_by: int
    clicked_by: int


@dataclass(frozen=True)
class Funnel:
    accepted: int
    shown: int
    clicked: int
    # Of ``shown``: deliveries reported clicked with no ``shown`` receipt.
    clicked_unreported: int
    # Deliveries with a receipt but not (yet) recorded as accepted: in no stage above.
    unaccepted: int
    now: dt.datetime
    width: int | None  # seconds per period; None without any accepted delivery
    buckets: list[Bucket]
    # Of ``clicked``, by where: the notification itself, its first and its second button.
    # A delivery clicked in two places (two receipts) is in both, and once in ``clicked``.
    clicked_body: int = 0
    clicked_buttons: tuple[int, int] = (0, 0)

    @property
    def receipts(self) -> bool:
        """Whether any browser reported anything for this campaign."""
        return bool(self.shown or self.unaccepted)

    @property
    def shown_of_accepted(self) -> Rate | None:
        return rate(self.shown, self.accepted)

    @property
    def clicked_of_shown(self) -> Rate | None:
        """The click-through rate of notifications people saw."""
        return rate(self.clicked, self.shown)

    @property
    def clicked_of_accepted(self) -> Rate | None:
        """The click-through rate of everything the push services took."""
        return rate(self.clicked, self.accepted)

    def of_accepted(self, count: int) -> Rate | None:
        return rate(count, self.accepted)

    @property
    def clicked_again(self) -> int:
        """Clicks beyond the first on the same deliveries (on the notification and on a
        button): in the rows by where, not again in ``clicked``."""
        return self.clicked_body + sum(self.clicked_buttons) - self.clicked


def _seconds(session: Session, column: sa.ColumnElement[Any]) -> sa.ColumnElement[int]:
    """A timestamp as whole seconds since 1970 (UTC), on either database."""
    if is_postgres(session):
        return sa.cast(sa.func.floor(sa.extract("epoch", column)), sa.BigInteger)
    return sa.cast(sa.func.strftime("%s", column), sa.BigInteger)


# Later than any time in seconds: a stand-in for "none" where SQLite's min() would give NULL.
_NEVER = 2**62


def _earliest(session: Session, *times: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """The earliest of some times, any of which may be NULL (all NULL: NULL). PostgreSQL's
    least() skips NULLs; SQLite's many-argument min() does not, so there NULL stands for
    never."""
    if is_postgres(session):
        return sa.func.least(*times)
    return sa.func.nullif(sa.func.min(*(sa.func.coalesce(t, _NEVER) for t in times)), _NEVER)


def choose_width(first: int, last: int) -> tuple[int, int]:
    """(period length, start of the first period), in seconds since 1970, for events from
    ``first`` to ``last``: the shortest of BUCKET_WIDTHS giving at most MAX_BUCKETS
    periods, or whole weeks beyond them."""

    def start(width: int) -> int:
        return _ORIGIN_SECONDS + (first - _ORIGIN_SECONDS) // width * width

    for width in BUCKET_WIDTHS:
        if (last - start(width)) // width + 1 <= MAX_BUCKETS:
            return width, start(width)
    week = 7 * DAY
    width = week * -(-(last - first + week) // (week * MAX_BUCKETS))
    while (last - start(width)) // width + 1 > MAX_BUCKETS:
        width += week
    return width, start(width)


def _at(seconds: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


def minute_rows(session: Session, deliveries: sa.ColumnElement[bool]) -> sa.CompoundSelect:
    """The funnel of the deliveries ``deliveries`` selects, as rows (kind, at, n): each
    stage's count per minute (``at`` in minutes since 1970), the counts that have no time
    (``at`` NULL), and the first acceptance and latest event (``first``, ``last``: ``at``
    in seconds, ``n`` 0). Rows of disjoint sets of deliveries add up (``first`` by the
    least, ``last`` by the greatest): :func:`read` adds those of the folded deliveries
    (``funnel_tally``) to those of the rows still here."""
    key = sa.cast(_d.c.id, sa.String)
    # Each delivery's answer and receipts, as seconds (NULL: none), in one row: one outer
    # join per receipt event, on the (delivery, event) unique index.
    events = {
        "shown": ReceiptEvent.SHOWN,
        "body": ReceiptEvent.CLICKED,
        "button_1": ReceiptEvent.ACTION_1,
        "button_2": ReceiptEvent.ACTION_2,
    }
    receipts = {name: _r.alias(f"{name}_receipt") for name in events}
    joined: sa.FromClause = _d
    for name, event in events.items():
        r = receipts[name]
        joined = joined.outerjoin(r, sa.and_(r.c.delivery_id == key, r.c.event == event.value))
    times = (
        sa.select(
            (_d.c.status == DeliveryStatus.ACCEPTED.value).label("accepted"),
            _seconds(session, _d.c.updated_at).label("answered"),
            *(_seconds(session, r.c.at).label(name) for name, r in receipts.items()),
        )
        .select_from(joined)
        .where(deliveries)
        .subquery("receipt_times")
    )
    t = times.c
    clicks = (t.body, t.button_1, t.button_2)  # on the notification, or on one of its buttons
    per_delivery = sa.select(
        t.accepted,
        # A delivery was accepted no later than anything its browser reported, shown no
        # later than it was clicked, and clicked at its first click anywhere.
        _earliest(session, t.answered, t.shown, *clicks).label("accepted_at"),
        _earliest(session, t.shown, *clicks).label("shown_at"),
        _earliest(session, *clicks).label("clicked_at"),
        t.shown.is_(None).label("no_shown_receipt"),
        t.body.is_not(None).label("body_clicked"),
        t.button_1.is_not(None).label("button_1_clicked"),
        t.button_2.is_not(None).label("button_2_clicked"),
    ).cte("per_delivery")
    p = per_delivery.c
    accepted = p.accepted.is_(True)
    # One statement, one pass over the campaign's deliveries and their receipts (the CTE,
    # computed once): each stage's count per minute, the counts that have no time, and the
    # first acceptance and latest event to the second. The periods are whole minutes
    # from a minute boundary, so the minutes add up into whichever period the chart takes.
    minute = {
        "accepted": p.accepted_at // MINUTE,
        "shown": p.shown_at // MINUTE,
        "clicked": p.clicked_at // MINUTE,
    }
    when = {
        "accepted": accepted,
        "shown": sa.and_(accepted, p.shown_at.is_not(None)),
        "clicked": sa.and_(accepted, p.clicked_at.is_not(None)),
        "unreported": sa.and_(accepted, p.clicked_at.is_not(None), p.no_shown_receipt.is_(True)),
        "unaccepted": sa.and_(p.accepted.is_(False), p.shown_at.is_not(None)),
        "body": sa.and_(accepted, p.body_clicked.is_(True)),
        "button-1": sa.and_(accepted, p.button_1_clicked.is_(True)),
        "button-2": sa.and_(accepted, p.button_2_clicked.is_(True)),
    }
    parts: list[Any] = []
    for kind, condition in when.items():
        period = minute.get(kind)
        part = sa.select(
            sa.literal(kind).label("kind"),
            (period if period is not None else sa.cast(sa.null(), sa.BigInteger)).label("at"),
            sa.func.count().label("n"),
        ).where(condition)
        parts.append(part.group_by(period) if period is not None else part)
    parts.append(
        sa.select(
            sa.literal("first").label("kind"), sa.func.min(p.accepted_at), sa.literal(0)
        ).where(accepted)
    )
    # clicked ≥ shown ≥ accepted for each delivery: its latest event is the first given.
    latest = sa.func.coalesce(p.clicked_at, p.shown_at, p.accepted_at)
    parts.append(
        sa.select(sa.literal("last").label("kind"), sa.func.max(latest), sa.literal(0)).where(
            accepted
        )
    )
    return sa.union_all(*parts)


def read(session: Session, campaign: Campaign, *, now: dt.datetime) -> Funnel:
    """The campaign's funnel: the three counts, the receipts outside it and the counts
    per period since its first acceptance (of the deliveries here and of those the
    delivery retention folded away)."""
    without_jit(session)
    here = minute_rows(session, _d.c.campaign_id == campaign.id).subquery("here")
    folded = sa.select(_f.c.kind, _f.c.at, _f.c.n).where(_f.c.campaign_id == campaign.id)
    rows = session.execute(sa.union_all(sa.select(here.c.kind, here.c.at, here.c.n), folded)).all()
    per_minute: dict[str, dict[int, int]] = {kind: {} for kind in STAGES}
    totals = dict.fromkeys(KINDS, 0)
    first = last = None
    for kind, at, n in rows:
        if kind == "first":
            if at is not None:
                first = int(at) if first is None else min(first, int(at))
        elif kind == "last":
            if at is not None:
                last = int(at) if last is None else max(last, int(at))
        else:
            totals[kind] += int(n)
            if kind in per_minute and at is not None:
                counted = per_minute[kind]
                counted[int(at)] = counted.get(int(at), 0) + int(n)
    n_accepted = totals["accepted"]
    width: int | None = None
    buckets: list[Bucket] = []
    if n_accepted and first is not None and last is not None:
        width, start = choose_width(int(first), int(last))
        per_bucket: dict[tuple[str, int], int] = {}
        for kind, counts in per_minute.items():
            for at_minute, n in counts.items():
                cell = (kind, (at_minute * MINUTE - start) // width)
                per_bucket[cell] = per_bucket.get(cell, 0) + n
        running = {"accepted": 0, "shown": 0, "clicked": 0}
        periods = (int(last) - start) // width + 1
        for i in range(periods):
            got = {kind: per_bucket.get((kind, i), 0) for kind in running}
            for kind in running:
                running[kind] += got[kind]
            buckets.append(
                Bucket(
                    start=_at(start + i * width),
                    end=_at(start + (i + 1) * width),
                    accepted=got["accepted"],
                    shown=got["shown"],
                    clicked=got["clicked"],
                    accepted_by=running["accepted"],
                    shown_by=running["shown"],
                    clicked_by=running["clicked"],
                )
            )
    return Funnel(
        accepted=n_accepted,
        shown=totals["shown"],
        clicked=totals["clicked"],
        clicked_unreported=totals["unreported"],
        unaccepted=totals["unaccepted"],
        now=now,
        width=width,
        buckets=buckets,
        clicked_body=totals["body"],
        clicked_buttons=(totals["button-1"], totals["button-2"]),
    )
