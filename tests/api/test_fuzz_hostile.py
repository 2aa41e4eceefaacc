"""Hostile requests of our own to every JSON endpoint (see tests/api/hostile.py).

No answer may be a 5xx; every 4xx has the JSON error shape; and a refused request
writes nothing (tests/api/guard.py compares a digest of every table around it).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from tests.api import hostile
from tests.api.guard import Guard
from tests.api.test_fuzz_schema import BUDGET as SCHEMA_BUDGET

pytestmark = pytest.mark.fuzz

# Requests per endpoint; with Schemathesis's (both modes) at least 10,000 per run.
BUDGET = {
    "subscribe": 1800,
    "change": 1400,
    "preferences": 1700,
    "heartbeat": 900,
    "status": 400,
    "unsubscribe": 900,
    "receipt": 1000,
    "feedback": 1200,
    "odd": 400,
}
STRATEGIES = {**hostile.ENDPOINTS, "odd": hostile.odd_requests}
MINIMUM_PER_RUN = 10_000


def test_a_run_sends_at_least_ten_thousand_requests():
    assert set(BUDGET) == set(STRATEGIES)
    assert sum(BUDGET.values()) + 2 * sum(SCHEMA_BUDGET.values()) >= MINIMUM_PER_RUN


@pytest.mark.parametrize("name", list(BUDGET))
def test_hostile_requests(api_app, world, fuzz_report, name):
    client = api_app.test_client()
    guard = Guard(api_app.extensions["portal.db"].engine)

    # too_slow: every example is a full request plus two digests of the database.
    @settings(
        max_examples=BUDGET[name],
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(request=STRATEGIES[name])
    def send(request: hostile.HostileRequest) -> None:
        response = client.open(
            request.path, method=request.method, data=request.data, headers=request.headers
        )
        guard.check(
            response.status_code,
            response.mimetype,
            response.get_data(),
            repr(request),
            has_body=request.method != "HEAD",
        )

    send()
    fuzz_report.append(f"{name}: {guard.summary()}")
    assert guard.requests >= BUDGET[name]
