"""POST /api/push/receipt: the service worker's display and click reports."""

from __future__ import annotations

import hashlib
import uuid

import pytest

from tests.helpers import all_rows, count_rows

DELIVERY = str(uuid.UUID(int=7))


def test_a_shown_receipt_is_recorded_once(client, engine, clock):
    endpoint = "https://fcm.googleapis.com/fcm/send/abc"
    body = {"deliveryId": DELIVERY, "event": "shown", "endpoint": endpoint}
    first = client.post("/api/push/receipt", json=body)
    assert first.status_code == 201
    assert first.json == {"deliveryId": DELIVERY, "event": "shown", "recorded": True}
    again = client.post("/api/push/receipt", json=body)
    assert again.status_code == 200
    assert again.json["recorded"] is False
    (row,) = all_rows(engine, "delivery_receipt")
    assert row["delivery_id"] == DELIVERY
    assert row["event"] == "shown"
    assert bytes(row["endpoint_hash"]) == hashlib.sha256(endpoint.encode()).digest()


def test_shown_and_clicked_are_separate_facts(client, engine):
    for event in ("shown", "clicked", "clicked"):
        assert client.post(
            "/api/push/receipt", json={"deliveryId": DELIVERY, "event": event}
        ).status_code in (200, 201)
    rows = all_rows(engine, "delivery_receipt")
    assert sorted(r["event"] for r in rows) == ["clicked", "shown"]
    assert all(r["endpoint_hash"] is None for r in rows)


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"event": "shown"}, 400, "deliveryId"),
        ({"deliveryId": 7, "event": "shown"}, 400, "deliveryId"),
        ({"deliveryId": "not an id!", "event": "shown"}, 422, "deliveryId"),
        ({"deliveryId": "x" * 65, "event": "shown"}, 422, "deliveryId"),
        ({"deliveryId": DELIVERY}, 400, "event"),
        ({"deliveryId": DELIVERY, "event": "accepted"}, 422, "event"),
        ({"deliveryId": DELIVERY, "event": "shown", "endpoint": 3}, 400, "endpoint"),
        ({"deliveryId": DELIVERY, "event": "shown", "endpoint": "e" * 5000}, 422, "endpoint"),
    ],
)
def test_bad_receipts_are_refused_and_write_nothing(client, engine, body, status, field):
    response = client.post("/api/push/receipt", json=body)
    assert response.status_code == status
    assert response.json["error"]["field"] == field
    assert count_rows(engine, "delivery_receipt") == 0


def test_receipts_obey_the_api_rules(client, engine, settings):
    not_json = client.post("/api/push/receipt", data="deliveryId=1", content_type="text/plain")
    assert not_json.status_code == 415
    big = "x" * (settings.api_max_body_bytes + 1)
    too_big = client.post("/api/push/receipt", data=big, content_type="application/json")
    assert too_big.status_code == 413
    cross = client.post(
        "/api/push/receipt",
        json={"deliveryId": DELIVERY, "event": "shown"},
        headers={"Origin": "https://elsewhere.example"},
    )
    assert cross.status_code == 403
    assert count_rows(engine, "delivery_receipt") == 0
