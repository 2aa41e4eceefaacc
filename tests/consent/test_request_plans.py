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

import re
import time
from typing import Any

import pytest
import sqlalchemy as sa

from portal.consent.models import ConsentEvent, TopicPreference
from portal.identity import preference_link_token, sign_assertion
from portal.seams import current_portal
from portal.subscriptions.models import PushSubscription
from tests.helpers import confirm_account_link, csrf_token, sent_statements

pytestmark = pytest.mark.postgres_only

PEOPLE = 3000
SECRET = "host-product-secret"
# The tables whose rows grow with the audience.
GROWING = {"subscriber", "push_subscription", "topic_preference", "consent_event"}

# Each table's rows of the one real person, copied for every other person (filler), with
# the columns that must differ between people replaced.
_COPIES: list[tuple[sa.Table, dict[str, str]]] = [
    (
        PushSubscription.__table__,  # type: ignore[list-item]
        {
            "id": "gen_random_uuid()",
            "endpoint": "t.endpoint || '/' || f.id",
            "endpoint_hash": "sha256(convert_to(t.endpoint || '/' || f.id, 'UTF8'))",
            "subscriber_id": "f.id",
        },
    ),
    (TopicPreference.__table__, {"subscriber_id": "f.id"}),  # type: ignore[list-item]
    (
        ConsentEvent.__table__,  # type: ignore[list-item]
        {
            "seq": "nextval('consent_event_seq')",
            "subscriber_id": "f.id",
            "subscription_id": "NULL",
            "prev_hash": "NULL",
            "hash": "NULL",
        },
    ),
]


def _populate(engine: sa.Engine, person: Any) -> None:
    """``PEOPLE`` more people, each with a copy of ``person``'s device, choices and
    events, then the statistics taken, as autovacuum would."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "CREATE TEMPORARY TABLE filler ON COMMIT DROP AS "
                "SELECT gen_random_uuid() AS id FROM generate_series(1, :n)"
            ),
            {"n": PEOPLE},
        )
        conn.execute(
            sa.text(
                "INSERT INTO subscriber (id, region_code, locale, created_at) "
                "SELECT f.id, s.region_code, s.locale, s.created_at FROM filler f "
                "JOIN subscriber s ON s.id = :person"
            ),
            {"person": person},
        )
        for table, replaced in _COPIES:
            columns = [column.name for column in table.columns]
            values = ", ".join(replaced.get(name, f"t.{name}") for name in columns)
            conn.execute(
                sa.text(
                    f"INSERT INTO {table.name} ({', '.join(columns)}) "
                    f"SELECT {values} FROM {table.name} t CROSS JOIN filler f "
                    "WHERE t.subscriber_id = :person"
                ),
                {"person": person},
            )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("ANALYZE"))


def _assertion(subject: str) -> str:
    return sign_assertion({"sub": subject, "exp": time.time() + 60}, SECRET)


# The statements a plan is asked of: queries and writes that read a table.
_PLANNED = re.compile(r"\s*(WITH\b|SELECT\b|UPDATE\b|DELETE\b|INSERT\b.*\bSELECT\b)", re.S | re.I)


def _whole_table_reads(engine: sa.Engine, statements: list[tuple[str, Any]]) -> list[str]:
    """The growing tables each statement's plan reads from end to end."""
    found = []
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        for statement, parameters in statements:
            cursor.execute("EXPLAIN " + statement, parameters)  # planned, never run
            plan = "\n".join(row[0] for row in cursor.fetchall())
            tables = set(re.findall(r"Seq Scan on (\w+)", plan)) & GROWING
            if tables:
                found.append(f"{sorted(tables)} read whole by:\n{statement}\n{plan}")
        raw.rollback()
    finally:
        raw.close()
    return found


@pytest.fixture
def person(app, client, engine, subscriptions, catalogue_ready):
    """A browser's person with one device and a choice saved, among ``PEOPLE`` others."""
    body = {"subscription": subscriptions().to_json(), "topics": ["offers"], "policyVersion": "v1"}
    assert client.post("/api/push/subscribe", json=body).status_code == 201
    with engine.connect() as conn:
        person = conn.execute(sa.text("SELECT id FROM subscriber")).scalar_one()
    _populate(engine, person)
    return person


def test_the_preference_centre_reads_no_growing_table_whole(app, client, engine, person):
    with sent_statements(engine, _PLANNED) as statements:
        page = client.get("/preferences")
        assert page.status_code == 200
        saved = client.post(
            "/preferences",
            data={
                "csrf_token": csrf_token(page.text),
                "policy_version": "v1",
                "visible": ["offers", "weekly-digest"],
                "topics": ["weekly-digest"],
            },
        )
        assert saved.status_code == 303
        with app.test_request_context():
            token = preference_link_token(person)
        visitor = app.test_client()
        assert visitor.get(f"/preferences?token={token}").status_code == 303
        assert "topic-offers" in visitor.get("/preferences").text
    assert len(statements) > 10  # the requests above were seen
    problems = _whole_table_reads(engine, statements)
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
    with sent_statements(engine, _PLANNED) as statements:
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
    problems = _whole_table_reads(engine, statements)
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
    with sent_statements(engine, _PLANNED) as statements:
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
    problems = _whole_table_reads(engine, statements)
    assert not problems, "\n\n".join(problems)
