"""PostgreSQL stopped and restarted under load: the portal fails cleanly and recovers.

A private PostgreSQL server (never the shared one) backs one app served by a real
threaded HTTP server. Threads keep subscribing through the API, saving the preference
centre's form and loading pages while the server is stopped with ``-m immediate`` (as a
crash would) and started again a few seconds later. The same process must:

- answer every request with success or a clean 503 (the API's JSON error shape, or an
  error page without internals), never a 500, never a hang past a bound;
- serve successes again soon after the restart, without being restarted itself;
- never leave a submission half-applied: each saved form is all of its preference rows
  and consent events or none, and the consent log's hash chain still verifies;
- keep its embedded scheduler running jobs after the outage.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa
from flask import Flask
from werkzeug.serving import make_server

from portal import create_app
from portal.config import RateLimitSettings, ScheduleSettings
from portal.consent import catalogue
from portal.consent.tree import verify_chain
from portal.db import create_engine, db
from portal.identity import SUBSCRIBER_COOKIE, _serializer
from portal.migrate import upgrade
from tests.conftest import ADMIN_DATABASE, TEST_DATABASE, make_settings
from tests.factories import SubscriptionFactory
from tests.helpers import csrf_token
from tests.pgserver import PrivatePgBouncer, PrivatePostgres, postgres_bin

pytestmark = [pytest.mark.postgres_only, pytest.mark.slow, pytest.mark.pgbouncer]

REQUEST_BOUND = 10.0  # seconds any single request may take, outage or not
RECOVERY_BOUND = 15.0  # seconds from the restart to the first success of each kind
WARM_UP = 3.0
DOWN_FOR = 4.0
AFTER = 6.0
SETTLED = 3.0  # after the restart + this, every request must succeed
# pg_ctl returns once the postmaster is gone; a backend may finish what it was sending a
# moment later. Requests started this long after the stop must see the database down.
GRACE = 1.0
MARKETING = ("weekly-digest", "offers", "new-arrivals", "back-in-stock")
ACCOUNT = "security-alerts"
_CHECKBOX = re.compile(r'name="topics" value="([^"]+)"\s*(checked)?')


@dataclass
class Outcome:
    kind: str  # subscribe, preferences, page
    started: float
    seconds: float
    status: int | None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 400


@dataclass
class Ledger:
    outcomes: list[Outcome] = field(default_factory=list)
    # endpoint -> (status, monotonic start)
    subscribes: dict[str, tuple[int | None, float]] = field(default_factory=dict)
    # Per subscriber cookie: saves answered 303 that changed something; saves left
    # unanswered that had committed (when each was first tried); the final state.
    saved: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    in_doubt: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    final_state: dict[str, bool] = field(default_factory=dict)
    mixed_pages: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes.append(outcome)


def _timed(
    ledger: Ledger, kind: str, call: Callable[[], requests.Response]
) -> requests.Response | None:
    started = time.monotonic()
    try:
        answer = call()
    except requests.RequestException as error:
        ledger.record(
            Outcome(kind, started, time.monotonic() - started, None, type(error).__name__)
        )
        return None
    outcome = Outcome(kind, started, time.monotonic() - started, answer.status_code)
    if answer.status_code == 503:
        outcome.problem = _check_503(kind, answer)
    elif not outcome.ok:
        outcome.problem = f"status {answer.status_code}"
    ledger.record(outcome)
    return answer


def _check_503(kind: str, answer: requests.Response) -> str | None:
    """None when the 503 is the clean one; otherwise what is wrong with it."""
    if answer.headers.get("Retry-After") != "30":
        return "503 without Retry-After"
    if kind == "subscribe":
        try:
            body = answer.json()
        except ValueError:
            return "API 503 is not JSON"
        if set(body) != {"error"} or body["error"].get("code") != "unavailable":
            return f"API 503 body {body!r}"
        return None
    if "briefly unavailable" not in answer.text:
        return "503 page is not the unavailable page"
    if any(word in answer.text for word in ("Traceback", "OperationalError", "psycopg")):
        return "503 page shows internals"
    return None


def _marketing_state(html: str) -> bool | None:
    """Whether the marketing topics are on; None (and noted) if they disagree."""
    boxes = {slug: bool(checked) for slug, checked in _CHECKBOX.findall(html)}
    states = {boxes[slug] for slug in MARKETING}
    return states.pop() if len(states) == 1 else None


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    bindir = postgres_bin()
    if bindir is None:
        pytest.fail("no PostgreSQL server binaries (initdb) on this machine")
    server = PrivatePostgres(bindir)
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.remove()


@pytest.fixture
def app_url(private_postgres: PrivatePostgres) -> Iterator[str]:
    """The private server's database, straight or, when the run goes through a pooler
    (PORTAL_TEST_DATABASE_ADMIN), through a PgBouncer of its own in front of it."""
    url = private_postgres.create_database("portal")
    engine = create_engine(url)
    upgrade(engine)
    engine.dispose()
    if ADMIN_DATABASE == TEST_DATABASE:
        yield url
        return
    pooler = PrivatePgBouncer(private_postgres.port)
    try:
        yield pooler.url("portal")
    finally:
        pooler.remove()


@pytest.fixture
def served(app_url: str, tmp_path: Path):
    settings = make_settings(
        app_url,
        str(tmp_path / "instance"),
        scheduler=True,
        database_connect_timeout=2,
        schedule=ScheduleSettings(sweep=1),
        # Three people save as fast as they are answered, hundreds of times in a window:
        # the load is the point here, so RATE_LIMIT_SAVES is off (it has tests of its own).
        rate_limit=RateLimitSettings(per_address=0, per_endpoint=0, saves=0),
    )
    app = create_app(settings)
    now = dt.datetime.now(dt.UTC)
    with db.begin(app) as session:
        catalogue.publish_policy(session, version="v1", text="We send what you choose.", now=now)
        for slug in (ACCOUNT, *MARKETING):
            catalogue.add_topic(
                session,
                slug=slug,
                category="Your account" if slug == ACCOUNT else "Offers",
                label=slug.replace("-", " ").title(),
                transactional=slug == ACCOUNT,
                default_state="opt_in" if slug == ACCOUNT else "opt_out",
                now=now,
            )
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
    )
    thread.start()
    try:
        yield app, f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()
        scheduler = app.extensions.get("portal.scheduler")
        if scheduler is not None:
            scheduler.shutdown()
        app.extensions["portal.db"].engine.dispose()


def _subscriber(base: str, ledger: Ledger, stop: threading.Event) -> None:
    factory = SubscriptionFactory()
    while not stop.is_set():
        subscription = factory()
        with requests.Session() as fresh:  # a new visitor each time
            started = time.monotonic()
            answer = _timed(
                ledger,
                "subscribe",
                lambda fresh=fresh, subscription=subscription: fresh.post(
                    f"{base}/api/push/subscribe",
                    json={"subscription": subscription.to_json()},
                    timeout=REQUEST_BOUND * 2,
                ),
            )
        with ledger.lock:
            ledger.subscribes[subscription.endpoint] = (
                answer.status_code if answer is not None else None,
                started,
            )
        time.sleep(0.02)


def _visitor(
    app: Flask, base: str, ledger: Ledger, stop: threading.Event, ready: threading.Barrier
) -> None:
    """One person saving the preference centre over and over, flipping every marketing
    topic at once. A save that failed is tried again as it was; the answer to the retry
    says whether the failed one had in fact been committed ("Nothing needed to change")."""
    sessions = app.session_interface.get_signing_serializer(app)
    assert sessions is not None
    with requests.Session() as browser:
        answer = browser.post(
            f"{base}/api/push/subscribe",
            json={"subscription": SubscriptionFactory()().to_json()},
            timeout=REQUEST_BOUND,
        )
        assert answer.status_code == 201, answer.text
        me = str(_serializer(SUBSCRIBER_COOKIE, app).loads(browser.cookies[SUBSCRIBER_COOKIE]))
        page = browser.get(f"{base}/preferences", timeout=REQUEST_BOUND)
        token = csrf_token(page.text)
        state = _marketing_state(page.text)
        assert state is False
        failed_at: float | None = None  # start of the first unanswered save of this target
        ready.wait()
        while not stop.is_set() or failed_at is not None:
            target = not state
            started = time.monotonic()
            answer = _timed(
                ledger,
                "preferences",
                lambda target=target: browser.post(
                    f"{base}/preferences",
                    data={
                        "csrf_token": token,
                        "policy_version": "v1",
                        "visible": [ACCOUNT, *MARKETING],
                        "topics": [ACCOUNT, *(MARKETING if target else ())],
                    },
                    allow_redirects=False,
                    timeout=REQUEST_BOUND * 2,
                ),
            )
            if answer is None or answer.status_code != 303:
                failed_at = started if failed_at is None else failed_at
                time.sleep(0.05)
                continue
            # The flash message travels in the signed session cookie of the redirect.
            flashes = sessions.loads(answer.cookies["session"])["_flashes"]
            message = flashes[-1][1]
            if "Nothing needed to change" in message:
                assert failed_at is not None, "a save changed nothing with no failure before it"
                ledger.in_doubt[me].append(failed_at)
            else:
                ledger.saved[me] += 1
            state, failed_at = target, None
            time.sleep(0.02)
        page = browser.get(f"{base}/preferences", timeout=REQUEST_BOUND)
        if _marketing_state(page.text) is None:
            ledger.mixed_pages.append(me)
        ledger.final_state[me] = bool(state)


def _reader(base: str, ledger: Ledger, stop: threading.Event) -> None:
    with requests.Session() as browser:
        while not stop.is_set():
            _timed(ledger, "page", lambda: browser.get(f"{base}/", timeout=REQUEST_BOUND * 2))
            time.sleep(0.02)


def _guarded(target: Callable[..., None], errors: list[BaseException]) -> Callable[..., None]:
    def run(*args: object) -> None:
        try:
            target(*args)
        except BaseException as error:  # reported by the test, not lost in the thread
            errors.append(error)

    return run


def test_postgres_restart_under_load(served, private_postgres: PrivatePostgres, caplog):
    app, base = served
    ledger = Ledger()
    stop = threading.Event()
    errors: list[BaseException] = []
    visitors = 3
    ready = threading.Barrier(visitors + 1)
    threads = [
        threading.Thread(target=_guarded(_visitor, errors), args=(app, base, ledger, stop, ready))
        for _ in range(visitors)
    ]
    threads += [
        threading.Thread(target=_guarded(_subscriber, errors), args=(base, ledger, stop))
        for _ in range(2)
    ]
    threads.append(threading.Thread(target=_guarded(_reader, errors), args=(base, ledger, stop)))
    for thread in threads:
        thread.start()
    ready.wait(timeout=60)

    time.sleep(WARM_UP)
    private_postgres.stop("immediate")
    down_at = time.monotonic()
    time.sleep(DOWN_FOR)
    # The server accepts connections a little before pg_ctl sees it ready and returns.
    restart_at = time.monotonic()
    private_postgres.start()
    up_at = time.monotonic()
    up_wall = dt.datetime.now(dt.UTC)
    time.sleep(AFTER)
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)

    outcomes = ledger.outcomes
    kinds = ("subscribe", "preferences", "page")
    # Load ran in every phase.
    for kind in kinds:
        mine = [o for o in outcomes if o.kind == kind]
        assert any(o.ok and o.started + o.seconds < down_at for o in mine), kind
        assert any(down_at <= o.started < up_at for o in mine), kind
    # Nothing but success or the clean 503: no 500, no dropped connection, no hang.
    bad = [o for o in outcomes if not o.ok and (o.status != 503 or o.problem)]
    # What was answered 500 is logged with its traceback: by Flask ("Exception on …"), or
    # by the server when it escaped the app (a failing teardown).
    failures = [
        logging.Formatter().format(r)
        for r in caplog.records
        if r.name in ("portal", "werkzeug") and r.levelno >= logging.ERROR
    ]
    assert not bad, (bad[:10], failures[:3])
    assert not failures, failures[:3]
    slow = [o for o in outcomes if o.seconds > REQUEST_BOUND]
    assert not slow, slow[:10]
    # While the server was down, nothing succeeded.
    assert not [
        o
        for o in outcomes
        if o.ok and down_at + GRACE <= o.started and o.started + o.seconds < restart_at
    ]
    assert any(o.status == 503 for o in outcomes if o.kind == "subscribe")
    assert any(o.status == 503 for o in outcomes if o.kind == "preferences")
    # The same process recovers, promptly, and stays recovered.
    for kind in kinds:
        first = min(
            (
                o.started + o.seconds
                for o in outcomes
                if o.kind == kind and o.ok and o.started >= up_at
            ),
            default=None,
        )
        assert first is not None, f"no {kind} succeeded after the restart"
        assert first - up_at <= RECOVERY_BOUND, (kind, first - up_at)
    late = [o for o in outcomes if o.started >= up_at + SETTLED]
    assert late
    assert all(o.ok for o in late), [o for o in late if not o.ok][:10]

    assert not ledger.mixed_pages, "a page showed a half-applied submission"
    engine = create_engine(private_postgres.url("portal"), poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as connection:
            _check_preferences(connection, ledger, down_at)
            _check_subscriptions(connection, ledger, down_at)
            report = verify_chain(connection)
            assert report.ok, report.problem
            assert report.events > 0
            runs = connection.execute(
                sa.text("SELECT started_at, error FROM job_run WHERE name = 'sweep'")
            ).all()
    finally:
        engine.dispose()
    # The scheduler ran before the outage and resumed after it, in this same process.
    assert any(r.started_at < up_wall for r in runs)
    assert any(r.started_at >= up_wall and r.error is None for r in runs)


def _check_preferences(connection: sa.Connection, ledger: Ledger, down_at: float) -> None:
    """Each saved form is complete: one event per marketing topic, all one way, and the
    stored preferences agree with the last of them. Unanswered saves wrote nothing,
    unless they were already committing when the server went down."""
    cookies = list(ledger.final_state)
    assert len(cookies) == 3
    rows = connection.execute(
        sa.text(
            "SELECT e.seq, e.subscriber_id, e.recorded_at, e.previous_state, e.new_state, "
            "t.slug FROM consent_event AS e JOIN topic AS t ON t.id = e.topic_id "
            "WHERE e.kind = 'preference_changed' ORDER BY e.seq"
        )
    ).all()
    groups: dict[tuple[object, object], list[sa.Row]] = defaultdict(list)
    for row in rows:
        groups[(row.subscriber_id, row.recorded_at)].append(row)
    by_subscriber: dict[object, list[list[sa.Row]]] = defaultdict(list)
    for (subscriber, _), events in groups.items():
        assert sorted(e.slug for e in events) == sorted(MARKETING), events
        assert len({(e.previous_state, e.new_state) for e in events}) == 1, events
        by_subscriber[subscriber].append(events)
    assert {str(s) for s in by_subscriber} == set(cookies)
    for subscriber, saves in by_subscriber.items():
        me = str(subscriber)
        assert len(saves) == ledger.saved[me] + len(ledger.in_doubt[me]), me
    for in_doubt in ledger.in_doubt.values():
        # A save that started once the server was down cannot have committed.
        assert all(started < down_at + GRACE for started in in_doubt)
    for subscriber, saves in by_subscriber.items():
        last = saves[-1]
        stored = dict(
            connection.execute(
                sa.text(
                    "SELECT t.slug, p.state || ':' || p.event_seq FROM topic_preference AS p "
                    "JOIN topic AS t ON t.id = p.topic_id WHERE p.subscriber_id = :s"
                ),
                {"s": subscriber},
            ).all()
        )
        assert stored == {e.slug: f"{e.new_state}:{e.seq}" for e in last}
        final = "opt_in" if ledger.final_state[str(subscriber)] else "opt_out"
        assert {e.new_state for e in last} == {final}
    assert sum(ledger.saved.values()) > 0


def _check_subscriptions(connection: sa.Connection, ledger: Ledger, down_at: float) -> None:
    """Every subscription row came with its two consent events; every accepted one is
    stored; one refused after the server was down is not."""
    stored = {
        row.endpoint: (row.grant_event_seq, row.events)
        for row in connection.execute(
            sa.text(
                "SELECT s.endpoint, s.grant_event_seq, "
                "(SELECT count(*) FROM consent_event AS e WHERE e.subscription_id = s.id "
                " AND e.kind IN ('permission_granted', 'subscribed')) AS events "
                "FROM push_subscription AS s"
            )
        )
    }
    for endpoint, (grant, events) in stored.items():
        assert grant is not None and events == 2, endpoint
    accepted = [e for e, (status, _) in ledger.subscribes.items() if status in (200, 201)]
    assert accepted
    assert all(e in stored for e in accepted)
    refused_while_down = [
        e
        for e, (status, started) in ledger.subscribes.items()
        if status != 201 and started >= down_at + GRACE
    ]
    assert refused_while_down
    assert not [e for e in refused_while_down if e in stored]
