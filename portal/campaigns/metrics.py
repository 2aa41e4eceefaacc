"""Send metrics (prometheus_client, multi-process safe). Labels stay bounded: provider is
one of fcm, autopush, apple, wns, other; status is an HTTP code or a network-error kind."""

from __future__ import annotations

import collections
from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram

from portal.delivery.models import Unsendable
from portal.push.transport import PushResponse

PROVIDERS = frozenset({"fcm", "autopush", "apple", "wns", "other"})

send_attempts = Counter(
    "push_send_attempts_total", "Delivery attempts by provider and answer", ["provider", "status"]
)
send_success = Counter(
    "push_send_success_total", "Deliveries accepted by the push service", ["provider"]
)
send_failures = Counter(
    "push_send_failures_total",
    "Deliveries that failed, by provider and reason",
    ["provider", "reason"],
)
tokens_pruned = Counter(
    "push_token_pruned_total", "Subscriptions revoked on 410 Gone", ["provider"]
)
tokens_pruned_current = Gauge(
    "push_token_pruned_current",
    "Revoked subscriptions currently in the database",
    multiprocess_mode="mostrecent",
)
send_latency = Histogram(
    "push_send_seconds",
    "Time per push request (batch time shared across its requests)",
    ["provider"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
deliveries_queued = Gauge(
    "push_deliveries_queued", "Deliveries waiting to be sent", multiprocess_mode="mostrecent"
)
vapid_cache = Counter("push_vapid_cache_total", "VAPID token lookups, by hit or miss", ["result"])
sender_rested = Counter(
    "push_sender_rested_seconds_total",
    "Seconds web workers' senders rested to keep to DISPATCH_WEB_CPU_SHARE",
)

_FAILURE_REASONS = frozenset(
    {"not_found", "rejected", "max_retries_exceeded", "4xx_non_retryable"}
    | {reason.value for reason in Unsendable}
)


def _provider(name: str) -> str:
    return name if name in PROVIDERS else "other"


def observe_send(provider: str, response: PushResponse, seconds: float) -> None:
    provider = _provider(provider)
    status = (
        str(response.status) if response.status is not None else str(response.error or "network")
    )
    send_attempts.labels(provider, status).inc()
    send_latency.labels(provider).observe(seconds)
    if response.accepted:
        send_success.labels(provider).inc()


def observe_sends(sent: Iterable[tuple[str, PushResponse]], seconds_each: float) -> None:
    """:func:`observe_send` for a batch: one label lookup per provider and status rather
    than per message (a lookup costs more than the increment)."""
    counts: collections.Counter[tuple[str, str, bool]] = collections.Counter(
        (
            provider,
            str(response.status)
            if response.status is not None
            else str(response.error or "network"),
            response.accepted,
        )
        for provider, response in sent
    )
    for (provider, status, accepted), count in counts.items():
        name = _provider(provider)
        send_attempts.labels(name, status).inc(count)
        latency = send_latency.labels(name)
        for _ in range(count):
            latency.observe(seconds_each)
        if accepted:
            send_success.labels(name).inc(count)


def failure(provider: str, reason: str) -> None:
    send_failures.labels(
        _provider(provider), reason if reason in _FAILURE_REASONS else "other"
    ).inc()


def pruned(provider: str) -> None:
    tokens_pruned.labels(_provider(provider)).inc()
