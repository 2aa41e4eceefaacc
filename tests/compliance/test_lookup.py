"""The compliance look-up: by external user id, subscriber id or endpoint, and what it shows."""

from __future__ import annotations

import json
import logging
import re
import uuid

import pytest
import sqlalchemy as sa

from portal.campaigns.models import Campaign
from portal.consent import catalogue
from portal.db import db
from portal.delivery.models import Delivery
from portal.retention.services import erase_subscriber
from portal.staff.models import Role
from portal.subscriptions.models import Subscriber
from tests.compliance.conftest import subscribe
from tests.helpers import all_rows, without_cell_labels


def _audit(engine, action):
    rows = [r for r in all_rows(engine, "staff_audit") if r["action"] == action]
    for row in rows:
        if isinstance(row["detail"], str):
            row["detail"] = json.loads(row["detail"])
    return rows


def _set_external_id(app, subscriber_id, value="acct-42"):
    with db.begin(app) as session:
        session.get(Subscriber, subscriber_id).external_user_id = value


def _look_up(officer, kind, value):
    return officer.post("/staff/compliance/lookup", {"kind": kind, "value": value})


def test_the_form_posts_and_defaults_to_the_external_id(app, officer):
    page = officer.get("/staff/compliance/lookup").text
    assert '<form method="post" action="/staff/compliance/lookup"' in page
    assert 'id="kind" name="kind" value="external_user_id" checked' in page
    assert "<legend>Look up by</legend>" in page


@pytest.mark.parametrize("kind", ["external_user_id", "subscriber_id", "endpoint"])
def test_each_key_finds_the_person(app, engine, officer, person, kind):
    _set_external_id(app, person.subscriber_id)
    value = {
        "external_user_id": "acct-42",
        "subscriber_id": str(person.subscriber_id),
        "endpoint": person.sub.endpoint,
    }[kind]
    response = _look_up(officer, kind, value)
    assert response.status_code == 303
    assert response.location.endswith(f"/staff/compliance/subscribers/{person.subscriber_id}")
    (row,) = _audit(engine, "consent.looked_up")
    assert row["actor_email"] == "officer@example.test"
    assert row["target"] == f"subscriber:{person.subscriber_id}"
    assert row["detail"] == {"by": kind, "found": True}
    if kind != "subscriber_id":  # the value searched with is never recorded
        assert value not in json.dumps(all_rows(engine, "staff_audit"), default=str)


def test_an_endpoint_is_found_however_it_is_spelled(app, officer, person):
    endpoint = person.sub.endpoint
    rest = endpoint.removeprefix("https://fcm.googleapis.com")
    spelled = f"HTTPS://FCM.GoogleAPIs.com.:0443{rest}?#from-a-ticket"
    response = _look_up(officer, "endpoint", spelled)
    assert response.status_code == 303
    assert response.location.endswith(f"/staff/compliance/subscribers/{person.subscriber_id}")


def test_a_value_that_is_no_push_endpoint_is_a_form_error(app, engine, officer, person):
    response = _look_up(officer, "endpoint", "not an endpoint")
    assert response.status_code == 422
    assert "A push endpoint is an https:// URL" in response.text
    assert _audit(engine, "consent.looked_up") == []


def _where_it_appears(engine, needle: str) -> list[str]:
    """Every table.column whose text (or bytes) holds ``needle``."""
    found = []
    inspector = sa.inspect(engine)
    tables = {t: [c["name"] for c in inspector.get_columns(t)] for t in inspector.get_table_names()}
    with engine.connect() as conn:
        for table, columns in tables.items():
            for row in conn.execute(sa.text(f'SELECT * FROM "{table}"')).mappings():
                for column in columns:
                    value = row[column]
                    if isinstance(value, memoryview | bytes):
                        value = bytes(value).decode("latin-1")
                    if value is not None and needle in str(value):
                        found.append(f"{table}.{column}")
    return sorted(set(found))


def test_searching_by_endpoint_stores_nothing_of_it(app, engine, officer, person, caplog):
    caplog.set_level(logging.DEBUG)
    stranger = "https://fcm.googleapis.com/fcm/send/never-registered-" + uuid.uuid4().hex
    registered = person.sub.endpoint
    before = _where_it_appears(engine, registered)
    assert before == ["push_subscription.endpoint"]  # the registry, and only there

    missed = _look_up(officer, "endpoint", stranger)
    hit = _look_up(officer, "endpoint", registered)

    assert missed.status_code == 404
    assert "No subscriber has this push endpoint" in missed.text
    assert stranger not in missed.text  # not echoed back into the page either
    assert hit.status_code == 303
    assert registered not in hit.location
    assert _where_it_appears(engine, stranger) == []
    assert _where_it_appears(engine, registered) == before
    assert stranger not in caplog.text and registered not in caplog.text
    assert [r["detail"] for r in _audit(engine, "consent.looked_up")] == [
        {"by": "endpoint", "found": False},
        {"by": "endpoint", "found": True},
    ]


