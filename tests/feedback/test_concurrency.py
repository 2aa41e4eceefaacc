"""Identical digests arriving at the same instant apply once (PostgreSQL)."""

from __future__ import annotations

import threading

import pytest

from tests.feedback.conftest import Sender, digest, invalid_target
from tests.helpers import all_rows, count_rows

pytestmark = pytest.mark.postgres_only


def _race(app, clock, bodies: list[bytes]) -> list[tuple[int, dict]]:
    barrier = threading.Barrier(len(bodies))
    answers: list[tuple[int, dict]] = []
    lock = threading.Lock()

    def post(raw: bytes) -> None:
        sender = Sender(app.test_client(), clock)
        signature = sender.signature(raw)
        barrier.wait()
        response = sender.post(raw, signature=signature)
        with lock:
            answers.append((response.status_code, response.json))

    threads = [threading.Thread(target=post, args=(raw,)) for raw in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def test_identical_digests_at_the_same_instant_clean_up_once(
    app, client, clock, subscriptions, engine
):
    subs = [subscriptions() for _ in range(3)]
    for sub in subs:
        client.post("/api/push/subscribe", json={"subscription": sub.to_json()})
    at = int(clock.now().timestamp() * 1000)
    raw = digest(
        [invalid_target(subs[0].endpoint, delivery_id="d-0")]
        + [invalid_target(sub.endpoint, at=at) for sub in subs[1:]]
    )

    answers = _race(app, clock, [raw] * 8)

    assert [status for status, _ in answers] == [200] * 8
    assert sum(body["applied"] for _, body in answers) == 3
    assert sum(body["revoked"] for _, body in answers) == 3
    assert sum(body["duplicates"] for _, body in answers) == 3 * 7
    assert count_rows(engine, "feedback_applied") == 3
    events = [r for r in all_rows(engine, "consent_event") if r["kind"] == "revoked_by_feedback"]
    assert len(events) == 3
    assert count_rows(engine, "feedback_digest") == 8


def test_different_pages_naming_the_same_event_apply_it_once(
    app, client, clock, subscriptions, engine
):
    sub = subscriptions()
    client.post("/api/push/subscribe", json={"subscription": sub.to_json()})
    event = invalid_target(sub.endpoint, delivery_id="d-1")
    bodies = [digest([event, {"reason": "TIMEOUT", "page": n}], truncated=True) for n in range(6)]

    answers = _race(app, clock, bodies)

    assert [status for status, _ in answers] == [200] * 6
    assert sorted(body["applied"] for _, body in answers) == [0] * 5 + [1]
    assert count_rows(engine, "feedback_applied") == 1
    events = [r for r in all_rows(engine, "consent_event") if r["kind"] == "revoked_by_feedback"]
    assert len(events) == 1


def test_the_unique_marker_alone_keeps_duplicates_out(app, clock, engine, monkeypatch):
    """No lock serialises the racers (the consent log has no global lock): the marker's
    UNIQUE alone decides."""
    gone = "https://fcm.googleapis.com/fcm/send/unknown-to-us"
    raw = digest([invalid_target(gone, delivery_id=f"d-{n}") for n in range(20)])

    answers = _race(app, clock, [raw] * 8)

    assert [status for status, _ in answers] == [200] * 8
    assert sum(body["applied"] for _, body in answers) == 20
    assert sum(body["duplicates"] for _, body in answers) == 20 * 7
    assert count_rows(engine, "feedback_applied") == 20
