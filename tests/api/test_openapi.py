"""The OpenAPI document at /api/openapi.json: complete, valid, and true to real answers."""

from __future__ import annotations

import re
from typing import Any

import pytest
import schemathesis
import sqlalchemy as sa
from openapi_spec_validator import validate
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from portal.db import db
from portal.feedback.signature import header_value
from portal.subscriptions.models import PushSubscription
from portal.subscriptions.validation import endpoint_hash
from tests.api.conftest import AUTH, ENDPOINT_BASE, NOW, POLICY, subscription
from tests.helpers import record_delivery

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
AUTOMATIC = {"HEAD", "OPTIONS"}


def test_the_document_is_valid_openapi(api_app):
    document = api_app.test_client().get("/api/openapi.json").json
    validate(document)
    assert document["openapi"] == "3.1.0"


def _openapi_path(rule: str) -> str:
    """Flask's ``/x/<string:size>`` as OpenAPI's ``/x/{size}``."""
    return re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule)


def test_every_api_route_is_documented_and_nothing_else(api_app):
    document = api_app.test_client().get("/api/openapi.json").json
    served = {
        (_openapi_path(rule.rule), method.lower())
        for rule in api_app.url_map.iter_rules()
        if rule.rule.startswith("/api/")
        for method in (rule.methods or set()) - AUTOMATIC
    }
    documented = {(path, method) for path, item in document["paths"].items() for method in item}
    assert {p for p in documented if p[0].startswith("/api/")} == served
    # The few documented routes outside /api/ exist too.
    every_route = {
        (_openapi_path(rule.rule), method.lower())
        for rule in api_app.url_map.iter_rules()
        for method in (rule.methods or set()) - AUTOMATIC
    }
    assert documented <= every_route


def test_limits_in_the_document_follow_the_settings(database_url, tmp_path, api_clock):
    from portal import create_app
    from tests.conftest import make_settings

    settings = make_settings(
        database_url, str(tmp_path), endpoint_max_length=300, feedback_signature_header="X-Sig"
    )
    app = create_app(settings, clock=api_clock)
    document = app.test_client().get("/api/openapi.json").json
    app.extensions["portal.db"].engine.dispose()
    schemas = document["components"]["schemas"]
    assert schemas["EndpointRequest"]["properties"]["endpoint"]["maxLength"] == 300
    parameters = document["paths"]["/api/push/feedback"]["post"]["parameters"]
    assert [p["name"] for p in parameters] == ["X-Sig"]


@pytest.fixture
def api_schema(api_app, world):
    return schemathesis.openapi.from_wsgi("/api/openapi.json", api_app)


def _signed(body: bytes) -> dict[str, str]:
    stamp = int(NOW.timestamp() * 1000)
    return {"X-CN1-Signature": header_value("feedback-secret-one", stamp, body)}


def _conforms(schema, path: str, method: str, expected: int, **case: Any) -> Any:
    operation = schema[path][method]
    made = operation.Case(**case)
    response = made.call()
    assert response.status_code == expected, response.text
    made.validate_response(response, checks=CHECKS)
    return response


def test_happy_answers_match_the_document(api_app, api_schema, world):
    new = subscription("fresh-one")
    _conforms(api_schema, "/healthz", "GET", 200)
    _conforms(api_schema, "/api/openapi.json", "GET", 200)
    _conforms(api_schema, "/api/push/vapid-public-key", "GET", 200)
    head = _conforms(api_schema, "/api/consent-log/tree-head", "GET", 200).json()
    size = head["tree_size"]
    _conforms(api_schema, "/api/consent-log/key", "GET", 200)
    _conforms(
        api_schema, "/api/consent-log/tree-head/{size}", "GET", 200, path_parameters={"size": size}
    )
    _conforms(
        api_schema,
        "/api/consent-log/consistency",
        "GET",
        200,
        query={"from": "1", "to": str(size)},
    )
    with api_app.extensions["portal.db"].engine.connect() as conn:
        first_leaf = conn.execute(
            sa.text("SELECT hash FROM consent_log_node WHERE level = 0 AND idx = 0")
        ).scalar_one()
    _conforms(
        api_schema,
        "/api/consent-log/inclusion",
        "GET",
        200,
        query={"leaf": bytes(first_leaf).hex(), "size": str(size)},
    )
    _conforms(
        api_schema,
        "/api/push/subscribe",
        "POST",
        201,
        body={"subscription": new, "topics": ["weekly-digest"], "policyVersion": POLICY},
    )
    _conforms(api_schema, "/api/push/subscribe", "POST", 200, body={"subscription": new})
    # Each request stands alone (no cookies): the subscription's auth secret proves it.
    for endpoint in (new["endpoint"], world.endpoints[2], ENDPOINT_BASE + "never-seen"):
        body = {"endpoint": endpoint, "auth": AUTH}
        _conforms(api_schema, "/api/push/heartbeat", "POST", 200, body=body)
        _conforms(api_schema, "/api/push/status", "POST", 200, body=body)
    _conforms(
        api_schema,
        "/api/push/preferences",
        "POST",
        200,
        body={
            "endpoint": new["endpoint"],
            "auth": AUTH,
            "decisions": [{"slug": "offers", "state": "opt_in"}],
            "policyVersion": POLICY,
            "decidedAt": "2025-12-31T23:59:00Z",
        },
    )
    _conforms(
        api_schema,
        "/api/push/change",
        "POST",
        201,
        body={
            "oldEndpoint": new["endpoint"],
            "oldAuth": AUTH,
            "subscription": subscription("fresh-two", key=1),
        },
    )
    _conforms(
        api_schema,
        "/api/push/unsubscribe",
        "POST",
        200,
        body={"endpoint": ENDPOINT_BASE + "fresh-two", "auth": AUTH, "source": "subscribe-page"},
    )
    with db.begin(api_app) as session:
        held = session.execute(
            sa.select(PushSubscription.id).where(
                PushSubscription.endpoint_hash == endpoint_hash(new["endpoint"])
            )
        ).scalar_one()
        delivery_id = record_delivery(session, held, now=NOW)
    receipt = {
        "deliveryId": delivery_id,
        "event": "shown",
        "endpoint": new["endpoint"],
        "auth": AUTH,
    }
    _conforms(api_schema, "/api/push/receipt", "POST", 201, body=receipt)
    _conforms(api_schema, "/api/push/receipt", "POST", 200, body=receipt)
    digest = b'{"organization": "acme", "events": [], "truncated": false}'
    _conforms(
        api_schema,
        "/api/push/feedback",
        "POST",
        200,
        body=digest,
        media_type="application/json",
        headers=_signed(digest),
    )


