"""Rate limits on the JSON API: per client address, per push endpoint, shared windows."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import sqlalchemy as sa
from flask import Flask

from portal import create_app
from portal.clock import FrozenClock
from portal.config import RateLimitSettings, Settings
from portal.db import db
from portal.jobs import job_names, run_job
from portal.ratelimit import client_network, window_start
from portal.security import CONTENT_SECURITY_POLICY
from portal.subscriptions.models import PushSubscription
from tests.conftest import make_settings
from tests.factories import SubscriptionFactory
from tests.helpers import count_rows, record_delivery

# 12:00:30 inside a one-minute window: 30 seconds left.
START = dt.datetime(2026, 3, 2, 12, 0, 30, tzinfo=dt.UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(START)


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return make_settings(
        database_url,
        str(tmp_path / "instance"),
        rate_limit=RateLimitSettings(window_seconds=60, per_address=5, per_endpoint=3),
    )


def _client(app: Flask, address: str):
    client = app.test_client()
    client.environ_base["REMOTE_ADDR"] = address
    return client


def engine_rows(engine) -> list[tuple[str, str | None]]:
    with engine.connect() as connection:
        return [
            tuple(row)
            for row in connection.execute(
                sa.text("SELECT state, end_reason FROM push_subscription")
            )
        ]


def _assert_limited(response, retry_after: int) -> None:
    assert response.status_code == 429
    assert response.json == {
        "error": {
            "code": "rate_limited",
            "message": f"too many requests: try again in {retry_after} seconds",
        }
    }
    assert response.headers["Retry-After"] == str(retry_after)
    assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY


def test_one_address_is_refused_past_its_limit_until_the_window_ends(app, clock):
    client = _client(app, "198.51.100.7")
    for _ in range(5):
        assert client.get("/api/push/vapid-public-key").status_code == 200
    _assert_limited(client.get("/api/push/vapid-public-key"), 30)
    clock.advance(seconds=20)
    _assert_limited(client.get("/api/push/vapid-public-key"), 10)
    # Another address, and another route for the same address, count on their own.
    assert _client(app, "198.51.100.8").get("/api/push/vapid-public-key").status_code == 200
    assert client.post("/api/push/heartbeat", json={}).status_code == 400
    clock.advance(seconds=10)  # 12:01:00, a new window
    assert client.get("/api/push/vapid-public-key").status_code == 200


def test_the_addresses_of_one_ipv6_network_share_one_budget(app):
    """Counted per /64, the least one home or phone is given: rotating through its
    addresses buys nothing; another /64 counts on its own, an IPv4 address is its own,
    and an IPv4-mapped IPv6 address is that IPv4 address."""
    statuses = [
        _client(app, f"2001:db8:1:2::{n:x}").get("/api/push/vapid-public-key").status_code
        for n in range(1, 7)
    ]
    assert statuses == [200] * 5 + [429]
    assert _client(app, "2001:db8:1:3::1").get("/api/push/vapid-public-key").status_code == 200
    for _ in range(5):
        assert _client(app, "192.0.2.44").get("/api/push/vapid-public-key").status_code == 200
    mapped = _client(app, "::ffff:192.0.2.44").get("/api/push/vapid-public-key")
    assert mapped.status_code == 429


@pytest.mark.parametrize(
    ("address", "counted"),
    [
        ("203.0.113.9", b"203.0.113.9"),
        ("2001:db8:aa:bb:1:2:3:4", b"2001:db8:aa:bb::/64"),
        ("2001:DB8:AA:BB::ffff", b"2001:db8:aa:bb::/64"),
        ("::ffff:203.0.113.9", b"203.0.113.9"),
        ("fe80::1%eth0", b"fe80::/64"),
        (None, b"unknown"),
        ("not an address", b"not an address"),
    ],
)
def test_what_a_client_is_counted_under(address, counted):
    assert client_network(address) == counted


def test_refused_requests_change_nothing(app, clock, engine):
    subscription = SubscriptionFactory()("fcm")
    client = _client(app, "198.51.100.9")
    for index in range(5):
        body = {"subscription": SubscriptionFactory()("fcm").to_json()} if index else {}
        client.post("/api/push/subscribe", json=body)
    _assert_limited(
        client.post("/api/push/subscribe", json={"subscription": subscription.to_json()}), 30
    )
    assert count_rows(engine, "push_subscription") == 4


def test_one_endpoint_is_refused_past_its_limit_from_any_address(app, clock, engine):
    subscription = SubscriptionFactory()("fcm")
    body = {"subscription": subscription.to_json()}
    assert _client(app, "203.0.113.1").post("/api/push/subscribe", json=body).status_code == 201
    heartbeat = {"endpoint": subscription.endpoint}
    for address in ("203.0.113.1", "203.0.113.2", "203.0.113.3"):
        response = _client(app, address).post("/api/push/heartbeat", json=heartbeat)
        assert response.status_code == 200
    _assert_limited(_client(app, "203.0.113.4").post("/api/push/heartbeat", json=heartbeat), 30)
    # Another endpoint is not affected; the same endpoint on another route neither.
    other = SubscriptionFactory()("fcm")
    response = _client(app, "203.0.113.4").post(
        "/api/push/heartbeat", json={"endpoint": other.endpoint}
    )
    assert response.status_code == 200
    receipt = {"deliveryId": "d-1", "event": "shown", "endpoint": subscription.endpoint}
    # Answered on its merits (no such delivery to this browser), not rate-limited.
    assert _client(app, "203.0.113.5").post("/api/push/receipt", json=receipt).status_code == 403
    clock.set(START + dt.timedelta(seconds=30))
    response = _client(app, "203.0.113.4").post("/api/push/heartbeat", json=heartbeat)
    assert response.status_code == 200


def test_strangers_who_know_an_endpoint_cannot_spend_its_browsers_budget(app, clock, engine):
    """Requests from anyone without the subscription's device cookie, past the endpoint's
    limit on every route naming it, leave the browser that holds it free to unsubscribe,
    beat and report, and the strangers still refused."""
    subscription = SubscriptionFactory()("fcm")
    owner = _client(app, "198.51.100.10")
    assert (
        owner.post("/api/push/subscribe", json={"subscription": subscription.to_json()}).status_code
        == 201
    )
    with db.begin(app) as session:
        delivery = record_delivery(
            session, session.scalars(sa.select(PushSubscription.id)).one(), now=START
        )
    routes = {
        "/api/push/receipt": {
            "deliveryId": delivery,
            "event": "shown",
            "endpoint": subscription.endpoint,
        },
        "/api/push/heartbeat": {"endpoint": subscription.endpoint},
        "/api/push/unsubscribe": {"endpoint": subscription.endpoint},
    }
    for path, body in routes.items():
        answers = [
            _client(app, f"203.0.113.{n}").post(path, json=body).status_code for n in range(1, 5)
        ]
        assert answers[-1] == 429, (path, answers)
    for path, body in routes.items():
        assert owner.post(path, json=body).status_code in (200, 201), path
    assert engine_rows(engine) == [("revoked", "unsubscribed")]
    assert (
        _client(app, "203.0.113.9")
        .post("/api/push/heartbeat", json=routes["/api/push/heartbeat"])
        .status_code
        == 429
    )


def test_spellings_of_one_endpoint_share_its_limit(app):
    """Host case, a default port, an empty query or a fragment are one endpoint: writing
    it another way each time does not buy more requests."""
    endpoint = SubscriptionFactory()("fcm").endpoint
    rest = endpoint.removeprefix("https://fcm.googleapis.com")
    spellings = [
        f"HTTPS://FCM.googleapis.com{rest}",
        f"https://fcm.googleapis.com:443{rest}?",
        f"https://fcm.googleapis.com:0443{rest}#x",
        f"https://fcm.googleapis.com.{rest}",
    ]
    statuses = [
        _client(app, f"192.0.2.{n}")
        .post("/api/push/heartbeat", json={"endpoint": spelling})
        .status_code
        for n, spelling in enumerate(spellings, start=1)
    ]
    assert statuses == [200, 200, 200, 429]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/push/unsubscribe", lambda endpoint: {"endpoint": endpoint}),
        (
            "/api/push/preferences",
            lambda endpoint: {
                "endpoint": endpoint,
                "decisions": [],
                "policyVersion": "v1",
                "decidedAt": "2026-03-02T12:00:00Z",
            },
        ),
        (
            "/api/push/receipt",
            lambda endpoint: {"deliveryId": "d-2", "event": "clicked", "endpoint": endpoint},
        ),
    ],
)
def test_every_endpoint_carrying_route_counts_the_endpoint(app, path, body):
    endpoint = SubscriptionFactory()("fcm").endpoint
    statuses = [
        _client(app, f"192.0.2.{n}").post(path, json=body(endpoint)).status_code
        for n in range(1, 5)
    ]
    assert 429 not in statuses[:3]
    assert statuses[3] == 429


def test_zero_turns_the_limits_off(database_url, tmp_path, clock):
    unlimited = create_app(
        make_settings(
            database_url,
            str(tmp_path / "instance"),
            rate_limit=RateLimitSettings(per_address=0, per_endpoint=0),
        ),
        clock=clock,
    )
    try:
        client = _client(unlimited, "198.51.100.7")
        for _ in range(50):
            assert client.get("/api/push/vapid-public-key").status_code == 200
        assert count_rows(unlimited.extensions["portal.db"].engine, "rate_limit_counter") == 0
    finally:
        unlimited.extensions["portal.db"].engine.dispose()


def test_pages_are_not_limited(app):
    client = _client(app, "198.51.100.7")
    for _ in range(10):
        assert client.get("/").status_code == 200


def test_counters_store_no_address(app, engine):
    _client(app, "198.51.100.77").get("/api/push/vapid-public-key")
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT key, hits FROM rate_limit_counter")).all()
    assert len(rows) == 1
    assert len(rows[0].key) == 32
    assert b"198.51.100.77" not in bytes(rows[0].key)


def test_the_prune_job_deletes_ended_windows(app, clock, engine):
    assert "rate-limit-prune" in job_names()
    _client(app, "198.51.100.1").get("/api/push/vapid-public-key")
    clock.advance(seconds=40)  # 12:01:10: the first window has ended
    _client(app, "198.51.100.2").get("/api/push/vapid-public-key")
    assert count_rows(engine, "rate_limit_counter") == 2
    report = run_job(app, "rate-limit-prune")
    assert report.changed == 1
    assert count_rows(engine, "rate_limit_counter") == 1


def test_window_start_aligns_to_the_window():
    assert window_start(START, 60) == dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.UTC)
    assert window_start(START, 3600) == dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.UTC)
    assert window_start(START, 7) == START - dt.timedelta(seconds=(START.timestamp() % 7))


def test_trusted_proxies_decide_which_address_counts(database_url, tmp_path, clock):
    def app_with(proxies: int) -> Flask:
        return create_app(
            make_settings(
                database_url,
                str(tmp_path / "instance"),
                trusted_proxies=proxies,
                rate_limit=RateLimitSettings(per_address=2, per_endpoint=0),
            ),
            clock=clock,
        )

    direct, proxied = app_with(0), app_with(1)
    try:
        # Without a trusted proxy a forged X-Forwarded-For changes nothing.
        client = _client(direct, "10.0.0.1")
        statuses = [
            client.get(
                "/api/push/vapid-public-key", headers={"X-Forwarded-For": f"192.0.2.{n}"}
            ).status_code
            for n in range(3)
        ]
        assert statuses == [200, 200, 429]
        # Behind one proxy, each forwarded client has its own count.
        client = _client(proxied, "10.0.0.2")
        statuses = [
            client.get(
                "/api/push/vapid-public-key", headers={"X-Forwarded-For": f"198.51.100.{n}"}
            ).status_code
            for n in range(3)
        ]
        assert statuses == [200, 200, 200]
    finally:
        direct.extensions["portal.db"].engine.dispose()
        proxied.extensions["portal.db"].engine.dispose()


def test_concurrent_hits_are_each_counted_once(app, engine):
    from concurrent.futures import ThreadPoolExecutor

    from portal.ratelimit import Kind, counter_key, hit

    key = counter_key(b"pepper", Kind.ADDRESS, "route", b"198.51.100.1")

    def five(_: int) -> list[int]:
        counts = []
        for _ in range(5):
            with engine.begin() as connection:
                verdict = hit(connection, key, now=START, window_seconds=60, limit=50)
            counts.append(verdict.hits)
        return counts

    with ThreadPoolExecutor(8) as pool:
        seen = [count for counts in pool.map(five, range(8)) for count in counts]
    assert sorted(seen) == list(range(1, 41))
