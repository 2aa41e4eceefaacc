"""Reliability with real processes (SPEC §6): three dispatching one campaign at once, and
one killed mid-send then replaced.

Each dispatcher is ``flask --app app portal scheduler``, the process that runs the
``dispatch`` job every ``DISPATCH_TICK_SECONDS`` as every web worker does, configured
from the environment alone, against this test's PostgreSQL database and the fake push
service in a child process, which decrypts and records every message it takes.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from flask import Flask

from portal.campaigns import services as campaigns
from portal.campaigns.models import Campaign
from portal.campaigns.services import CampaignDraft
from portal.config import Settings
from portal.db import db, uuid7
from portal.delivery.models import Delivery
from portal.operations.models import JobRun
from portal.seams import current_portal
from portal.subscriptions.models import PushSubscription, Subscriber, SubscriptionState
from portal.subscriptions.validation import endpoint_hash
from tests.factories import BrowserSubscription, SubscriptionFactory
from tests.fakepush import Answer, FakePushProcess, Received, token_of
from tests.support import ROOT, portal_process_environ, stop

log = logging.getLogger(__name__)
pytestmark = [pytest.mark.postgres_only, pytest.mark.slow, pytest.mark.pgbouncer]


# --- the pieces: recipients, a campaign, dispatching processes --------------------------


def populate(
    app: Flask, push: FakePushProcess, count: int, region: str
) -> list[BrowserSubscription]:
    """``count`` browsers subscribed on the fake service, inserted set-based (the
    subscribe API would take minutes for thousands); the service learns their keys."""
    factory = SubscriptionFactory()
    browsers = [factory(base=push.endpoint_base) for _ in range(count)]
    push.register_many(browsers)
    keys = current_portal(app).keys
    now = dt.datetime.now(dt.UTC)
    subscribers, subscriptions = [], []
    for browser in browsers:
        subscriber_id = uuid7()
        sealed = keys.seal(browser.auth)
        subscribers.append({"id": subscriber_id, "region_code": region, "created_at": now})
        subscriptions.append(
            {
                "id": uuid7(),
                "endpoint": browser.endpoint,
                "endpoint_hash": endpoint_hash(browser.endpoint),
                "push_service": "other",
                "p256dh": browser.p256dh,
                "auth_sealed": sealed.sealed,
                "auth_key_version": sealed.key_version,
                "subscriber_id": subscriber_id,
                "origin": "https://portal.example.test",
                "state": SubscriptionState.PENDING,
                "created_at": now,
                "last_seen_at": now,
            }
        )
    with db.begin(app) as session:
        session.execute(sa.insert(Subscriber), subscribers)
        session.execute(sa.insert(PushSubscription), subscriptions)
    return browsers


def launch(app: Flask) -> uuid.UUID:
    """A campaign to everyone the marketing default allows (the US, not the EU), now."""
    draft = CampaignDraft(
        topic="weekly-digest", title="Monday digest", body="Five things this week", url="/news"
    )
    with db.begin(app) as session:
        return campaigns.create_campaign(
            session, draft, created_by="test", now=dt.datetime.now(dt.UTC)
        ).id


def environ(settings: Settings, push: FakePushProcess, tmp_path: Path, **extra: str) -> dict:
    """A dispatching process's whole configuration: this test's database and keys, the
    fake service allowed and its CA trusted, a dispatch tick every second."""
    return portal_process_environ(
        settings,
        tmp_path,
        PUSH_ALLOWED_HOSTS=push.origin.removeprefix("https://"),
        PUSH_CA_BUNDLE=push.ca_bundle,
        DISPATCH_TICK_SECONDS="1",
        **extra,
    )


class Dispatching:
    """One ``portal scheduler`` process, its output in a file."""

    def __init__(self, env: dict, log: Path) -> None:
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "flask", "--app", "app", "portal", "scheduler"],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # stop() ends its whole group
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 120) -> None:
        wait_for(lambda: "scheduler running" in self.output(), timeout, self)

    def kill(self) -> None:
        """SIGKILL: no batch finished, no lease given back, no connection closed cleanly."""
        os.kill(self.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            stop(self.process)


@pytest.fixture
def dispatching() -> Iterator[Callable[..., Dispatching]]:
    started: list[Dispatching] = []

    def start(env: dict, log: Path) -> Dispatching:
        started.append(Dispatching(env, log))
        return started[-1]

    yield start
    # Before the database is emptied: a live process would hold its locks.
    for process in started:
        process.stop()


def wait_for(condition: Callable[[], bool], timeout: float, *watched: Dispatching) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for each in watched:
            if each.process.poll() is not None:
                raise AssertionError(f"dispatcher exited early:\n{each.output()[-3000:]}")
        if time.monotonic() > deadline:
            tails = "\n".join(each.output()[-2000:] for each in watched)
            raise AssertionError(f"still waiting after {timeout} s\n{tails}")
        time.sleep(0.1)


# --- reading the outcome ---------------------------------------------------------------


def status_of(app: Flask, campaign_id: uuid.UUID) -> str:
    with db.begin(app) as session:
        return session.execute(
            sa.select(Campaign.status).where(Campaign.id == campaign_id)
        ).scalar_one()


def deliveries(app: Flask, campaign_id: uuid.UUID) -> dict[str, tuple[int, str, int]]:
    """Endpoint → (delivery id, status, attempts)."""
    with db.begin(app) as session:
        rows = session.execute(
            sa.select(PushSubscription.endpoint, Delivery.id, Delivery.status, Delivery.attempts)
            .join(PushSubscription, PushSubscription.id == Delivery.subscription_id)
            .where(Delivery.campaign_id == campaign_id)
        ).all()
    return {
        endpoint: (delivery_id, status, attempts)
        for endpoint, delivery_id, status, attempts in rows
    }


def status_counts(app: Flask, campaign_id: uuid.UUID) -> Counter[str]:
    with db.begin(app) as session:
        rows = session.execute(
            sa.select(Delivery.status, sa.func.count())
            .where(Delivery.campaign_id == campaign_id)
            .group_by(Delivery.status)
        ).all()
    return Counter(dict(rows))


def messages_by_token(received: list[Received]) -> dict[str, list[dict]]:
    """What each browser could read, in arrival order (every message must decrypt)."""
    found: defaultdict[str, list[dict]] = defaultdict(list)
    for message in received:
        assert (message.status, message.error) == (201, None), message
        assert message.plaintext is not None
        found[message.token].append(json.loads(message.plaintext))
    return found


def dispatch_runs(app: Flask) -> dict[int, list[tuple[int, dt.datetime, dt.datetime]]]:
    """Process id → its dispatch runs (deliveries claimed, start, end), as each process
    recorded them itself."""
    with db.begin(app) as session:
        rows = session.execute(
            sa.select(JobRun.host, JobRun.processed, JobRun.started_at, JobRun.seconds).where(
                JobRun.name == "dispatch"
            )
        ).all()
    runs: defaultdict[int, list[tuple[int, dt.datetime, dt.datetime]]] = defaultdict(list)
    for host, processed, started, seconds in rows:
        end = started + dt.timedelta(seconds=seconds or 0)
        runs[int(host.rpartition(":")[2])].append((processed, started, end))
    return dict(runs)


def most_at_once(runs: dict[int, list[tuple[int, dt.datetime, dt.datetime]]]) -> int:
    """The most processes that were dispatching at the same instant."""
    edges = sorted(
        (instant, step)
        for each in runs.values()
        for _, start, end in each
        for instant, step in ((start, 1), (end, -1))
    )
    busy = peak = 0
    for _, step in edges:  # at a tie, an end (-1) sorts before a start
        busy += step
        peak = max(peak, busy)
    return peak


# --- the tests -------------------------------------------------------------------------


def test_three_processes_dispatching_one_campaign_send_each_recipient_exactly_once(
    catalogue_ready, settings, dispatching, tmp_path
):
    app = catalogue_ready
    # Answers take 0.5 s: a batch of 500 at 64 requests at a time takes at least 4 s, so
    # all three are still sending when the last one joins, and every batch outlasts its
    # 3 s lease: only the lease's renewal keeps the other two from sending it again.
    with FakePushProcess(default_answer=Answer.slow(0.5)) as push:
        eligible = populate(app, push, 5000, region="US")
        excluded = populate(app, push, 100, region="EU")  # no marketing default there
        env = environ(settings, push, tmp_path, DISPATCH_LEASE_SECONDS="3")
        processes = [dispatching(env, tmp_path / f"dispatch-{n}.log") for n in range(3)]
        for process in processes:
            process.wait_ready()
        started = time.monotonic()
        campaign_id = launch(app)
        wait_for(lambda: status_of(app, campaign_id) == "completed", 240, *processes)
        seconds = time.monotonic() - started
        for process in processes:
            process.stop()
        received = push.received()

    rows = deliveries(app, campaign_id)
    assert set(rows) == {b.endpoint for b in eligible}
    assert {status for _, status, _ in rows.values()} == {"accepted"}
    assert {attempts for _, _, attempts in rows.values()} == {1}

    # Exactly one message per eligible browser, carrying its own delivery's id.
    assert len(received) == 5000
    by_token = messages_by_token(received)
    assert set(by_token) == {token_of(b) for b in eligible}
    for browser in eligible:
        (message,) = by_token[token_of(browser)]
        assert message["deliveryId"] == str(rows[browser.endpoint][0])
        assert message["campaignId"] == str(campaign_id)
    assert not {token_of(b) for b in excluded} & set(by_token)

    # The concurrency really happened: every process claimed a share, as each recorded it,
    # the shares add up to the audience (nothing claimed twice), and the processes were
    # sending at the same time.
    runs = dispatch_runs(app)
    claimed = {pid: sum(n for n, _, _ in each) for pid, each in runs.items()}
    log.info(
        "5000 sends in %.1f s; claimed per process: %s; at most %d at once",
        seconds,
        sorted(claimed.values()),
        most_at_once(runs),
    )
    assert set(claimed) <= {p.pid for p in processes}
    assert sum(claimed.values()) == 5000
    assert len([pid for pid, n in claimed.items() if n > 0]) >= 2
    assert most_at_once(runs) >= 2


def test_a_dispatcher_killed_mid_send_and_replaced_repeats_only_what_was_in_flight(
    catalogue_ready, settings, dispatching, tmp_path
):
    app, audience = catalogue_ready, 2000
    # Answers take 0.2 s: a batch of 500 takes over 1.5 s, time to kill the process mid-
    # batch. A 5 s lease lets its successor take the killed process's claims soon after.
    with FakePushProcess(default_answer=Answer.slow(0.2)) as push:
        eligible = populate(app, push, audience, region="US")
        env = environ(settings, push, tmp_path, DISPATCH_LEASE_SECONDS="5")
        campaign_id = launch(app)
        first = dispatching(env, tmp_path / "first.log")

        def mid_send() -> bool:
            # A batch answered and recorded, and the service has taken messages of the
            # next that the database still counts as in flight.
            counts = status_counts(app, campaign_id)
            taken = push.stats()["accepted"]
            return counts["accepted"] > 0 and counts["sending"] > 0 and taken > counts["accepted"]

        wait_for(mid_send, 120, first)
        first.kill()
        at_kill = deliveries(app, campaign_id)
        in_flight = {d for d, status, _ in at_kill.values() if status == "sending"}
        accepted = {d for d, status, _ in at_kill.values() if status == "accepted"}
        assert 0 < len(accepted) < audience
        assert in_flight
        # Whatever the service took from the dead process is recorded once its (slow)
        # answer comes due: wait for every message it took to be on the record.
        time.sleep(0.3)
        wait_for(lambda: len(push.received()) == push.stats()["accepted"], 30)
        before = push.received()

        second = dispatching(env, tmp_path / "second.log")
        wait_for(lambda: status_of(app, campaign_id) == "completed", 240, second)
        second.stop()
        received = push.received()

    # Every eligible browser is reached, and nothing is left queued or sending.
    rows = deliveries(app, campaign_id)
    assert set(rows) == {b.endpoint for b in eligible}
    assert Counter(status for _, status, _ in rows.values()) == {"accepted": audience}
    by_token = messages_by_token(received)
    assert set(by_token) == {token_of(b) for b in eligible}

    # A repeat is only ever the same delivery again, with the very same payload: the
    # service worker shows a delivery id once (static/sw.js, tests/browser).
    for browser in eligible:
        messages = by_token[token_of(browser)]
        assert {m["deliveryId"] for m in messages} == {str(rows[browser.endpoint][0])}
        assert all(m == messages[0] for m in messages)
    sent = Counter(int(m["deliveryId"]) for ms in by_token.values() for m in ms)
    repeated = {delivery for delivery, times in sent.items() if times > 1}
    assert max(sent.values()) == 2

    # Only sends in flight at the kill repeat: exactly those of them the service had
    # already taken from the killed process, which its successor sent again.
    taken_before = {int(json.loads(m.plaintext)["deliveryId"]) for m in before if m.plaintext}
    assert repeated == taken_before & in_flight
    assert 0 < len(repeated) <= len(in_flight)
    assert not repeated & accepted  # a send the database recorded is never repeated
    log.info(
        "killed with %d accepted and %d in flight; %d sent twice",
        len(accepted),
        len(in_flight),
        len(repeated),
    )
    # The successor sent everything the killed process had not finished, once more for
    # the in-flight ones (a second attempt), and nothing else twice.
    attempts = {d: a for d, _, a in rows.values()}
    assert {attempts[d] for d in in_flight} == {2}
    assert {a for d, a in attempts.items() if d not in in_flight} == {1}
    assert len(received) == audience + len(repeated)


def test_three_processes_sending_two_campaigns_to_the_same_people_keep_a_cap_of_one_a_day(
    catalogue_ready, settings, dispatching, tmp_path
):
    """Two campaigns launched at once to the same 1,000 people under a cap of one a
    day, sent by three processes at the same time: each person gets exactly one of them
    (portal/delivery/caps.py), whichever process checks a delivery first."""
    app, audience = catalogue_ready, 1000
    # Answers take 0.2 s: a batch of 500 is out for over a second, so the processes'
    # batches of the two campaigns overlap.
    with FakePushProcess(default_answer=Answer.slow(0.2)) as push:
        people = populate(app, push, audience, region="US")
        env = environ(settings, push, tmp_path, MARKETING_CAP_PER_DAY="1")
        processes = [dispatching(env, tmp_path / f"dispatch-{n}.log") for n in range(3)]
        for process in processes:
            process.wait_ready()
        first, second = launch(app), launch(app)
        wait_for(
            lambda: {status_of(app, first), status_of(app, second)} == {"completed"},
            240,
            *processes,
        )
        for process in processes:
            process.stop()
        received = push.received()

    # Exactly one message per person, never two, never none.
    by_token = messages_by_token(received)
    assert Counter(len(by_token[token_of(b)]) for b in people) == {1: audience}
    assert len(received) == audience
    # Every delivery of both campaigns is on the record: one accepted and one held back
    # by the cap per person.
    with db.begin(app) as session:
        outcomes = Counter(
            session.execute(
                sa.select(Delivery.status, Delivery.reason).where(
                    Delivery.campaign_id.in_([first, second])
                )
            ).all()
        )
    assert outcomes == {("accepted", None): audience, ("skipped", "frequency_cap"): audience}
    # The processes really sent at the same time, and more than one took a share.
    runs = dispatch_runs(app)
    claimed = {pid: sum(n for n, _, _ in each) for pid, each in runs.items()}
    log.info(
        "two campaigns to %d people: claimed per process %s; at most %d at once; "
        "first campaign %s, second %s",
        audience,
        sorted(claimed.values()),
        most_at_once(runs),
        Counter(deliveries_status(app, first)),
        Counter(deliveries_status(app, second)),
    )
    assert len([pid for pid, n in claimed.items() if n > 0]) >= 2
    assert most_at_once(runs) >= 2


def deliveries_status(app: Flask, campaign_id: uuid.UUID) -> list[str]:
    return [status for _, status, _ in deliveries(app, campaign_id).values()]
