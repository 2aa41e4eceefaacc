"""Schemathesis against the served OpenAPI document, in process through WSGI.

Every operation gets schema-valid (positive) and schema-breaking (negative) requests;
each answer must pass Schemathesis's conformance checks and the fuzzing oracle of
:mod:`tests.api.guard` (no 5xx, the error shape, nothing written by a refusal).
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.api.guard import Guard

pytestmark = pytest.mark.fuzz

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
# Positive POSTs carry same-origin headers, so they reach validation; the others
# generate the headers too, cross-origin ones included.
SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin", "Origin": "http://localhost"}
# Operations without any input: one request says all (tests/api/test_openapi.py makes it).
NO_INPUT = {
    ("/healthz", "GET"),
    ("/api/openapi.json", "GET"),
    ("/api/consent-log/tree-head", "GET"),
    ("/api/consent-log/key", "GET"),
}
# Requests per (operation, mode). The GET takes only two optional headers, so a few dozen
# cover it; the JSON POSTs get the most.
BUDGET = {
    ("/api/push/vapid-public-key", "GET"): 30,
    ("/api/push/subscribe", "POST"): 100,
    ("/api/push/heartbeat", "POST"): 60,
    ("/api/push/status", "POST"): 40,
    ("/api/push/change", "POST"): 100,
    ("/api/push/unsubscribe", "POST"): 60,
    ("/api/push/preferences", "POST"): 100,
    ("/api/push/receipt", "POST"): 80,
    ("/api/push/feedback", "POST"): 60,
    # The consent log's public evidence: a few parameters, all strings of digits or a hash.
    ("/api/consent-log/tree-head/{size}", "GET"): 30,
    ("/api/consent-log/consistency", "GET"): 40,
    ("/api/consent-log/inclusion", "GET"): 40,
}
SCHEMA_REQUESTS = 2 * sum(BUDGET.values())


def test_every_operation_with_input_is_fuzzed(api_app):
    document = api_app.test_client().get("/api/openapi.json").json
    operations = {
        (path, method.upper()): item
        for path, methods in document["paths"].items()
        for method, item in methods.items()
    }
    assert set(operations) == set(BUDGET) | NO_INPUT
    for key in NO_INPUT:
        assert "parameters" not in operations[key]
        assert "requestBody" not in operations[key]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
@pytest.mark.parametrize(("path", "method"), list(BUDGET))
def test_schemathesis(api_app, world, fuzz_report, path, method, mode):
    schema = schemathesis.openapi.from_wsgi("/api/openapi.json", api_app)
    operation = schema[path][method]
    guard = Guard(api_app.extensions["portal.db"].engine)
    budget = BUDGET[path, method]
    # The GET's only input is these headers: generate them there.
    headers = SAME_ORIGIN if mode is GenerationMode.POSITIVE and method == "POST" else None

    # too_slow / filter_too_much: Schemathesis's negative strategies reject many drafts
    # by design, and every example is a full request with two database digests.
    @settings(
        max_examples=budget,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(case=operation.as_strategy(generation_mode=mode, headers=headers))
    def send(case: schemathesis.Case) -> None:
        response = case.call()
        content_type = response.headers.get("content-type")
        if isinstance(content_type, list):
            content_type = content_type[0]
        guard.check(response.status_code, content_type, response.content, repr(case))
        case.validate_response(response, checks=CHECKS)

    send()
    fuzz_report.append(f"{method} {path} {mode}: {guard.summary()}")
    assert guard.requests >= budget
