"""What a campaign's pages say about it: one rule from its delivery counts to a headline.

:func:`headline` is the only place that decides what a campaign is called (its tag and
its colour) and the sentence that says where it is; the campaign page, its progress JSON
and the campaign list all use it, so they cannot disagree. :func:`facts` reads what the
rule needs in one grouped query over the campaign's deliveries; the list, which shows
many campaigns, passes counts alone.

The promise (SPEC §7): a campaign whose deliveries failed never reads as a plain green
"Completed". The numbers of a headline always add up to the campaign's deliveries.
"""

from __future__ import annotations

import datetime as dt
import enum
import http
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from portal.campaigns import tally, unsent
from portal.campaigns.models import Campaign, CampaignStatus, CircuitState
from portal.campaigns.presentation import zoned_time
from portal.campaigns.variants import AWAITING_WINNER, winner_due
from portal.delivery.models import Delivery, DeliveryStatus, Unsendable
from portal.delivery.quiet import QUIET_HOURS
from portal.subscriptions.lifecycle import asks_to_retry

_d = cast(sa.Table, Delivery.__table__)
# How far back "sending at N a second" looks.
RATE_WINDOW = dt.timedelta(seconds=30)
FINAL = frozenset(
    {
        DeliveryStatus.ACCEPTED.value,
        DeliveryStatus.FAILED.value,
        DeliveryStatus.REVOKED.value,
        DeliveryStatus.SKIPPED.value,
    }
)


class Tone(enum.StrEnum):
    """The colour of a campaign's tag; its words always say the same."""

    INFO = "info"  # scheduled, starting, sending
    SUCCESS = "success"  # finished, every delivery delivered
    WARNING = "warning"  # finished with some not delivered; paused
    ERROR = "error"  # finished, nothing delivered
    MUTED = "muted"  # cancelled, expired, nobody to send to


@dataclass(frozen=True)
class Reason:
    """Deliveries that ended, or wait, for one reason (a row of the breakdown)."""

    status: str
    reason: str | None
    code: int | None
    count: int
    attempts: int = 0  # the most attempts one of them had


@dataclass(frozen=True)
class Facts:
    """What the rule needs to know about a campaign, read at ``now``."""

    status: str
    send_at: dt.datetime
    now: dt.datetime
    counts: dict[str, int]
    materialised: bool = True
    # Queued again after a 429/5xx or no answer: how many, when the next one is due.
    retrying: int = 0
    next_retry_at: dt.datetime | None = None
    # Deliveries that ended within RATE_WINDOW (for the sending rate).
    recent: int = 0
    reasons: list[Reason] = field(default_factory=list)
    dispatch_every: int = 30
    max_attempts: int = 5  # a delivery fails after this many (RetrySettings)
    time_zone: str | None = None  # the zone the send time was chosen in (None: UTC only)
    # A local-time campaign's time of day, and its deliveries not due yet (never tried:
    # waiting for that time where the person is) and when the next of them is due.
    local_time: dt.time | None = None
    later: int = 0
    next_later_at: dt.datetime | None = None
    # Waiting for quiet hours to end where the person is (portal/delivery/quiet.py), and
    # when the first of them is due again. Not retries: no attempt failed.
    quiet: int = 0
    next_quiet_at: dt.datetime | None = None
    # Held for an A/B test's winner (portal/campaigns/variants.py), and when it is chosen.
    awaiting_winner: int = 0
    winner_at: dt.datetime | None = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def count(self, status: DeliveryStatus) -> int:
        return self.counts.get(status.value, 0)


@dataclass(frozen=True)
class Headline:
    label: str  # the tag: "Failed", "Partly delivered", "Sending" …
    tone: Tone
    text: str  # the one sentence: "Finished: 0 of 19 delivered, 19 failed."
    parts: list[tuple[str, int]]  # the numbers in ``text``; they add up to the total
    activity: list[str]  # what is happening now (empty once finished)
    finished: bool