def test_not_found_and_bad_input(app, engine, officer, person):
    missing = _look_up(officer, "external_user_id", "nobody")
    assert missing.status_code == 404
    assert "No subscriber has this external user id" in missing.text
    assert 'value="nobody"' in missing.text  # an id (not an endpoint) is kept for correcting
    bad = _look_up(officer, "subscriber_id", "not-a-uuid")
    assert bad.status_code == 422
    assert '<a href="#value">A subscriber ID looks like' in bad.text
    empty = _look_up(officer, "", "")
    assert empty.status_code == 422
    assert '<a href="#kind">Choose what you are looking up by</a>' in empty.text
    assert officer.get(f"/staff/compliance/subscribers/{uuid.uuid4()}").status_code == 404
    assert [r["detail"]["found"] for r in _audit(engine, "consent.looked_up")] == [False]


def test_the_history_page(app, engine, clock, officer, person):
    with db.begin(app) as session:
        session.get(Subscriber, person.subscriber_id).region_code = "US"
    response = officer.get(f"/staff/compliance/subscribers/{person.subscriber_id}")
    assert response.status_code == 200
    html = response.text
    # The timeline: an ordered list, oldest first, every event with its details.
    timeline = html[html.index('<ol class="timeline">') : html.index("</ol>")]
    items = re.findall(r'<li class="timeline__item" id="event-(\d+)">', timeline)
    assert items == ["1", "2", "3", "4", "5", "6"]
    assert "Notification permission granted" in timeline
    assert "Preference changed: Offers" in timeline
    assert "off (opt-out) → on (opt-in)" in timeline
    assert '<a href="/policy/v1">version v1</a>' in timeline
    assert "<dt>Source</dt><dd>preference-centre</dd>" in timeline
    assert "<dt>Screen</dt><dd>preference-centre</dd>" in timeline
    assert "<dt>Client</dt><dd>Firefox 128</dd>" in timeline
    assert '<time datetime="2026-01-01T00:09:55+00:00">' in timeline  # decided (client)
    assert '<time datetime="2026-01-01T00:10:00+00:00">' in timeline  # recorded (server)
    assert "<dt>By</dt><dd>The person</dd>" in timeline
    # The current state with its reason, reusing the preference centre's rule.
    current = html[html.index('id="current"') : html.index('id="timeline"')]
    assert "Explicit opt-in" in current  # weekly-digest
    assert "Explicit opt-out" in current  # offers
    assert "Transactional: covered by the notification permission grant" in current
    assert "Default off: no decision made" in current  # order-updates
    assert "On by default for account messages, because you allowed notifications." in current
    # Subscriptions with their states, and (none yet) deliveries.
    subscriptions = without_cell_labels(html)
    subscriptions = subscriptions[
        subscriptions.index('id="subscriptions"') : subscriptions.index('id="deliveries"')
    ]
    row = re.search(
        rf'<tr>\s*<th scope="row"><code>{person.subscription_id}</code></th>(.*?)</tr>',
        subscriptions,
        re.S,
    )
    assert row, subscriptions
    cells = re.findall(r"<td>(.*?)</td>", row.group(1), re.S)
    assert cells[1] == "pending"  # push service, state, client, created, last seen, ended
    assert cells[2] == "Firefox 128"
    assert "No deliveries recorded for this person." in html
    assert person.sub.endpoint not in html
    (viewed,) = _audit(engine, "consent.history_viewed")
    assert viewed["target"] == f"subscriber:{person.subscriber_id}"


def test_a_regional_default_is_explained(app, officer, clock, catalogue_ready):
    with db.begin(app) as session:
        someone = Subscriber(created_at=clock.now(), region_code="US")
        session.add(someone)
    html = officer.get(f"/staff/compliance/subscribers/{someone.id}").text
    assert "Default on in the person&#39;s region" in html
    assert "No decision: the topic&#39;s default does not apply in this region" not in html
    with db.begin(app) as session:
        session.get(Subscriber, someone.id).region_code = "EU"
    html = officer.get(f"/staff/compliance/subscribers/{someone.id}").text
    assert "No decision: the topic&#39;s default does not apply in this region" in html


