"""Many requests at once for the same new endpoint end on one row (PostgreSQL)."""

from __future__ import annotations

import threading

import pytest

from tests.helpers import count_rows

pytestmark = pytest.mark.postgres_only


def test_twenty_threads_posting_one_new_subscription(app, engine, subscriptions):
    sub = subscriptions()
    barrier = threading.Barrier(20)
    answers: list[tuple[int, dict]] = []
    lock = threading.Lock()

    def post() -> None:
        client = app.test_client()
        barrier.wait()
        response = client.post("/api/push/subscribe", json={"subscription": sub.to_json()})
        with lock:
            answers.append((response.status_code, response.json))

    threads = [threading.Thread(target=post) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(answers) == 20
    assert sorted(status for status, _ in answers) == [200] * 19 + [201]
    assert len({body["id"] for _, body in answers}) == 1
    assert sum(body["inserted"] for _, body in answers) == 1
    assert count_rows(engine, "push_subscription") == 1
    assert count_rows(engine, "subscriber") == 1  # the racers' spare subscribers are gone
