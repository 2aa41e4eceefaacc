"""Prometheus metrics, correct under gunicorn with several workers.

When ``PROMETHEUS_MULTIPROC_DIR`` is set (``gunicorn.conf.py`` sets it before workers
import the app), prometheus_client keeps each process's values in files there and
``/metrics`` aggregates them; otherwise the process's own registry is served.
"""

from __future__ import annotations

import os

from flask import Blueprint, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)

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

bp = Blueprint("metrics", __name__)


@bp.get("/metrics")
def metrics() -> Response:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = REGISTRY
    return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)
