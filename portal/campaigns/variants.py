"""A/B variants: two or three versions of a campaign's title, message and image, a split
of the audience, and the funnel of each with its click-through rate.

**The split** is random and stable per subscription: a subscription's variant in a
campaign is one byte of its id (a UUIDv7, whose last bytes are random), which byte chosen
by the campaign, modulo the number of variants. The same subscription always gets the
same variant of one campaign (a delivery sent again, a resumed materialisation), and
different campaigns split the audience differently. It is written on each delivery when
the audience is materialised (:func:`variant_column`, one SQL expression for both
databases, held to :func:`variant_of` by the tests).

**Winner to the rest**: a campaign may test its variants on ``test_share`` percent of its
audience (the subscriptions whose split byte falls in that share: :func:`in_test`) and
hold the rest back, queued with reason ``awaiting_winner`` and due at
:data:`WINNER_PENDING`; ``winner_after`` seconds after the send time the engine asks
:func:`send_winner`, which chooses the variant with the best click-through rate
(:func:`choose_winner`) and makes every held delivery that variant, due now.

**The results** (:func:`results`): per variant, the deliveries, how many a push service
accepted, were shown and were clicked (the funnel's rules: portal/campaigns/funnel.py),
and the click-through rate of shown notifications with its 95% Wilson score interval. A
variant *leads* only when its interval lies wholly above every other's; otherwise the
page says no variant leads yet.
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
import zlib
from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from portal.campaigns import tally
from portal.campaigns.models import Campaign
from portal.db import is_postgres, without_jit
from portal.delivery.models import Delivery, DeliveryStatus

MAX_VARIANTS = 3
NAMES = ("A", "B", "C")
_d = cast(sa.Table, Delivery.__table__)
_FIRST_RANDOM_BYTE = 9  # of a UUIDv7: bytes 9-15 are random
_HEX = "0123456789abcdef"
Z_95 = 1.959963984540054
# What the results add up per variant, from the counters' groups (portal/campaigns/tally.py).
_COUNTED = ("variant", "status", "deliveries", "shown", "clicked")
AWAITING_WINNER = "awaiting_winner"  # the reason a delivery held for the winner carries
# When a held delivery is due: never, until the winner is chosen and makes it due now.
WINNER_PENDING = dt.datetime(9999, 12, 31, tzinfo=dt.UTC)


def _byte(campaign_id: uuid.UUID) -> int:
    """Which byte of a subscription id splits this campaign's audience."""
    return _FIRST_RANDOM_BYTE + zlib.crc32(campaign_id.bytes) % (16 - _FIRST_RANDOM_BYTE)


def variant_of(campaign_id: uuid.UUID, subscription_id: uuid.UUID, count: int) -> int:
    """The variant (0 = A) a subscription gets in a campaign of ``count`` variants."""
    return subscription_id.bytes[_byte(campaign_id)] % count


def in_test(campaign_id: uuid.UUID, subscription_id: uuid.UUID, share: int) -> bool:
    """Whether a subscription is in the ``share`` percent a campaign tests its variants on."""
    return subscription_id.bytes[_byte(campaign_id)] * 100 < share * 256


def _split_byte(
    session: Session, subscription_id: sa.ColumnElement[Any], campaign: Campaign
) -> sa.ColumnElement[Any]:
    position = _byte(campaign.id)
    if is_postgres(session):
        return sa.func.get_byte(sa.func.uuid_send(subscription_id), position)

    # SQLite keeps a UUID as 32 lower-case hex digits: the byte is two of them.
    def digit(offset: int) -> sa.ColumnElement[Any]:
        return sa.func.instr(_HEX, sa.func.substr(subscription_id, offset, 1)) - 1

    return digit(2 * position + 1) * 16 + digit(2 * position + 2)


def _tested(byte: sa.ColumnElement[Any], share: int) -> sa.ColumnElement[bool]:
    """:func:`in_test` in SQL, on the split byte."""
    return byte * 100 < share * 256


def held_back(
    session: Session, subscription_id: sa.ColumnElement[Any], campaign: Campaign
) -> sa.ColumnElement[bool] | None:
    """SQL: this subscription waits for the winner (outside the test share, no winner
    chosen yet); None when the campaign holds nobody back."""
    if campaign.test_share is None or campaign.winner is not None or not campaign.variants:
        return None
    return sa.not_(_tested(_split_byte(session, subscription_id, campaign), campaign.test_share))


def variant_column(
    session: Session, subscription_id: sa.ColumnElement[Any], campaign: Campaign
) -> sa.ColumnElement[Any]:
    """:func:`variant_of` in SQL, for the materialisation's INSERT … SELECT; NULL for a
    campaign without variants. With a test share: the split inside it, and outside it the
    winner once chosen (NULL before: :func:`send_winner` sets it)."""
    count = len(campaign.variants or ())
    if count < 2:
        return sa.cast(sa.null(), sa.SmallInteger)
    byte = _split_byte(session, subscription_id, campaign)
    split = sa.cast(byte % count, sa.SmallInteger)
    if campaign.test_share is None:
        return split
    rest = sa.literal(campaign.winner) if campaign.winner is not None else sa.null()
    return sa.case(
        (_tested(byte, campaign.test_share), split), else_=sa.cast(rest, sa.SmallInteger)
    )


