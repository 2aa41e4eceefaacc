"""A feedback digest never waits on a preference save (SPEC §7): neither one of transient
events nor one whose cleanup revokes a subscription with a consent event."""

from __future__ import annotations

import threading

import pytest

from tests.delivery.test_consent_lock import WAIT, preference_save_open
from tests.feedback.conftest import digest, invalid_target
from tests.helpers import count_rows


@pytest.fixture(autouse=True)
def postgres_only(backend):
    if backend != "postgresql":
        pytest.skip("SQLite serialises every writer: only PostgreSQL can show who waits")


def _post_in_a_thread(sender, raw: bytes) -> tuple[threading.Thread, list]:
    answers: list = []
    thread = threading.Thread(target=lambda: answers.append(sender.post(raw)), daemon=True)
    thread.start()
    return thread, answers


def test_a_digest_of_transient_events_is_recorded_beside_an_open_save(
    catalogue_ready, sender, subscribe, engine, clock
):
    sub = subscribe()
    transient = {"provider": "webpush", "endpoint": sub.endpoint, "status": "DEAD"}
    raw = digest([transient | {"deliveryId": "d-1", "reason": "TIMEOUT", "attempts": 5}])
    with preference_save_open(catalogue_ready, clock):
        thread, answers = _post_in_a_thread(sender, raw)
        thread.join(WAIT)
        assert not thread.is_alive()
        (answer,) = answers
        assert answer.status_code == 200
        assert count_rows(engine, "feedback_digest") == 1


def test_a_digest_that_revokes_is_recorded_beside_an_open_save(
    catalogue_ready, sender, subscribe, engine, clock
):
    sub = subscribe()
    with preference_save_open(catalogue_ready, clock):
        thread, answers = _post_in_a_thread(
            sender, digest([invalid_target(sub.endpoint, delivery_id="d-2")])
        )
        thread.join(WAIT)
        assert not thread.is_alive()
        (answer,) = answers
        assert (answer.status_code, answer.json["revoked"]) == (200, 1)
        assert count_rows(engine, "feedback_digest") == 1
