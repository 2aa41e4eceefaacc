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
    if kind == "endpoint":
        return officer.post("/staff/compliance/lookup", {"endpoint": value})
    return officer.get("/staff/compliance/lookup", query_string={"q": value})


def test_the_search_is_a_get_form_and_the_endpoint_form_posts(app, officer):
    page = officer.get("/staff/compliance/lookup")
    assert page.status_code == 200
    assert '<form method="get" action="/staff/compliance/lookup"' in page.text
    assert '<input id="q" name="q" type="text"' in page.text
    assert '<form method="post" action="/staff/compliance/lookup"' in page.text
    assert "Results" not in page.text


def _history_links(html: str) -> list[str]:
    return re.findall(r'href="/staff/compliance/subscribers/([0-9a-f-]{36})"', html)


@pytest.mark.parametrize("kind", ["external_user_id", "subscriber_id"])
def test_an_id_finds_the_person_in_the_results(app, engine, officer, person, kind):
    _set_external_id(app, person.subscriber_id)
    value = {"external_user_id": "acct-42", "subscriber_id": str(person.subscriber_id)}[kind]
    response = _look_up(officer, kind, value)
    assert response.status_code == 200
    assert _history_links(response.text) == [str(person.subscriber_id)]
    assert "Showing 1–1 of 1 person" in response.text
    label = {"external_user_id": "Account ID", "subscriber_id": "Subscriber ID"}[kind]
    assert f'<td data-label="Matched by">{label}</td>' in response.text
    (row,) = _audit(engine, "consent.looked_up")
    assert row["actor_email"] == "officer@example.test"
    assert row["target"] == f"subscriber:{person.subscriber_id}"
    assert row["detail"] == {"by": "search", "found": 1, "page": 1}
    if kind == "external_user_id":  # the value searched with is never recorded
        assert value not in json.dumps(all_rows(engine, "staff_audit"), default=str)


def test_an_endpoint_goes_straight_to_the_person(app, engine, officer, person):
    response = _look_up(officer, "endpoint", person.sub.endpoint)
    assert response.status_code == 303
    assert response.location.endswith(f"/staff/compliance/subscribers/{person.subscriber_id}")
    (row,) = _audit(engine, "consent.looked_up")
    assert row["target"] == f"subscriber:{person.subscriber_id}"
    assert row["detail"] == {"by": "endpoint", "found": True}
    assert person.sub.endpoint not in json.dumps(all_rows(engine, "staff_audit"), default=str)


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
    assert '<a href="#endpoint">A push endpoint is an https:// URL' in response.text
    assert _audit(engine, "consent.looked_up") == []


def test_an_endpoint_in_the_search_box_is_sent_to_its_own_form(app, engine, officer, person):
    response = _look_up(officer, "subscriber_id", person.sub.endpoint)
    assert response.status_code == 422
    assert "use the endpoint form" in response.text
    assert person.sub.endpoint not in response.text  # not echoed back into the page
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
    assert missing.status_code == 200
    assert "Nobody matches “nobody”." in missing.text
    assert 'value="nobody"' in missing.text  # kept in the box for correcting
    short = _look_up(officer, "external_user_id", "ab")
    assert short.status_code == 422
    assert '<a href="#q">No account ID is exactly “ab”. To search by the start' in short.text
    empty = _look_up(officer, "external_user_id", "")
    assert empty.status_code == 422
    assert '<a href="#q">Enter a reference, an account ID or its start' in empty.text
    assert officer.get(f"/staff/compliance/subscribers/{uuid.uuid4()}").status_code == 404
    assert [r["detail"]["found"] for r in _audit(engine, "consent.looked_up")] == [0]


@pytest.mark.parametrize(
    ("query", "status", "words"),
    [
        ({"q": "acct", "page": "0"}, 400, "The page is a whole number from 1"),
        ({"q": "acct", "page": "-1"}, 400, "The page is a whole number from 1"),
        ({"q": "acct", "page": "abc"}, 400, "The page is a whole number from 1"),
        ({"q": "acct", "page": "9" * 40}, 400, "The page is a whole number from 1"),
        ({"q": "acct", "page": "2"}, 404, "There is no page 2: this search has 1 page"),
        ({"q": "acct\x00x"}, 422, "must not contain control characters"),
        ({"q": "acct", "page": "1\x00"}, 422, "must not contain control characters"),
        ({"page": "2"}, 422, "Enter a reference"),
        ({"q": "x" * 5000}, 422, "at most 4096 characters"),
    ],
)
def test_bad_search_input_is_refused_and_writes_nothing(
    app, engine, officer, person, query, status, words
):
    _set_external_id(app, person.subscriber_id)
    before = all_rows(engine, "staff_audit")
    response = officer.get("/staff/compliance/lookup", query_string=query)
    assert response.status_code == status
    assert words in response.text
    assert '<div class="error-summary"' in response.text
    assert all_rows(engine, "staff_audit") == before


