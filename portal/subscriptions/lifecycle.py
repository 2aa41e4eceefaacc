"""The subscription lifecycle as push-service answers drive it (SPEC §5, seed 000 §5).

One pure function, :func:`apply_answer`, maps an answer to what happens to the delivery
and to the subscription. The dispatch engine, the feedback receiver and the tests all
use it, so the rules live in exactly one place.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import enum
import random
from collections.abc import Callable
from dataclasses import dataclass

from portal.config import RetrySettings
from portal.subscriptions.models import PushService, SubscriptionState

WNS_RATE_LIMITED = 406


class Outcome(enum.StrEnum):
    ACCEPTED = "accepted"
    RETRY = "retry"
    FAILED = "failed"
    REVOKED = "revoked"


@dataclass(frozen=True)
class Lifecycle:
    """What the rules need to know about a subscription."""

    state: SubscriptionState
    consecutive_failures: int = 0
    has_succeeded: bool = False


@dataclass(frozen=True)
class PushAnswer:
    """A push service's answer; ``status`` is None for a network error or time-out."""

    status: int | None
    push_service: PushService = PushService.OTHER
    retry_after: float | None = None


@dataclass(frozen=True)
class Transition:
    outcome: Outcome
    lifecycle: Lifecycle
    reason: str


_TERMINAL = (SubscriptionState.REVOKED, SubscriptionState.EXPIRED)


def apply_answer(
    current: Lifecycle, answer: PushAnswer, *, failures_before_stale: int = 3
) -> Transition:
    status = answer.status
    if status is None:
        return Transition(Outcome.RETRY, current, "network_error")
    if 200 <= status < 300:
        state = current.state if current.state in _TERMINAL else SubscriptionState.ACTIVE
        return Transition(Outcome.ACCEPTED, Lifecycle(state, 0, True), "accepted")
    if status == 410:
        return Transition(
            Outcome.REVOKED,
            Lifecycle(
                SubscriptionState.REVOKED, current.consecutive_failures, current.has_succeeded
            ),
            "gone",
        )
    if status == 404:
        # Ambiguous: a routing blip or a dead registration. Count it; decide after several.
        failures = current.consecutive_failures + 1
        state = current.state
        if failures >= failures_before_stale and state in (
            SubscriptionState.PENDING,
            SubscriptionState.ACTIVE,
        ):
            state = SubscriptionState.STALE
        return Transition(
            Outcome.FAILED, Lifecycle(state, failures, current.has_succeeded), "not_found"
        )
    if asks_to_retry(status, answer.push_service):
        rate_limited = status < 500
        return Transition(
            Outcome.RETRY, current, "rate_limited" if rate_limited else "server_error"
        )
    # Any other answer is about this request (payload too large, bad VAPID, ...):
    # fail the delivery, but it says nothing about whether the subscription lives.
    return Transition(Outcome.FAILED, current, "rejected")


def asks_to_retry(status: int, push_service: PushService | str | None) -> bool:
    """A push service's "try again later": 429 (406 from WNS), or any 5xx."""
    if status == 429 or (status == WNS_RATE_LIMITED and push_service == PushService.WNS):
        return True
    return 500 <= status < 600


def backoff_delay(
    attempt: int,
    retry: RetrySettings,
    *,
    retry_after: float | None = None,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait before the next attempt, after ``attempt`` attempts have failed.

    min(initial × factor^(attempt−1), max), at least Retry-After, times (1 + jitter·U[0,1)).
    """
    exponential = min(
        retry.initial_delay * retry.backoff_factor ** max(attempt - 1, 0), retry.max_delay
    )
    floor = max(exponential, retry_after or 0.0)
    return floor * (1 + rand() * retry.jitter)


def may_retry(attempts_made: int, retry: RetrySettings) -> bool:
    return attempts_made < retry.max_attempts


# The longest a push service's Retry-After defers a delivery: four weeks, the longest TTL
# push services keep a message for; a longer wait would outlive any message it holds.
MAX_RETRY_AFTER = 28 * 24 * 3600.0


def parse_retry_after(value: str | None, now: dt.datetime) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP date (RFC 9110 §10.2.3), at most
    :data:`MAX_RETRY_AFTER`; anything else is no Retry-After.

    Whatever a push service sends must not raise here: the answer is read while its batch
    is out, and an exception would end the whole batch (the '²' that ``str.isdigit``
    accepts and ``float`` refuses did). Only ASCII digits are delta-seconds."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return min(float(value), MAX_RETRY_AFTER)  # 400 digits make inf: capped too
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return min(max((when - now).total_seconds(), 0.0), MAX_RETRY_AFTER)
