"""A notification receipt costs one write transaction with the rate limits on (SPEC §7).

The per-address and per-endpoint counts join the receipt's own transaction
(``portal.ratelimit.count_in_the_request``): one COMMIT for the counts and the receipt,
where there were three (two counter upserts, each committed alone, and the receipt). A
refused receipt writes nothing but its counts, and still counts once; the limits still
refuse past their limit.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from portal.clock import FrozenClock
from portal.config import RateLimitSettings, Settings
from portal.db import db
from tests.conftest import make_settings
from tests.helpers import all_rows, count_rows, record_delivery, subscribe_browser

URL = "/api/push/receipt"
PER_ADDRESS, PER_ENDPOINT = 6, 4


@pytest.fixture
def clock() -> FrozenClock:
    # 12:00:30 in a one-minute window: every request of a test is in one window.
    return FrozenClock(dt.datetime(2026, 3, 2, 12, 0, 30, tzinfo=dt.UTC))


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return make_settings(
        database_url,
        str(tmp_path / "instance"),
        rate_limit=RateLimitSettings(
            window_seconds=60, per_address=PER_ADDRESS, per_endpoint=PER_ENDPOINT
        ),
    )


@pytest.fixture
def sent(app, clock, subscriptions):
    """A subscribed browser's client, its subscription and one delivery sent to it."""
    client = app.test_client()
    sub = subscriptions()
    subscription_id = subscribe_browser(app, client, sub)
    with db.begin(app) as session:
        delivery_id = record_delivery(session, subscription_id, now=clock.now())
    with app.extensions["portal.db"].engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM rate_limit_counter"))  # the subscribe's counts
    return client, sub, delivery_id


@contextmanager
def commits(engine: sa.Engine) -> Iterator[list[int]]:
    seen: list[int] = []

    def count(_connection: object) -> None:
        seen.append(1)

    sa.event.listen(engine, "commit", count)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "commit", count)


def _hits(engine: sa.Engine) -> list[int]:
    return sorted(row["hits"] for row in all_rows(engine, "rate_limit_counter"))


def test_a_receipt_is_one_write_transaction_with_both_limits_on(sent, engine):
    client, sub, delivery_id = sent
    body = {"deliveryId": delivery_id, "event": "shown", "endpoint": sub.endpoint}
    with commits(engine) as seen:
        assert client.post(URL, json=body).status_code == 201
    assert len(seen) == 1  # the two counts and the receipt together
    assert count_rows(engine, "delivery_receipt") == 1
    assert _hits(engine) == [1, 1]  # one request counted per address and per endpoint
    with commits(engine) as seen:
        assert client.post(URL, json=body).status_code == 200  # the same fact again
    assert len(seen) == 1
    assert _hits(engine) == [2, 2]


def test_a_refused_receipt_writes_nothing_but_still_counts_once(app, sent, engine):
    client, sub, delivery_id = sent
    stranger = app.test_client()  # no device cookie, no auth: not the browser it went to
    body = {"deliveryId": delivery_id, "event": "shown", "endpoint": sub.endpoint}
    with commits(engine) as seen:
        assert stranger.post(URL, json=body).status_code == 403
    assert len(seen) == 1  # the counts alone
    assert count_rows(engine, "delivery_receipt") == 0
    assert _hits(engine) == [1, 1]
    bad = {"deliveryId": "not an id", "event": "shown"}
    assert client.post(URL, json=bad).status_code == 422
    assert _hits(engine) == [1, 2]  # the address counted; no endpoint named
    assert count_rows(engine, "delivery_receipt") == 0


def test_the_limits_still_refuse_past_their_limit(app, sent, engine):
    client, sub, delivery_id = sent
    body = {"deliveryId": delivery_id, "event": "clicked", "endpoint": sub.endpoint}
    answers = [client.post(URL, json=body).status_code for _ in range(PER_ENDPOINT + 1)]
    assert answers == [201] + [200] * (PER_ENDPOINT - 1) + [429]
    assert _hits(engine) == [PER_ENDPOINT + 1, PER_ENDPOINT + 1]
    # The address's sixth request names no endpoint and is allowed; its seventh is not.
    plain = {"deliveryId": delivery_id, "event": "shown"}
    answers = [client.post(URL, json=plain).status_code for _ in range(2)]
    assert answers == [201, 429]
    assert _hits(engine) == [PER_ENDPOINT + 1, PER_ADDRESS + 1]
    assert sorted(r["event"] for r in all_rows(engine, "delivery_receipt")) == [
        "clicked",
        "shown",
    ]


def test_a_refusal_answers_even_when_its_counts_cannot_be_written(app, sent, monkeypatch):
    from portal import ratelimit

    def unavailable(_counts):
        raise sa.exc.OperationalError("INSERT", {}, Exception("server closed the connection"))

    monkeypatch.setattr(ratelimit, "_count_alone", unavailable)
    _, sub, delivery_id = sent
    body = {"deliveryId": delivery_id, "event": "shown", "endpoint": sub.endpoint}
    assert app.test_client().post(URL, json=body).status_code == 403