_PART_WORDS = (
    (DeliveryStatus.FAILED, "failed"),
    (DeliveryStatus.REVOKED, "revoked"),
    (DeliveryStatus.SKIPPED, "skipped"),
)
_FINISHED = {
    CampaignStatus.COMPLETED.value,
    CampaignStatus.CANCELLED.value,
    CampaignStatus.EXPIRED.value,
}


def _n(value: int) -> str:
    return f"{value:,}"


def _plural(value: int, one: str, many: str | None = None) -> str:
    return f"{_n(value)} {one if value == 1 else (many or one + 's')}"


def _clock(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%H:%M:%S UTC")


def headline(facts: Facts) -> Headline:
    """The campaign's tag, colour, sentence and what it is doing now, from its counts."""
    if facts.status in _FINISHED:
        return _finished(facts)
    return _under_way(facts)


def _ended(facts: Facts) -> list[tuple[str, int]]:
    return [(word, facts.count(status)) for status, word in _PART_WORDS if facts.count(status)]


def _waiting(facts: Facts) -> int:
    return facts.count(DeliveryStatus.QUEUED) + facts.count(DeliveryStatus.SENDING)


def from_counts(
    campaign: Campaign, counts: dict[str, int], *, now: dt.datetime, dispatch_every: int = 30
) -> Headline:
    """:func:`headline` from counts by status alone, as the lists of campaigns have them."""
    return headline(
        Facts(
            status=campaign.status,
            send_at=campaign.send_at,
            now=now,
            counts=counts,
            materialised=campaign.materialised_at is not None,
            time_zone=campaign.time_zone,
            dispatch_every=dispatch_every,
        )
    )


def _finished(facts: Facts) -> Headline:
    total = facts.total
    accepted = facts.count(DeliveryStatus.ACCEPTED)
    parts = [("delivered", accepted), *_ended(facts)]
    if _waiting(facts):  # cancelled or expired with sends still out
        parts.append(("still with a push service", _waiting(facts)))
    listed = ", ".join(f"{_n(n)} {word}" for word, n in parts[1:])
    sentence = f"{_n(accepted)} of {_n(total)} delivered" + (f", {listed}" if listed else "")
    if facts.status == CampaignStatus.CANCELLED.value:
        return Headline("Cancelled", Tone.MUTED, f"Cancelled: {sentence}.", parts, [], True)
    if facts.status == CampaignStatus.EXPIRED.value:
        text = f"Expired before the end: {sentence}."
        return Headline("Expired", Tone.MUTED, text, parts, [], True)
    if total == 0:
        text = "Finished: 0 of 0 delivered — no subscription had consent for this topic."
        return Headline("Nobody to send to", Tone.MUTED, text, parts, [], True)
    if accepted == total:
        label, tone = "Delivered", Tone.SUCCESS
    elif accepted == 0 and facts.count(DeliveryStatus.FAILED):
        label, tone = "Failed", Tone.ERROR
    elif accepted == 0:
        label, tone = "Nothing delivered", Tone.WARNING
    else:
        label, tone = "Partly delivered", Tone.WARNING
    return Headline(label, tone, f"Finished: {sentence}.", parts, [], True)


def _under_way(facts: Facts) -> Headline:
    total = facts.total
    waiting = _waiting(facts)
    parts = [("delivered", facts.count(DeliveryStatus.ACCEPTED)), *_ended(facts)]
    done = total - waiting
    if facts.status == CampaignStatus.SCHEDULED.value:
        parts.append(("to go", waiting))
        if facts.send_at > facts.now:
            when = zoned_time(facts.send_at, facts.time_zone).text
            text = f"Scheduled for {when}: nothing sent yet."
            return Headline("Scheduled", Tone.INFO, text, parts, [], False)
        every = _plural(facts.dispatch_every, "second")
        return Headline(
            "Starting",
            Tone.INFO,
            "Starting: nothing sent yet.",
            parts,
            [f"Waiting for the dispatcher, which picks up due campaigns every {every}."],
            False,
        )
    text = f"{_n(done)} of {_n(total)} done"
    if done:
        text += " — " + ", ".join(f"{_n(n)} {word}" for word, n in parts if n)
    if waiting:
        text += f"; {_n(waiting)} to go"
    parts.append(("to go", waiting))
    activity: list[str] = []
    if not facts.materialised:
        text += "; the audience is still being counted in"
        activity.append(
            f"Counting in the audience: {_plural(total, 'delivery', 'deliveries')} so far."
        )
    if facts.status == CampaignStatus.PAUSED.value:
        activity.append("Paused: nothing more is sent until the campaign is resumed.")
        return Headline("Paused", Tone.WARNING, f"Paused: {text}.", parts, activity, False)
    activity += _sending_activity(facts)
    return Headline("Sending", Tone.INFO, f"Sending: {text}.", parts, activity, False)


def _sending_activity(facts: Facts) -> list[str]:
    lines = []
    elapsed = (facts.now - facts.send_at).total_seconds()
    window = max(min(RATE_WINDOW.total_seconds(), elapsed), 1.0)
    if facts.recent:
        rate = facts.recent / window
        lines.append(
            f"Sending at {rate:,.1f} deliveries a second "
            f"(over the last {_plural(round(window), 'second')})."
        )
    in_flight = facts.count(DeliveryStatus.SENDING)
    if in_flight:
        lines.append(
            f"{_plural(in_flight, 'delivery', 'deliveries')} handed to push services, "
            "answer pending."
        )
    if facts.retrying:
        why = retry_causes(facts.reasons)
        line = f"Retrying {_plural(facts.retrying, 'delivery', 'deliveries')}"
        line += f" ({why})" if why else ""
        if facts.next_retry_at is not None:
            when = max(facts.next_retry_at, facts.now)
            line += f"; next attempt at {_clock(when)}"
        made = max(
            (r.attempts for r in facts.reasons if _retrying(r.status, r.reason)),
            default=0,
        )
        if made:
            line += f", attempt {made + 1} of at most {facts.max_attempts}"
        lines.append(line + ".")
    # Never tried and not due yet, each for its own reason (never counted as retries).
    if facts.later and facts.local_time is not None:
        why = f"{facts.local_time:%H:%M} in the person's time zone"
        lines.append(_waiting_for(facts, facts.later, why, facts.next_later_at))
    if facts.quiet:
        why = "quiet hours to end where the person is"
        lines.append(_waiting_for(facts, facts.quiet, why, facts.next_quiet_at))
    if facts.awaiting_winner:
        why = "the A/B test's winner"
        lines.append(
            _waiting_for(facts, facts.awaiting_winner, why, facts.winner_at, then=", chosen")
        )
    fresh = (
        facts.count(DeliveryStatus.QUEUED)
        - facts.retrying
        - facts.later
        - facts.quiet
        - facts.awaiting_winner
    )
    if fresh > 0 and not facts.recent and not in_flight:
        lines.append(f"{_plural(fresh, 'delivery', 'deliveries')} waiting for their first attempt.")
    return lines


def _waiting_for(
    facts: Facts, count: int, why: str, due: dt.datetime | None, then: str = "; the next due"
) -> str:
    """ "2 deliveries waiting for <why>; the next due <when>." """
    line = f"{_plural(count, 'delivery', 'deliveries')} waiting for {why}"
    if due is not None:
        line += f"{then} {zoned_time(due, facts.time_zone).text}"
    return line + "."


def status_phrase(code: int | None) -> str:
    """``503`` → "503 Service Unavailable"; None → "no answer"."""
    if code is None:
        return "no answer (network error or time-out)"
    try:
        return f"{code} {http.HTTPStatus(code).phrase}"
    except ValueError:
        return str(code)


def _retrying(status: str, reason: str | None) -> bool:
    """Queued again after an attempt that did not get through (a reason is kept), as
    against waiting for quiet hours to end (no attempt was made)."""
    return status == DeliveryStatus.QUEUED.value and reason not in (
        None,
        QUIET_HOURS,
        AWAITING_WINNER,
    )


def retry_causes(reasons: list[Reason]) -> str:
    """ "19 after 503 Service Unavailable" for the deliveries waiting for a retry."""
    by_answer: dict[str, int] = defaultdict(int)
    for row in reasons:
        if _retrying(row.status, row.reason):
            by_answer[status_phrase(row.code)] += row.count
    return ", ".join(f"{_n(n)} after {answer}" for answer, n in sorted(by_answer.items()))


_SKIPPED = {
    "cancelled": "Not sent: the campaign was cancelled first",
    "deliver_until_passed": "Expired before sending: its “don't deliver after” time passed",
    "consent_withdrawn": "Not sent: consent was withdrawn before sending",
    "frequency_cap": "Not sent: the person had already had as many marketing notifications "
    "as their frequency cap allows",
    "subscription_gone": "Not sent: the subscription was deleted before sending",
    "subscription_ended": "Not sent: the subscription ended before sending",
    Unsendable.UNREADABLE_KEYS.value: "Not sent: the subscription's keys could not be read",
}
# A delivery sent and answered, then waiting for its next attempt, when its campaign ended.
_AGAIN = {
    "cancelled": "Not sent again: the campaign was cancelled before its next attempt",
    "deliver_until_passed": "Not sent again: its “don't deliver after” time passed before "
    "its next attempt",
}
_FAILED = {
    Unsendable.INVALID_ENDPOINT.value: "Invalid endpoint: the stored address is no push endpoint",
    Unsendable.PAYLOAD_TOO_LARGE.value: "Message too large once encrypted for this subscription",
    Unsendable.INVALID_REQUEST.value: "A request no push service takes (time to live, urgency "
    "or collapse key)",
    Unsendable.SEND_ERROR.value: "Could not be sent: an error in the portal (see its log)",
    unsent.NO_ANSWER: "No answer recorded: the campaign ended while it was out, and the "
    "process sending it stopped before writing the push service's answer (it may have "
    "arrived)",
}


def reason_label(row: Reason) -> str:
    """Why deliveries did not arrive, in words: one row of the breakdown."""
    reason = row.reason or ""
    if row.status == DeliveryStatus.REVOKED.value:
        return "Subscription gone: the push service answered 410 Gone"
    if row.status == DeliveryStatus.SKIPPED.value:
        if reason in _AGAIN and row.code is not None:
            # Sent once and answered (a 503, say), then waiting to be tried again.
            return f"{_AGAIN[reason]} (the last answer was {status_phrase(row.code)})"
        if reason in _SKIPPED:
            return _SKIPPED[reason]
        if reason.startswith("subscription_"):
            state = reason.removeprefix("subscription_")
            return f"Not sent: the subscription was {state} before sending"
        return f"Not sent: {reason or 'no reason recorded'}"
    if reason == "max_attempts":
        return (
            f"Gave up after {_plural(row.attempts, 'attempt')}: the last was "
            f"{status_phrase(row.code)}"
        )
    if reason.startswith("not_found"):
        return "Not found at the push service: 404 Not Found (the subscription may be stale)"
    if reason.startswith("rejected"):
        return f"Refused by the push service: {status_phrase(row.code)}"
    return _FAILED.get(reason, f"Failed: {reason or 'no reason recorded'}")


def breakdown(reasons: list[Reason]) -> list[tuple[str, int]]:
    """The deliveries that did not arrive, by reason in words, most first."""
    counted: dict[str, int] = defaultdict(int)
    for row in reasons:
        if row.status in (
            DeliveryStatus.FAILED.value,
            DeliveryStatus.REVOKED.value,
            DeliveryStatus.SKIPPED.value,
        ):
            counted[reason_label(row)] += row.count
    return sorted(counted.items(), key=lambda item: (-item[1], item[0]))


# -- reading the facts --------------------------------------------------------------------


@dataclass(frozen=True)
class ServiceRetries:
    push_service: str
    retried: int  # deliveries that needed more than one attempt
    waiting: int  # of them, queued for their next attempt now
    # Ended after one attempt answered 429/5xx ("try again later") that was never made
    # again (the campaign was cancelled or expired first), by that answer's status code.
    not_tried_again: tuple[tuple[int, int], ...] = ()


class _PerService:
    """The slowed-down section's counts per push service, summed over ``read``'s rows."""

    def __init__(self) -> None:
        self.again: Counter[str] = Counter()
        self.waiting: Counter[str] = Counter()
        self.turned_away: dict[str, Counter[int]] = defaultdict(Counter)

    def add(
        self, service: str, status: str, code: int | None, n: int, again: int, *, waiting: bool
    ) -> None:
        self.again[service] += n if waiting else again
        self.waiting[service] += n if waiting else 0
        if status in FINAL and n > again and code is not None and asks_to_retry(code, service):
            self.turned_away[service][code] += n - again

    def retries(self) -> list[ServiceRetries]:
        services = sorted(set(self.again) | set(self.waiting) | set(self.turned_away))
        found = [
            ServiceRetries(
                service,
                self.again[service],
                self.waiting[service],
                tuple(sorted(self.turned_away[service].items())),
            )
            for service in services
        ]
        return [row for row in found if row.retried or row.waiting or row.not_tried_again]


@dataclass(frozen=True)
class Reading:
    """:class:`Facts` and what the slowed-down section needs, from one query."""

    facts: Facts
    retries: list[ServiceRetries]


def read(
    session: Session,
    campaign: Campaign,
    *,
    now: dt.datetime,
    dispatch_every: int = 30,
    max_attempts: int = 5,
) -> Reading:
    """A campaign's deliveries grouped by status, reason, last answer and push service."""
    since = now - RATE_WINDOW
    retried = sa.func.sum(sa.case((_d.c.attempts > 1, 1), else_=0))
    recent = sa.func.sum(
        sa.case((sa.and_(_d.c.status.in_(FINAL), _d.c.updated_at >= since), 1), else_=0)
    )
    # Never tried and not due yet: a local-time campaign's deliveries waiting for the
    # person's hour (a retry has a reason; a fresh delivery of any other campaign is due).
    not_due = sa.and_(
        _d.c.status == DeliveryStatus.QUEUED.value,
        _d.c.reason.is_(None),
        _d.c.next_attempt_at > now,
    )
    here = (
        sa.select(
            _d.c.status,
            _d.c.reason,
            _d.c.last_status_code,
            _d.c.push_service,
            sa.func.count(),
            sa.func.max(_d.c.attempts),
            retried,
            recent,
            sa.func.sum(sa.case((not_due, 1), else_=0)),
            sa.func.min(_d.c.next_attempt_at),
            sa.func.min(sa.case((not_due, _d.c.next_attempt_at), else_=sa.null())),
        )
        .where(_d.c.campaign_id == campaign.id)
        .group_by(_d.c.status, _d.c.reason, _d.c.last_status_code, _d.c.push_service)
    )
    # Deliveries the delivery retention folded away: answered long ago, none waiting.
    t = tally.TALLY.c
    gone = sa.select(
        t.status,
        t.reason,
        t.last_status_code,
        t.push_service,
        t.deliveries,
        t.most_attempts,
        t.retried,
        sa.literal(0),
        sa.literal(0),
        sa.null(),
        sa.null(),
    ).where(t.campaign_id == campaign.id)
    rows = session.execute(sa.union_all(here, gone)).all()
    counts = {s.value: 0 for s in DeliveryStatus}
    reasons: dict[tuple[str, str | None, int | None], list[int]] = {}
    per_service = _PerService()
    retrying = recent_total = later = quiet = awaiting = 0
    next_retry: dt.datetime | None = None
    next_later: dt.datetime | None = None
    next_quiet: dt.datetime | None = None
    for row_status, row_reason, code, service, *numbers, first_at, first_later in rows:
        n, most, again, lately, not_due_yet = (int(x or 0) for x in numbers)
        # Still queued in a campaign that ended: the skip it is about to be, waiting for
        # nothing (portal/campaigns/unsent.py).
        status, reason = unsent.as_shown(campaign.status, row_status, row_reason)
        ended = status != row_status
        waiting_later = 0 if ended else not_due_yet
        earliest_at = None if ended else first_at
        earliest_later = None if ended else first_later
        later += waiting_later
        if earliest_later is not None:
            due = _utc(earliest_later)
            next_later = due if next_later is None else min(next_later, due)
        counts[status] = counts.get(status, 0) + n
        recent_total += lately
        key = (status, reason, code)
        seen = reasons.setdefault(key, [0, 0])
        seen[0] += n
        seen[1] = max(seen[1], most)
        if status == DeliveryStatus.QUEUED.value and reason == AWAITING_WINNER:
            awaiting += n
        if status == DeliveryStatus.QUEUED.value and reason == QUIET_HOURS:
            quiet += n
            if earliest_at is not None:
                earliest = _utc(earliest_at)
                next_quiet = earliest if next_quiet is None else min(next_quiet, earliest)
        waiting = _retrying(status, reason)
        if waiting:
            retrying += n
            if earliest_at is not None:
                earliest = _utc(earliest_at)
                next_retry = earliest if next_retry is None else min(next_retry, earliest)
        per_service.add(service, status, code, n, again, waiting=waiting)
    facts = Facts(
        status=campaign.status,
        send_at=campaign.send_at,
        now=now,
        counts=counts,
        materialised=campaign.materialised_at is not None,
        time_zone=campaign.time_zone,
        retrying=retrying,
        next_retry_at=next_retry,
        local_time=campaign.local_time,
        later=later,
        next_later_at=next_later,
        quiet=quiet,
        next_quiet_at=next_quiet,
        awaiting_winner=awaiting,
        winner_at=winner_due(campaign),
        recent=recent_total,
        reasons=[
            Reason(status, reason, code, n, most)
            for (status, reason, code), (n, most) in sorted(
                reasons.items(), key=lambda item: (item[0][0], item[0][1] or "", item[0][2] or 0)
            )
        ],
        dispatch_every=dispatch_every,
        max_attempts=max_attempts,
    )
    return Reading(facts, per_service.retries())


def _utc(when: dt.datetime) -> dt.datetime:
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


def circuits_seen(
    session: Session, campaign: Campaign, *, now: dt.datetime
) -> list[tuple[CircuitState, bool]]:
    """Circuits open now, and those opened while this campaign was sending (a push
    service keeps only its latest circuit): (circuit, still open)."""
    until = campaign.finished_at or now
    found = session.scalars(
        sa.select(CircuitState)
        .where(
            sa.or_(
                CircuitState.open_until > now,
                sa.and_(
                    CircuitState.opened_at >= campaign.send_at,
                    CircuitState.opened_at <= until,
                ),
            )
        )
        .order_by(CircuitState.push_service)
    ).all()
    return [(circuit, _utc(circuit.open_until) > now) for circuit in found]


def slowdowns(
    circuits: list[tuple[CircuitState, bool]], retries: list[ServiceRetries], *, finished: bool
) -> list[str]:
    """The "push services slowed down" lines: circuits, then retries seen per service."""
    lines = []
    for circuit, still_open in circuits:
        if still_open:
            lines.append(
                f"{circuit.push_service} slowed down until {_clock(circuit.open_until)} — "
                f"{circuit.reason}"
            )
        else:
            lines.append(
                f"{circuit.push_service} was slowed down from {_clock(circuit.opened_at)} to "
                f"{_clock(circuit.open_until)} — {circuit.reason}"
            )
    for row in retries:
        if row.retried or row.waiting:
            line = (
                f"{row.push_service}: {_plural(row.retried, 'delivery', 'deliveries')} "
                f"needed more than one attempt"
            )
            if row.waiting and not finished:
                line += f", {_n(row.waiting)} waiting for the next"
            lines.append(line)
        for code, count in row.not_tried_again:
            lines.append(
                f"{row.push_service}: {_plural(count, 'delivery', 'deliveries')} answered "
                f"{status_phrase(code)} (try again later) and not tried again"
            )
    return lines


def no_slowdown(*, finished: bool) -> str:
    if finished:
        return "None: no push service was slowed down and every delivery took one attempt."
    return "None so far: every push service is taking messages at the first attempt."
