"""Compliance fixtures: a signed-in compliance officer and a person with a consent history."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pytest
from flask import Flask
from flask.testing import FlaskClient

from portal.consent import catalogue
from portal.consent.log import Context
from portal.consent.models import PreferenceState
from portal.consent.preferences import Decision, apply_decisions
from portal.db import db
from portal.staff.models import Role
from tests.factories import BrowserSubscription
from tests.staff.conftest import (  # noqa: F401 - fixtures shared with the staff tests
    Browser,
    _fast_passwords,
    admin_browser,
    browser,
    make_app,
    make_staff,
    settings,
)


@pytest.fixture
def officer(make_staff, browser) -> Browser:  # noqa: F811 - the imported fixtures
    make_staff("officer@example.test", Role.COMPLIANCE)
    signed_in = browser()
    assert signed_in.sign_in("officer@example.test").status_code == 303
    return signed_in


@dataclass
class Person:
    subscriber_id: object
    subscription_id: object
    sub: BrowserSubscription
    client: FlaskClient | None = None  # their browser, its cookies in it


def subscribe(app: Flask, subscriptions, **headers) -> Person:
    client = app.test_client()
    sub = subscriptions()
    response = client.post(
        "/api/push/subscribe",
        json={
            "subscription": sub.to_json(),
            "topics": ["weekly-digest"],
            "policyVersion": "v1",
        },
        headers={"User-Agent": "Mozilla/5.0 Firefox/128.0", **headers},
    )
    assert response.status_code == 201, response.json
    from portal.subscriptions.models import PushSubscription

    with app.app_context():
        row = db.session.get(PushSubscription, __import__("uuid").UUID(response.json["id"]))
        return Person(row.subscriber_id, row.id, sub, client)


@pytest.fixture
def person(app, clock, subscriptions, catalogue_ready) -> Person:
    """Subscribed with weekly-digest on, then changed their mind about offers twice."""
    someone = subscribe(app, subscriptions)
    for state in (PreferenceState.OPT_IN, PreferenceState.OPT_OUT):
        clock.advance(dt.timedelta(minutes=10))
        with db.begin(app) as session:
            apply_decisions(
                session,
                someone.subscriber_id,
                [Decision(catalogue.topic_by_slug(session, "offers"), state)],
                source="preference-centre",
                policy_version="v1",
                decided_at=clock.now() - dt.timedelta(seconds=5),
                recorded_at=clock.now(),
                context=Context(screen="preference-centre", client="Firefox 128"),
            )
    return someone
