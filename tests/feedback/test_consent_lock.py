"""A feedback digest takes the consent log's lock only when it can revoke (SPEC §7).

Only a cleanup event (INVALID_TARGET) can end a subscription with a consent event; a
digest of transient events is recorded without the chain lock, so it never waits behind
a preference save holding it.
"""

from __future__ import annotations

import threading

import pytest

from tests.delivery.test_consent_lock import WAIT, chain_lock_held
from tests.feedback.conftest import digest, invalid_target
from tests.helpers import count_rows


@pytest.fixture(autouse=True)
def postgres_only(backend):
    if backend != "postgresql":
        pytest.skip("the chain lock is a PostgreSQL advisory lock")


def _post_in_a_thread(sender, raw: bytes) -> tuple[threading.Thread, list]:
    answers: list = []
    thread = threading.Thread(target=lambda: answers.append(sender.post(raw)), daemon=True)
    thread.start()
    return thread, answers


def test_a_digest_that_cannot_revoke_is_recorded_while_the_lock_is_held(sender, subscribe, engine):
    sub = subscribe()
    transient = {"provider": "webpush", "endpoint": sub.endpoint, "status": "DEAD"}
    raw = digest([transient | {"deliveryId": "d-1", "reason": "TIMEOUT", "attempts": 5}])
    with chain_lock_held(engine):
        thread, answers = _post_in_a_thread(sender, raw)
        thread.join(WAIT)
        assert not thread.is_alive()
        (answer,) = answers
        assert answer.status_code == 200
        assert count_rows(engine, "feedback_digest") == 1


def test_a_digest_that_revokes_waits_for_the_lock(sender, subscribe, engine):
    sub = subscribe()
    with chain_lock_held(engine):
        thread, answers = _post_in_a_thread(
            sender, digest([invalid_target(sub.endpoint, delivery_id="d-2")])
        )
        thread.join(1.0)
        assert thread.is_alive(), (answers[0].status_code, answers[0].json)  # waiting for the lock
        assert count_rows(engine, "feedback_digest") == 0
    thread.join(WAIT)
    (answer,) = answers
    assert (answer.status_code, answer.json["revoked"]) == (200, 1)
