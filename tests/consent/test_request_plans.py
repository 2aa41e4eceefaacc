"""The preference centre's statements read indexes, not whole tables (PostgreSQL).

A statement that reads a table growing with the audience from end to end costs every
request more with every subscriber: a look-up of "has this identity any device?" that no
index served took 20–100 ms at 116,000 subscriptions and cut the page from 513 to 62
requests a second (bench/beside_campaign.py). Here the tables that grow with the audience
hold a few thousand people, as the planner's statistics say, and every statement sent for
a page, a save, a link visit, a subscribe, an account link and a device's own calls is
planned: none may read one of those tables with a sequential scan.
"""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from portal.identity import preference_link_token, sign_assertion
from portal.seams import current_portal
from tests.helpers import confirm_account_link, save_choices, sent_statements
from tests.plans import PLANNED, populate, whole_table_reads

pytestmark = pytest.mark.postgres_only
SECRET = "host-product-secret"


def _assertion(subject: str) -> str:
    return sign_assertion({"sub": subject, "exp": time.time() + 60}, SECRET)


@pytest.fixture
def person(app, client, engine, subscriptions, catalogue_ready):
    """A browser's person with one device and a choice saved, among ``PEOPLE`` others."""
    body = {"subscription": subscriptions().to_json(), "topics": ["offers"], "policyVersion": "v1"}
    assert client.post("/api/push/subscribe", json=body).status_code == 201
    with engine.connect() as conn:
        person = conn.execute(sa.text("SELECT id FROM subscriber")).scalar_one()
    populate(engine, person)
    return person


def test_the_preference_centre_reads_no_growing_table_whole(app, client, engine, person):
    with sent_statements(engine, PLANNED) as statements:
        page = client.get("/preferences")
        assert page.status_code == 200
        saved = save_choices(
            client, page.text, visible=["offers", "weekly-digest"], topics=["weekly-digest"]
        )
        assert saved.status_code == 303
        with app.test_request_context():
            token = preference_link_token(person)
        visitor = app.test_client()
        assert visitor.get(f"/preferences?token={token}").status_code == 303
        assert "topic-offers" in visitor.get("/preferences").text
    assert len(statements) > 10  # the requests above were seen
    problems = whole_table_reads(engine, statements)
    assert not problems, "\n\n".join(problems)


def test_a_subscribe_and_an_account_link_read_no_growing_table_whole(
    app, client, engine, person, subscriptions
):
    """A second device, then the browser's person merged into an account that another
    browser made: its subscriptions, ended ones included, move over."""
    current_portal(app).settings = current_portal(app).settings.with_overrides(
        identity_assertion_secrets=(SECRET,)
    )
    elsewhere = app.test_client()
    other = {"subscription": subscriptions().to_json(), "topics": ["offers"], "policyVersion": "v1"}
    assert elsewhere.post("/api/push/subscribe", json=other).status_code == 201
    assert confirm_account_link(elsewhere, _assertion("user-7")).status_code == 303
    with sent_statements(engine, PLANNED) as statements:
        device = {
            "subscription": subscriptions().to_json(),
            "topics": ["offers"],
            "policyVersion": "v1",
        }
        assert client.post("/api/push/subscribe", json=device).status_code == 201
        assert confirm_account_link(client, _assertion("user-7")).status_code == 303
    with engine.connect() as conn:
        moved = conn.execute(
            sa.text(
                "SELECT count(*) FROM push_subscription p JOIN subscriber s "
                "ON s.id = p.subscriber_id WHERE s.external_user_id = 'user-7'"
            )
        ).scalar_one()
    assert moved == 3  # the other browser's device and this browser's two
    problems = whole_table_reads(engine, statements)
    assert not problems, "\n\n".join(problems)


def test_a_device_s_own_calls_read_no_growing_table_whole(
    app, client, engine, person, subscriptions, clock
):
    """What a subscribed browser's page and service worker send: its status, a heartbeat,
    preferences by JSON, a rotation of its endpoint, and an unsubscribe."""
    with engine.connect() as conn:
        endpoint = conn.execute(
            sa.text("SELECT endpoint FROM push_subscription WHERE subscriber_id = :p"),
            {"p": person},
        ).scalar_one()
    rotated = subscriptions()
    with sent_statements(engine, PLANNED) as statements:
        assert client.post("/api/push/status", json={"endpoint": endpoint}).status_code == 200
        assert client.post("/api/push/heartbeat", json={"endpoint": endpoint}).status_code == 200
        chosen = {
            "endpoint": endpoint,
            "decisions": [{"slug": "weekly-digest", "state": "opt_in"}],
            "policyVersion": "v1",
            "decidedAt": clock.now().isoformat(),
        }
        assert client.post("/api/push/preferences", json=chosen).status_code == 200
        change = {"oldEndpoint": endpoint, "subscription": rotated.to_json()}
        assert client.post("/api/push/change", json=change).status_code in (200, 201)
        gone = {"endpoint": rotated.endpoint}
        assert client.post("/api/push/unsubscribe", json=gone).status_code == 200
    problems = whole_table_reads(engine, statements)
    assert not problems, "\n\n".join(problems)
