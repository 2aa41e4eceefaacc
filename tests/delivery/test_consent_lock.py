"""Dispatch writes never wait on a preference save (SPEC §7).

The consent log takes no global lock: an appender's event gets its place from a
sequence and commits on its own, and a preference save locks only its own person's row.
A batch of acceptances appends nothing; a batch with a 410 revokes a subscription with a
consent event. Neither waits while another person's preference save holds its
transaction open, and the log's tree takes the revocation in order once it commits.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa
from flask import Flask

from portal.consent import catalogue
from portal.consent.models import PreferenceState
from portal.consent.preferences import Decision, apply_decisions
from portal.consent.tree import verify_chain
from portal.db import db, uuid7
from portal.delivery.models import Delivery
from portal.subscriptions.models import PushSubscription, Subscriber
from tests.delivery.test_engine import _launch, _rows, _subscribe
from tests.helpers import sequence

pytestmark = pytest.mark.usefixtures("postgres_only")

WAIT = 20.0  # seconds: far longer than any batch of this test takes


@pytest.fixture
def postgres_only(backend):
    if backend != "postgresql":
        pytest.skip("SQLite serialises every writer: only PostgreSQL can show who waits")


@contextmanager
def preference_save_open(app: Flask, clock) -> Iterator[None]:
    """Someone's preference save, its consent event appended and its person's row
    locked, holding its transaction open until the block ends."""
    person = uuid7()
    with db.begin(app) as session:
        session.add(Subscriber(id=person, created_at=clock.now()))
    appended, release = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def save() -> None:
        try:
            with db.begin(app) as session:
                (topic, *_) = catalogue.active_topics(session)
                apply_decisions(
                    session,
                    person,
                    [Decision(topic, PreferenceState.OPT_IN)],
                    source="preference-centre",
                    policy_version="v1",
                    decided_at=clock.now(),
                    recorded_at=clock.now(),
                )
                appended.set()
                release.wait(WAIT * 2)
        except BaseException as error:  # reported by the block's end
            failures.append(error)
            appended.set()

    saver = threading.Thread(target=save, daemon=True)
    saver.start()
    assert appended.wait(WAIT)
    try:
        yield
    finally:
        release.set()
        saver.join(WAIT)
    assert failures == []


def _tick_in_a_thread(dispatcher) -> tuple[threading.Thread, list]:
    reports: list = []
    thread = threading.Thread(target=lambda: reports.append(dispatcher.tick()), daemon=True)
    thread.start()
    return thread, reports


def test_a_batch_of_acceptances_commits_while_a_preference_save_is_open(
    push_app, dispatcher, fake_push, clock, engine
):
    subs = [_subscribe(push_app, fake_push, topics=["weekly-digest"]) for _ in range(3)]
    _launch(push_app, clock)
    with preference_save_open(push_app, clock):
        thread, reports = _tick_in_a_thread(dispatcher)
        thread.join(WAIT)
        # Finished and committed while the save is still open.
        assert not thread.is_alive()
        (report,) = reports
        assert report.accepted == 3
        assert {d["status"] for d in _rows(push_app, Delivery)} == {"accepted"}
    for sub in subs:
        assert len(fake_push.received(sub)) == 1


def test_a_batch_with_a_410_commits_while_a_preference_save_is_open(
    push_app, dispatcher, fake_push, clock, engine
):
    kept = _subscribe(push_app, fake_push, topics=["weekly-digest"])
    gone = _subscribe(push_app, fake_push, topics=["weekly-digest"])
    fake_push.script(gone, 410)
    _launch(push_app, clock)
    with engine.connect() as conn:
        before = conn.execute(sa.text("SELECT count(*) FROM consent_event")).scalar_one()
    with preference_save_open(push_app, clock):
        thread, reports = _tick_in_a_thread(dispatcher)
        thread.join(WAIT)
        assert not thread.is_alive()  # revoked and committed beside the open save
        (report,) = reports
        assert (report.accepted, report.revoked) == (1, 1)
        states = {r["endpoint"]: r["state"] for r in _rows(push_app, PushSubscription)}
        assert states[gone.endpoint] == "revoked"
        assert states[kept.endpoint] == "active"
    with engine.connect() as conn:
        events = conn.execute(sa.text("SELECT kind, context FROM consent_event ORDER BY seq")).all()
    assert len(events) == before + 2  # the revocation and the save, each committed
    revocation = [json.loads(c) for k, c in events if k == "revoked_by_push_service"]
    assert [r["screen"] for r in revocation] == ["dispatch"]
    sequence(push_app)
    with engine.connect() as conn:
        report = verify_chain(conn)
    assert report.ok, report.problem
    assert report.head.tree_size == len(events)


def test_the_open_save_holds_only_its_own_person(push_app, clock, engine):
    """What the save holds: its person's row, not a lock every appender takes."""
    with preference_save_open(push_app, clock), engine.connect() as conn:
        advisory = conn.execute(
            # This database's only: pg_locks lists the whole server's, and the other test
            # workers' databases take advisory locks of their own (job locks, endpoints).
            sa.text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())"
            )
        ).scalar_one()
        other = uuid.uuid4()
        conn.execute(
            sa.text("INSERT INTO subscriber (id, created_at) VALUES (:id, now())"), {"id": other}
        )
        conn.execute(
            sa.text("SELECT id FROM subscriber WHERE id = :id FOR UPDATE NOWAIT"), {"id": other}
        )
        conn.rollback()
    assert advisory == 0
