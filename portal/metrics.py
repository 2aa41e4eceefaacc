"""Prometheus metrics, correct under gunicorn with several workers.

When ``PROMETHEUS_MULTIPROC_DIR`` is set (``gunicorn.conf.py`` sets it before workers
import the app), prometheus_client keeps each process's values in files there and
``/metrics`` aggregates them; otherwise the process's own registry is served. With
``METRICS_TOKEN`` set, only a scraper sending it as a bearer token reads them.
"""

from __future__ import annotations

import hmac
import os

from flask import Blueprint, Response, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)

from portal.seams import current_portal

subscription_upserts = Counter(
    "push_subscription_upserts_total",
    "Subscriptions registered, by whether the row was inserted or updated",
    ["result"],
)
http_requests = Counter(
    "portal_http_requests_total",
    "HTTP requests answered, by route and status class",
    ["route", "status"],
)
http_latency = Histogram(
    "portal_http_request_seconds",
    "Time to answer an HTTP request, by route",
    ["route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
feedback_digests = Counter(
    "portal_feedback_digests_total",
    "Delivery-feedback digests received, by whether they were acknowledged",
    ["result"],
)
feedback_events = Counter(
    "portal_feedback_events_total",
    "Events of acknowledged feedback digests: applied (first time), duplicate (already "
    "applied) or ignored (a reason other than INVALID_TARGET)",
    ["outcome"],
)
feedback_revocations = Counter(
    "portal_feedback_revocations_total",
    "Subscriptions revoked because delivery feedback reported their target invalid",
)
feedback_rejections = Counter(
    "portal_feedback_rejections_total",
    "Delivery-feedback digests not acknowledged, by reason",
    ["reason"],
)
for _result in ("accepted", "rejected"):
    feedback_digests.labels(_result)
for _outcome in ("applied", "duplicate", "ignored"):
    feedback_events.labels(_outcome)

bp = Blueprint("metrics", __name__)


def _authorised(expected: str) -> bool:
    """``Authorization: Bearer <METRICS_TOKEN>``, compared in constant time."""
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode("utf-8"), expected.encode("utf-8"))


@bp.get("/metrics")
def metrics() -> Response:
    token = current_portal().settings.metrics_token
    if token and not _authorised(token):
        return Response(
            "A bearer token is required to read the metrics.\n",
            401,
            mimetype="text/plain",
            headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
        )
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = REGISTRY
    return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)