@dataclass(frozen=True)
class Interval:
    low: float
    high: float


def wilson(successes: int, trials: int, z: float = Z_95) -> Interval | None:
    """The Wilson score interval of a proportion (95% by default); None without trials.
    Unlike the normal approximation it stays inside 0-1 and is honest for small counts."""
    if trials <= 0:
        return None
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    # At 0 or at every trial one end is exactly 0 or 1; rounding must not move it off.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == trials else min(1.0, centre + half)
    return Interval(low, high)


@dataclass(frozen=True)
class VariantResult:
    index: int
    title: str
    body: str
    image: str | None
    deliveries: int
    accepted: int
    shown: int
    clicked: int

    @property
    def name(self) -> str:
        return NAMES[self.index]

    @property
    def click_through(self) -> float | None:
        """Clicked of shown."""
        return self.clicked / self.shown if self.shown else None

    @property
    def interval(self) -> Interval | None:
        return wilson(self.clicked, self.shown)


@dataclass(frozen=True)
class Results:
    variants: list[VariantResult]

    @property
    def leader(self) -> VariantResult | None:
        """The variant whose interval lies wholly above every other's, if one does."""
        measured = [(v, v.interval) for v in self.variants]
        if any(interval is None for _, interval in measured):
            return None
        best, best_interval = max(measured, key=lambda pair: pair[0].click_through or 0.0)
        assert best_interval is not None
        others = [interval for v, interval in measured if v is not best]
        if all(other is not None and best_interval.low > other.high for other in others):
            return best
        return None


def choose_winner(found: Results) -> int:
    """The variant with the best click-through rate of shown notifications (the first of
    equals; A when nothing was shown)."""
    best = max(found.variants, key=lambda v: (v.click_through or 0.0, -v.index))
    return best.index


def winner_due(campaign: Campaign) -> dt.datetime | None:
    """When the winner goes to the rest, for a campaign that holds some back."""
    if campaign.test_share is None or campaign.winner_after is None:
        return None
    return campaign.send_at + dt.timedelta(seconds=campaign.winner_after)


def send_winner(session: Session, campaign_id: uuid.UUID, *, now: dt.datetime) -> int | None:
    """Choose the winner of a campaign whose test time is over and make every held
    delivery that variant, due now; None when there is nothing to do (not due, chosen
    already, or not materialised whole). Under the campaign row's lock, so of many
    processes one chooses, once, and no materialisation batch runs meanwhile."""
    campaign = session.get(Campaign, campaign_id, with_for_update=True)
    if campaign is None or campaign.winner is not None or campaign.materialised_at is None:
        return None
    due = winner_due(campaign)
    if due is None or due > now:
        return None
    found = results(session, campaign)
    winner = choose_winner(found) if found is not None else 0
    campaign.winner, campaign.winner_chosen_at = winner, now
    session.execute(
        sa.update(_d)
        .where(
            _d.c.campaign_id == campaign.id,
            _d.c.status == DeliveryStatus.QUEUED.value,
            _d.c.reason == AWAITING_WINNER,
        )
        .values(variant=winner, reason=None, next_attempt_at=now, updated_at=now)
    )
    session.flush()
    return winner


def results(session: Session, campaign: Campaign) -> Results | None:
    """Each variant's deliveries and funnel, from one aggregate query; None for a
    campaign without variants."""
    if not campaign.variants or len(campaign.variants) < 2:
        return None
    without_jit(session)
    # The counters' groups (the one place "shown" and "clicked" are defined), of the
    # deliveries here and of those the delivery retention folded away, added per variant.
    here = tally.groups(_d.c.campaign_id == campaign.id).subquery("here")
    t = tally.TALLY.c
    rows = session.execute(
        sa.union_all(
            sa.select(*(here.c[name] for name in _COUNTED)),
            sa.select(*(t[name] for name in _COUNTED)).where(t.campaign_id == campaign.id),
        )
    ).all()
    found: dict[int | None, list[int]] = {}
    for variant, status, deliveries, shown, clicked in rows:
        into = found.setdefault(variant, [0, 0, 0, 0])
        into[0] += int(deliveries)
        into[1] += int(deliveries) if status == DeliveryStatus.ACCEPTED.value else 0
        into[2] += int(shown)
        into[3] += int(clicked)
    return Results(
        [
            VariantResult(
                index,
                str(variant.get("title") or ""),
                str(variant.get("body") or ""),
                variant.get("image"),
                *found.get(index, [0, 0, 0, 0]),
            )
            for index, variant in enumerate(campaign.variants)
        ]
    )
