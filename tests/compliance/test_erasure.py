"""Erasure requested through a compliance officer: confirmation, the erasure, the audit."""

from __future__ import annotations

import json

import sqlalchemy as sa

from portal.consent.tree import verify_chain
from portal.db import db
from portal.subscriptions.models import PushSubscription, Subscriber
from tests.helpers import all_rows


def _audit(engine, action):
    rows = [r for r in all_rows(engine, "staff_audit") if r["action"] == action]
    for row in rows:
        if isinstance(row["detail"], str):
            row["detail"] = json.loads(row["detail"])
    return rows


def _subscriber(app, subscriber_id) -> Subscriber:
    with app.app_context():
        return db.session.get(Subscriber, subscriber_id)


def test_the_confirmation_page_changes_nothing(app, officer, person):
    page = officer.get(f"/staff/compliance/subscribers/{person.subscriber_id}/erase")
    assert page.status_code == 200
    assert "This cannot be undone." in page.text
    assert '<input type="checkbox" id="confirm" name="confirm"' in page.text
    assert _subscriber(app, person.subscriber_id).erased_at is None


def test_erasure_needs_the_box_ticked(app, engine, officer, person):
    response = officer.post(
        f"/staff/compliance/subscribers/{person.subscriber_id}/erase", {"reference": "T-1"}
    )
    assert response.status_code == 422
    assert (
        '<a href="#confirm">Tick the box to confirm the person asked for erasure</a>'
        in response.text
    )
    assert 'aria-invalid="true"' in response.text
    assert _subscriber(app, person.subscriber_id).erased_at is None
    assert _audit(engine, "subscriber.erased") == []


def test_a_crafted_box_value_is_refused_like_any_field(app, engine, officer, person):
    """A checkbox's value is never stored, but a NUL in it is still bad input: refused
    with the field named, and nothing erased."""
    response = officer.post(
        f"/staff/compliance/subscribers/{person.subscriber_id}/erase",
        {"confirm": "a\x00b", "reference": "T-1"},
    )
    assert response.status_code == 422
    assert 'href="#confirm">' in response.text
    assert "must not contain control characters (there is a NUL at character 2)" in (response.text)
    assert _subscriber(app, person.subscriber_id).erased_at is None
    assert _audit(engine, "subscriber.erased") == []


def test_an_officer_erases_a_person(app, engine, clock, officer, person, make_staff):
    response = officer.post(
        f"/staff/compliance/subscribers/{person.subscriber_id}/erase",
        {"confirm": "y", "reference": "TICKET-1234"},
    )
    assert response.status_code == 303
    page = officer.get(response.location).text
    assert "Erased. 1 subscription(s) ended; the consent log records it as event 7." in page
    # The officer downloads the receipt to give to the person who asked.
    link = page.split('href="/preferences/erasure-receipt/')[1].split('"')[0]
    assert page.count(link) == 1  # the link only, never shown as a message
    receipt = app.test_client().get(f"/preferences/erasure-receipt/{link}")
    assert receipt.headers["Content-Disposition"].startswith("attachment")
    body = json.loads(receipt.data)
    assert (body["receipt"], body["consentEventSeq"], body["subscriptionsEnded"]) == (
        "erasure",
        7,
        1,
    )
    assert body["subscriber"].replace("-", "") == str(person.subscriber_id).replace("-", "")
    assert "Download the erasure receipt" not in officer.get(response.location).text  # once
    assert _subscriber(app, person.subscriber_id).erased_at == clock.now()
    with app.app_context():
        sub = db.session.get(PushSubscription, person.subscription_id)
        assert sub.deleted_at is not None
        assert sub.endpoint is None
        event = db.session.execute(
            sa.text("SELECT kind, source, actor, context FROM consent_event WHERE seq = 7")
        ).one()
        officer_id = db.session.execute(
            sa.text("SELECT id FROM staff_user WHERE email = 'officer@example.test'")
        ).scalar_one()
    assert event.kind == "erased"
    assert event.source == "staff"
    assert event.actor.replace("-", "") == f"staff:{officer_id}".replace("-", "")
    assert json.loads(event.context) == {"screen": "staff-console:erase"}
    (row,) = _audit(engine, "subscriber.erased")
    assert row["actor_email"] == "officer@example.test"
    assert row["target"] == f"subscriber:{person.subscriber_id}"
    assert row["detail"] == {"event_seq": 7, "subscriptions_ended": 1, "reference": "TICKET-1234"}
    with engine.connect() as conn:
        assert verify_chain(conn).ok
    # Nothing left to erase.
    again = officer.post(
        f"/staff/compliance/subscribers/{person.subscriber_id}/erase", {"confirm": "y"}
    )
    assert again.status_code == 409
    assert "There is nothing left to erase." in again.text
    assert len(_audit(engine, "subscriber.erased")) == 1


def test_erasing_needs_a_csrf_token(app, officer, person):
    response = officer.client.post(
        f"/staff/compliance/subscribers/{person.subscriber_id}/erase", data={"confirm": "y"}
    )
    assert response.status_code == 400
    assert _subscriber(app, person.subscriber_id).erased_at is None


def test_an_unknown_subscriber_is_404(app, officer):
    url = "/staff/compliance/subscribers/00000000-0000-7000-8000-000000000000/erase"
    assert officer.get(url).status_code == 404
    assert officer.post(url, {"confirm": "y"}).status_code == 404
