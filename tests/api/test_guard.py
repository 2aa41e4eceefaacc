"""The fuzzing oracle itself: it sees a write, a 5xx and a malformed error."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from portal.db import db
from portal.subscriptions.models import PushSubscription
from tests.api.conftest import NOW, subscription
from tests.api.guard import Guard, TableDigest, is_error_shape
from tests.helpers import record_delivery

REFUSAL = b'{"error": {"code": "invalid_value", "message": "no", "field": "event"}}'


def _receipt(api_app: Flask) -> tuple[FlaskClient, dict[str, Any]]:
    """A subscribed browser and a receipt it may send: a write of exactly one row."""
    client = api_app.test_client()
    answer = client.post("/api/push/subscribe", json={"subscription": subscription("guard")})
    assert answer.status_code == 201
    with db.begin(api_app) as session:
        held = session.execute(sa.select(PushSubscription.id)).scalar_one()
        delivery_id = record_delivery(session, held, now=NOW)
    return client, {"deliveryId": delivery_id, "event": "shown"}


def test_the_digest_changes_with_a_row_and_only_then(api_app):
    client, receipt = _receipt(api_app)
    digest = TableDigest(api_app.extensions["portal.db"].engine)
    first = digest.take()
    assert digest.take() == first
    assert client.post("/api/push/receipt", json=receipt).status_code == 201
    second = digest.take()
    assert second["delivery_receipt"][0] == first["delivery_receipt"][0] + 1
    assert {t for t in first if first[t] != second[t]} == {"delivery_receipt"}


def test_a_refusal_that_wrote_is_caught(api_app):
    client, receipt = _receipt(api_app)
    guard = Guard(api_app.extensions["portal.db"].engine)
    assert client.post("/api/push/receipt", json=receipt).status_code == 201
    with pytest.raises(AssertionError, match="changed \\['delivery_receipt'\\]"):
        guard.check(422, "application/json", REFUSAL, "a refusal that wrote")


def test_server_errors_and_bad_error_bodies_are_caught(api_app):
    guard = Guard(api_app.extensions["portal.db"].engine)
    with pytest.raises(AssertionError, match="answered 500"):
        guard.check(500, "application/json", REFUSAL, "a crash")
    with pytest.raises(AssertionError, match="as text/html"):
        guard.check(404, "text/html", b"<p>nope</p>", "an HTML error")
    guard.check(200, "application/json", b"{}", "an acceptance")
    guard.check(422, "application/json", REFUSAL, "a clean refusal")
    assert guard.requests == 4


@pytest.mark.parametrize(
    "body",
    [
        {"error": {"code": "x"}},
        {"error": {"code": "x", "message": "m", "extra": 1}},
        {"error": {"code": "x", "message": ""}},
        {"error": "x"},
        {"error": {"code": "x", "message": "m"}, "also": 1},
        [],
    ],
)
def test_error_shape_is_exact(body):
    assert not is_error_shape(body)
    assert is_error_shape({"error": {"code": "x", "message": "m", "field": "f"}})