def test_error_answers_match_the_document(api_schema, world):
    bad_auth = subscription("bad")
    bad_auth["keys"]["auth"] = AUTH + "A"
    # Well-formed keys that are not the ones registered for seed-one.
    bad_keys = {**subscription("seed-one")["keys"], "auth": "A" * 22}
    cases = [
        ("/api/consent-log/tree-head/{size}", "GET", 400, {"path_parameters": {"size": "x"}}),
        ("/api/consent-log/tree-head/{size}", "GET", 404, {"path_parameters": {"size": "999"}}),
        ("/api/consent-log/consistency", "GET", 400, {"query": {"from": "0", "to": "1"}}),
        ("/api/consent-log/consistency", "GET", 404, {"query": {"from": "1", "to": "999"}}),
        ("/api/consent-log/inclusion", "GET", 400, {"query": {"leaf": "x", "size": "1"}}),
        ("/api/consent-log/inclusion", "GET", 404, {"query": {"leaf": "0" * 64, "size": "1"}}),
        ("/api/push/vapid-public-key", "GET", 403, {"headers": {"Sec-Fetch-Site": "cross-site"}}),
        ("/api/push/subscribe", "POST", 400, {"body": {"subscription": "x"}}),
        ("/api/push/subscribe", "POST", 422, {"body": {"subscription": bad_auth}}),
        (
            "/api/push/subscribe",
            "POST",
            403,
            {"body": {}, "headers": {"Origin": "https://elsewhere.example"}},
        ),
        ("/api/push/subscribe", "POST", 413, {"body": {"subscription": "x" * 20000}}),
        (
            "/api/push/heartbeat",
            "POST",
            415,
            {"body": "endpoint=x", "media_type": "application/x-www-form-urlencoded"},
        ),
        ("/api/push/heartbeat", "POST", 422, {"body": {"endpoint": "e" * 5000}}),
        ("/api/push/status", "POST", 400, {"body": {"endpoint": 5}}),
        ("/api/push/status", "POST", 422, {"body": {"endpoint": "e" * 5000}}),
        ("/api/push/unsubscribe", "POST", 403, {"body": {"endpoint": ENDPOINT_BASE + "nobody"}}),
        # Someone else's subscription: refused like one nobody registered.
        ("/api/push/unsubscribe", "POST", 403, {"body": {"endpoint": world.endpoints[0]}}),
        (
            "/api/push/subscribe",
            "POST",
            403,
            {"body": {"subscription": {**subscription("seed-one"), "keys": bad_keys}}},
        ),
        ("/api/push/change", "POST", 400, {"body": {"subscription": {}}}),
        (
            "/api/push/preferences",
            "POST",
            403,
            {
                "body": {
                    "endpoint": ENDPOINT_BASE + "nobody",
                    "decisions": [{"slug": "offers", "state": "opt_out"}],
                    "policyVersion": POLICY,
                    "decidedAt": "2025-12-31T23:59:00+00:00",
                }
            },
        ),
        ("/api/push/receipt", "POST", 422, {"body": {"deliveryId": "d 1", "event": "shown"}}),
        ("/api/push/receipt", "POST", 403, {"body": {"deliveryId": "1", "event": "shown"}}),
        (
            "/api/push/feedback",
            "POST",
            401,
            {"body": {"organization": "acme", "events": []}, "headers": {"X-CN1-Signature": "t=1"}},
        ),
    ]
    for path, method, status, case in cases:
        _conforms(api_schema, path, method, status, **case)
    signed_bad = b'{"organization": "acme", "events": 3}'
    _conforms(
        api_schema,
        "/api/push/feedback",
        "POST",
        422,
        body=signed_bad,
        media_type="application/json",
        headers=_signed(signed_bad),
    )


def test_rate_limited_answers_match_the_document(database_url, tmp_path, api_clock):
    from portal import create_app
    from portal.config import RateLimitSettings
    from tests.conftest import make_settings

    settings = make_settings(
        database_url,
        str(tmp_path),
        rate_limit=RateLimitSettings(per_address=2, per_endpoint=0),
    )
    app = create_app(settings, clock=api_clock)
    try:
        schema = schemathesis.openapi.from_wsgi("/api/openapi.json", app)
        assert "429" in schema.raw_schema["paths"]["/api/push/heartbeat"]["post"]["responses"]
        body = {"endpoint": ENDPOINT_BASE + "anyone"}
        for _ in range(2):  # the limit: two per window and route
            _conforms(schema, "/api/push/heartbeat", "POST", 200, body=body)
        response = _conforms(schema, "/api/push/heartbeat", "POST", 429, body=body)
        assert response.json()["error"]["code"] == "rate_limited"
        assert int(response.headers["retry-after"][0]) > 0
    finally:
        app.extensions["portal.db"].engine.dispose()