def test_deliveries_each_consent_allowed(app, clock, officer, person):
    with db.begin(app) as session:
        topic = catalogue.topic_by_slug(session, "weekly-digest")
        opt_in_seq = session.execute(
            sa.text("SELECT seq FROM consent_event WHERE topic_id = :t AND new_state = 'opt_in'"),
            {"t": topic.id},
        ).scalar_one()
        campaign = Campaign(
            topic_id=topic.id,
            title="Digest #1",
            body="Hello",
            send_at=clock.now(),
            status="completed",
            created_by="staff:someone",
            created_at=clock.now(),
        )
        session.add(campaign)
        session.flush()
        common = {
            "campaign_id": campaign.id,
            "push_service": "fcm",
            "next_attempt_at": clock.now(),
            "updated_at": clock.now(),
            "attempts": 1,
        }
        session.add(
            Delivery(
                subscription_id=person.subscription_id,
                status="accepted",
                consent_reason="explicit_opt_in",
                consent_event_seq=opt_in_seq,
                **common,
            )
        )
        # A purged subscription of theirs: only the consent event links the delivery.
        session.add(
            Delivery(
                subscription_id=uuid.uuid4(),
                status="failed",
                consent_reason="explicit_opt_in",
                consent_event_seq=opt_in_seq,
                **common,
            )
        )
        # Someone else's delivery never shows.
        session.add(
            Delivery(
                subscription_id=uuid.uuid4(),
                status="accepted",
                consent_reason="default_by_region",
                consent_event_seq=None,
                **common,
            )
        )
    html = officer.get(f"/staff/compliance/subscribers/{person.subscriber_id}").text
    deliveries = without_cell_labels(html)
    deliveries = deliveries[deliveries.index('id="deliveries"') :]
    assert deliveries.count('<th scope="row">Digest #1</th>') == 2
    assert f'<a href="#event-{opt_in_seq}">event #{opt_in_seq}</a>' in deliveries
    assert "default_by_region" not in deliveries
    event = html[html.index(f'id="event-{opt_in_seq}"') :]
    assert '<dt>Deliveries allowed</dt><dd><a href="#deliveries">2</a></dd>' in event


def test_an_erased_person_shows_tombstones_and_no_state(app, clock, officer, person):
    with db.begin(app) as session:
        erase_subscriber(session, person.subscriber_id, now=clock.now())
    html = officer.get(f"/staff/compliance/subscribers/{person.subscriber_id}").text
    assert "<strong>Erased</strong> on 2026-01-01 00:20:00 UTC" in html
    assert "<strong>Tombstone</strong>: revoked, details removed" in html
    assert "the person's choices were removed" in html
    assert "Erase this person's data</a>" not in html
    # Found by endpoint (the tombstone keeps the hash), no longer by the external id.
    assert _look_up(officer, "endpoint", person.sub.endpoint).status_code == 303


def test_staff_actors_are_named(app, clock, officer, person, make_staff):
    staff = make_staff("ann@example.test")
    with db.begin(app) as session:
        erase_subscriber(session, person.subscriber_id, now=clock.now(), actor=f"staff:{staff.id}")
    html = officer.get(f"/staff/compliance/subscribers/{person.subscriber_id}").text
    assert "<dt>By</dt><dd>Staff: ann@example.test</dd>" in html


def test_history_is_limited_and_says_so(app, officer, person, monkeypatch):
    from portal.compliance import services

    monkeypatch.setattr(services, "HISTORY_LIMIT", 4)
    html = officer.get(f"/staff/compliance/subscribers/{person.subscriber_id}").text
    assert "Only the first 4 events are shown" in html


def test_another_subscriber_is_not_mixed_in(app, subscriptions, officer, person):
    other = subscribe(app, subscriptions)
    html = officer.get(f"/staff/compliance/subscribers/{person.subscriber_id}").text
    assert str(other.subscription_id) not in html
    assert html.count('class="timeline__item"') == 6


def test_lookups_are_refused_to_other_roles(app, browser, make_staff):
    make_staff("camp@example.test", Role.CAMPAIGNS)
    other = browser()
    other.sign_in("camp@example.test")
    refused = other.post("/staff/compliance/lookup", {"kind": "endpoint", "value": "x"})
    assert refused.status_code == 403
