"""The app the API tests and the fuzzing run against, and the data they start from.

The app is the shared ``app`` fixture (test settings, rate limits off) on a clock frozen
at ``NOW``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from flask import Flask

from portal.clock import FrozenClock
from portal.config import b64url_encode
from tests.conftest import TOPICS, publish_test_catalogue

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
POLICY = "v1"
ENDPOINT_BASE = "https://fcm.googleapis.com/fcm/send/"


def p256dh_of(secret: int) -> str:
    """A real P-256 public key, the same every run."""
    key = ec.derive_private_key(secret, ec.SECP256R1()).public_key()
    return b64url_encode(
        key.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    )


P256DH_KEYS = [p256dh_of(n) for n in (11, 12, 13)]
AUTH = b64url_encode(b"\x07" * 16)


def subscription(token: str, *, key: int = 0, expiration: float | None = None) -> dict[str, Any]:
    return {
        "endpoint": ENDPOINT_BASE + token,
        "expirationTime": expiration,
        "keys": {"p256dh": P256DH_KEYS[key % len(P256DH_KEYS)], "auth": AUTH},
    }


@dataclass(frozen=True)
class World:
    """What exists before the first fuzzed request: topics, a policy, subscriptions."""

    endpoints: tuple[str, ...]
    topics: tuple[str, ...]
    policy: str


_FUZZ_REPORT: list[str] = []


@pytest.fixture
def fuzz_report() -> list[str]:
    """Lines (requests, time, statuses per fuzz test) shown at the end of the run."""
    return _FUZZ_REPORT


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _FUZZ_REPORT:
        terminalreporter.section("API fuzzing")
        for line in _FUZZ_REPORT:
            terminalreporter.write_line(line)
        total = sum(int(line.split(": ", 1)[1].split()[0]) for line in _FUZZ_REPORT)
        terminalreporter.write_line(f"total: {total} requests")


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(NOW)


@pytest.fixture
def api_clock(clock: FrozenClock) -> FrozenClock:
    return clock


@pytest.fixture
def api_app(app: Flask) -> Flask:
    return app


@pytest.fixture
def world(api_app: Flask) -> World:
    """Four topics, policy v1, and three subscriptions (one revoked) made through the API."""
    publish_test_catalogue(api_app, NOW)
    client = api_app.test_client()
    endpoints = []
    for index, token in enumerate(("seed-one", "seed-two", "seed-three")):
        sub = subscription(token, key=index)
        answer = client.post(
            "/api/push/subscribe",
            json={"subscription": sub, "topics": ["offers"], "policyVersion": POLICY},
        )
        assert answer.status_code == 201, answer.json
        endpoints.append(sub["endpoint"])
    assert client.post("/api/push/unsubscribe", json={"endpoint": endpoints[2]}).status_code == 200
    # The consent log's events are in a signed tree: its routes have heads and proofs to give.
    from portal.consent.jobs import sequence_once

    sequence_once(api_app)
    return World(tuple(endpoints), tuple(t[0] for t in TOPICS), POLICY)
