"""Dispatch writes wait on the consent log only when they append to it (SPEC §7).

On PostgreSQL the consent log's appenders take one transaction-level advisory lock (the
chain lock) before any other write. Recording a batch of acceptances appends nothing, so
it never takes that lock and never waits behind a preference save holding it; a batch
with a 410 revokes a subscription with a consent event, so it takes the lock first and
waits its turn.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

from portal.consent import log as consent_log
from portal.delivery.models import Delivery
from portal.subscriptions.models import PushSubscription
from tests.delivery.test_engine import _launch, _rows, _subscribe

pytestmark = pytest.mark.usefixtures("postgres_only")

WAIT = 20.0  # seconds: far longer than any batch of this test takes


@pytest.fixture
def postgres_only(backend):
    if backend != "postgresql":
        pytest.skip("the chain lock is a PostgreSQL advisory lock")


@contextmanager
def chain_lock_held(engine: sa.Engine) -> Iterator[None]:
    """Another connection holds the chain lock in an open transaction (as a preference
    save does while it appends), until the block ends."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with engine.connect() as conn, conn.begin():
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(consent_log._CHAIN_LOCK)))
            taken.set()
            release.wait(WAIT * 2)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert taken.wait(WAIT)
    try:
        yield
    finally:
        release.set()
        holder.join(WAIT)


def _waiting_for_the_chain_lock(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND objid = :key"
            ),
            {"key": consent_log._CHAIN_LOCK & 0xFFFFFFFF},
        ).scalar_one()


def _tick_in_a_thread(dispatcher) -> tuple[threading.Thread, list]:
    reports: list = []
    thread = threading.Thread(target=lambda: reports.append(dispatcher.tick()), daemon=True)
    thread.start()
    return thread, reports


def test_a_batch_of_acceptances_commits_while_the_chain_lock_is_held(
    push_app, dispatcher, fake_push, clock, engine
):
    subs = [_subscribe(push_app, fake_push, topics=["weekly-digest"]) for _ in range(3)]
    _launch(push_app, clock)
    with chain_lock_held(engine):
        thread, reports = _tick_in_a_thread(dispatcher)
        thread.join(WAIT)
        # Finished and committed while the lock is still held: it never asked for it.
        assert not thread.is_alive()
        assert _waiting_for_the_chain_lock(engine) == 0
        (report,) = reports
        assert report.accepted == 3
        assert {d["status"] for d in _rows(push_app, Delivery)} == {"accepted"}
    for sub in subs:
        assert len(fake_push.received(sub)) == 1


def test_a_batch_with_a_410_waits_for_the_lock_then_appends_its_event(
    push_app, dispatcher, fake_push, clock, engine
):
    kept = _subscribe(push_app, fake_push, topics=["weekly-digest"])
    gone = _subscribe(push_app, fake_push, topics=["weekly-digest"])
    fake_push.script(gone, 410)
    _launch(push_app, clock)
    with engine.connect() as conn:
        before = conn.execute(sa.text("SELECT count(*) FROM consent_event")).scalar_one()
    with chain_lock_held(engine):
        thread, reports = _tick_in_a_thread(dispatcher)
        deadline = time.monotonic() + WAIT
        while _waiting_for_the_chain_lock(engine) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        # The revoking batch asks for the lock (before its other writes) and waits.
        assert _waiting_for_the_chain_lock(engine) == 1
        assert thread.is_alive()
        assert {d["status"] for d in _rows(push_app, Delivery)} == {"sending"}
    thread.join(WAIT)
    assert not thread.is_alive()
    (report,) = reports
    assert (report.accepted, report.revoked) == (1, 1)
    states = {r["endpoint"]: r["state"] for r in _rows(push_app, PushSubscription)}
    assert states[gone.endpoint] == "revoked"
    assert states[kept.endpoint] == "active"
    with engine.connect() as conn:
        events = conn.execute(sa.text("SELECT kind, context FROM consent_event ORDER BY seq")).all()
    assert len(events) == before + 1
    kind, context = events[-1]
    assert kind == "revoked_by_push_service"
    assert json.loads(context)["screen"] == "dispatch"
    with engine.connect() as conn:
        # The chain still verifies: the event was appended in turn, under the lock.
        assert consent_log.verify_chain(conn).ok
