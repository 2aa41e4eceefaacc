"""Issue 13, item 2: spellings of one push resource subscribed → one subscription → one
campaign → exactly one message at the push service for that resource."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from portal.campaigns import services as campaigns
from portal.campaigns.services import CampaignDraft
from portal.db import db
from portal.jobs import run_job
from portal.subscriptions.models import PushSubscription
from tests.fakepush import FakePushService, fake_push_service, token_of
from tests.helpers import all_rows

_t = PushSubscription.__table__


@pytest.fixture
def fake_push() -> Iterator[FakePushService]:
    # Named by a host name, so that the host can be spelled in capitals and with a dot.
    with fake_push_service(host="localhost") as service:
        yield service


def test_spellings_of_one_resource_get_one_message(push_app, dispatcher, fake_push, clock, engine):
    browser = fake_push.subscribe()
    port, path = fake_push.port, f"/push/{token_of(browser)}"
    spellings = [
        f"HTTPS://LocalHost:{port}{path}",
        f"https://localhost:0{port}{path}",
        f"https://localhost:{port}{path}?",
        f"https://localhost:{port}{path}#fragment",
        f"https://localhost.:{port}{path}",
        f"https://localhost:{port}/push/../push/{token_of(browser)}",
        browser.endpoint,
    ]
    client = push_app.test_client()
    answers = []
    for spelling in spellings:
        browser.endpoint = spelling
        answers.append(
            client.post(
                "/api/push/subscribe",
                json={
                    "subscription": browser.to_json(),
                    "topics": ["weekly-digest"],
                    "policyVersion": "v1",
                },
            )
        )

    rows = all_rows(engine, "push_subscription")
    assert [r["endpoint"] for r in rows] == [f"https://localhost:{port}{path}"]
    assert [a.status_code for a in answers] == [201] + [200] * (len(spellings) - 1)

    with db.begin(push_app) as session:
        draft = CampaignDraft(topic="weekly-digest", title="Monday digest", body="Five things")
        campaigns.create_campaign(session, draft, created_by="test", now=clock.now())
    report = dispatcher.tick()

    assert report.accepted == 1
    assert len(fake_push.plaintexts(token_of(browser))) == 1
    assert len(fake_push.received()) == 1


def test_after_the_backfill_a_campaign_sends_one_message_per_resource(
    push_app, dispatcher, fake_push, clock, engine
):
    """Rows stored before endpoints were canonical (one per spelling), a campaign already
    materialised for each: once merged, the resource gets one message, which the browser
    reads with the keys it registered last."""
    token = "resource-stored-three-ways"
    port, path = fake_push.port, f"/push/{token}"
    client = push_app.test_client()
    ids = []
    for n, spelling in enumerate(
        [f"https://localhost:{port}{path}?", f"HTTPS://LOCALHOST:{port}{path}", None]
    ):
        clock.advance(minutes=5)
        browser = fake_push.subscribe(token)  # the browser's keys now: the newest win
        body = {
            "subscription": browser.to_json(),
            "topics": ["weekly-digest"],
            "policyVersion": "v1",
        }
        if spelling is not None:  # stored verbatim, as before, by a row of its own
            body["subscription"]["endpoint"] = f"https://localhost:{port}/push/legacy-{n}"
        response = client.post("/api/push/subscribe", json=body)
        assert response.status_code == 201, response.json
        ids.append(response.json["id"])
        if spelling is not None:
            with engine.begin() as conn:
                conn.execute(
                    sa.update(_t)
                    .where(_t.c.id == uuid.UUID(ids[-1]))
                    .values(
                        endpoint=spelling, endpoint_hash=hashlib.sha256(spelling.encode()).digest()
                    )
                )
    with db.begin(push_app) as session:
        draft = CampaignDraft(topic="weekly-digest", title="Monday digest", body="Five things")
        campaigns.create_campaign(session, draft, created_by="test", now=clock.now())
    dispatcher.advance_campaigns()  # three deliveries queued, one per row
    assert len(all_rows(engine, "delivery")) == 3

    report = run_job(push_app, "canonicalise-endpoints")
    assert report.problems == []
    tick = dispatcher.tick()

    assert (tick.accepted, tick.skipped) == (1, 2)
    assert len(fake_push.plaintexts(token)) == 1
    assert len(fake_push.received()) == 1
    statuses = sorted((d["status"], d["reason"]) for d in all_rows(engine, "delivery"))
    assert statuses == [
        ("accepted", None),
        ("skipped", "subscription_revoked"),
        ("skipped", "subscription_revoked"),
    ]