def test_a_reference_from_the_preference_centre_finds_the_person(app, officer, person):
    centre = person.client.get("/preferences").text
    shown = re.search(r'Your reference: <strong class="reference">([0-9A-Z-]{9})</strong>', centre)
    assert shown is not None
    response = _look_up(officer, "reference", shown.group(1).lower().replace("-", " "))
    assert _history_links(response.text) == [str(person.subscriber_id)]
    assert '<td data-label="Matched by">Reference</td>' in response.text
    assert f"<code>{shown.group(1)}</code>" in response.text
    history = officer.get(f"/staff/compliance/subscribers/{person.subscriber_id}").text
    assert f"<dt>Reference</dt><dd><code>{shown.group(1)}</code></dd>" in history
    # The same reference on every visit.
    assert shown.group(1) in person.client.get("/preferences").text


def test_results_paginate_with_links_that_keep_the_search(app, officer):
    from tests.factories import make_subscriber

    with db.begin(app) as session:
        for n in range(1, 58):
            make_subscriber(session, f"shop_{n:03d}")
        make_subscriber(session, "shopX001")  # '_' is no wildcard
    first = _look_up(officer, "external_user_id", "shop_")
    assert "Showing 1–20 of 57 people" in first.text
    assert 'href="/staff/compliance/lookup?q=shop_&amp;page=2" rel="next"' in first.text
    assert 'rel="prev"' not in first.text
    second = officer.get("/staff/compliance/lookup?q=shop_&page=2")
    assert "Showing 21–40 of 57 people" in second.text
    assert 'href="/staff/compliance/lookup?q=shop_&amp;page=1" rel="prev"' in second.text
    assert 'href="/staff/compliance/lookup?q=shop_&amp;page=3" rel="next"' in second.text
    last = officer.get("/staff/compliance/lookup?q=shop_&page=3")
    assert "Showing 41–57 of 57 people" in last.text
    assert 'rel="next"' not in last.text
    assert "shopX001" not in first.text + second.text + last.text


def test_an_erasure_receipt_id_finds_the_erased_person(app, clock, officer, person):
    with db.begin(app) as session:
        receipt = erase_subscriber(session, person.subscriber_id, now=clock.now())
    response = _look_up(officer, "receipt", receipt.receipt_id.lower())
    assert response.status_code == 200
    assert _history_links(response.text) == [str(person.subscriber_id)]
    assert '<td data-label="Matched by">Erasure receipt ID</td>' in response.text
    assert "Erased on 2026-01-01 00:20:00 UTC" in response.text
    history = officer.get(f"/staff/compliance/subscribers/{person.subscriber_id}").text
    assert f"<dt>Erasure receipt ID</dt><dd><code>{receipt.receipt_id}</code></dd>" in history


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
    assert "No deliveries on record for this person." in html
    assert (
        "Each delivery is kept until 13 months after its campaign finished; after that it "
        "is only counted with its campaign, not listed here."
    ) in html
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


@pytest.mark.parametrize("role", [Role.CAMPAIGNS, Role.ADMIN])
def test_lookups_are_refused_to_other_roles(app, engine, browser, make_staff, person, role):
    make_staff("other@example.test", role)
    other = browser()
    other.sign_in("other@example.test")
    assert other.get("/staff/compliance/lookup").status_code == 403
    searched = other.get("/staff/compliance/lookup", query_string={"q": str(person.subscriber_id)})
    assert searched.status_code == 403
    assert str(person.subscriber_id) not in searched.text
    refused = other.post("/staff/compliance/lookup", {"endpoint": person.sub.endpoint})
    assert refused.status_code == 403
    assert _audit(engine, "consent.looked_up") == []
    stranger = app.test_client().get("/staff/compliance/lookup?q=acct")
    assert stranger.status_code == 302  # to sign-in
