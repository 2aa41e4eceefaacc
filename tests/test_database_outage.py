"""A database the app cannot reach: clean 503s, then recovery in the same process.

The outage here is real, not simulated: the app's database file lives in a folder that
does not exist yet, so every connection attempt fails inside the driver (SQLite's
"unable to open database file", an ``OperationalError``) exactly as a PostgreSQL server
that is down does. Creating the folder and migrating ends the outage. The PostgreSQL
version, with a server stopped and restarted under load, is ``test_fault_injection.py``.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import flask
import pytest
import sqlalchemy as sa
from flask_wtf.csrf import generate_csrf

from portal import create_app
from portal.config import ScheduleSettings
from portal.db import create_engine
from portal.feedback.signature import header_value
from portal.migrate import upgrade
from portal.operations.scheduler import PortalScheduler
from tests.conftest import make_settings
from tests.factories import SubscriptionFactory


@pytest.fixture
def unreachable(tmp_path: Path):
    """An app whose database cannot be opened yet, and a function that brings it up."""
    folder = tmp_path / "not-yet"
    url = f"sqlite:///{folder / 'portal.sqlite3'}"
    app = create_app(
        make_settings(
            url,
            str(tmp_path / "instance"),
            schedule=ScheduleSettings(sweep=1),
        )
    )
    app.config["TESTING"] = True

    def bring_up() -> None:
        folder.mkdir()
        engine = create_engine(url)
        upgrade(engine)
        engine.dispose()

    yield app, bring_up
    app.extensions["portal.db"].engine.dispose()


def test_api_answers_503_in_its_error_shape(unreachable, caplog):
    app, _ = unreachable
    subscription = SubscriptionFactory()()
    with caplog.at_level(logging.WARNING, logger="portal"):
        answer = app.test_client().post(
            "/api/push/subscribe", json={"subscription": subscription.to_json()}
        )
    assert answer.status_code == 503
    assert answer.headers["Retry-After"] == "30"
    assert answer.json == {
        "error": {
            "code": "unavailable",
            "message": "the service is briefly unavailable; try again shortly",
        }
    }
    # The log names the failure's class, never the statement or its parameters.
    assert "database unavailable (OperationalError)" in caplog.text
    assert subscription.endpoint not in caplog.text
    assert "INSERT" not in caplog.text


@pytest.mark.parametrize("path", ["/", "/preferences", "/policy/v1"])
def test_pages_answer_a_503_page_without_internals(unreachable, path):
    app, _ = unreachable
    client = app.test_client()
    answer = client.get(path)
    assert answer.status_code == 503
    assert answer.headers["Retry-After"] == "30"
    assert answer.mimetype == "text/html"
    assert "briefly unavailable" in answer.text
    assert "Nothing was changed" in answer.text
    for internal in ("Traceback", "OperationalError", "sqlite", "SELECT"):
        assert internal not in answer.text


def test_a_form_post_answers_503_not_500(unreachable):
    app, _ = unreachable
    client = app.test_client()
    # CSRF is checked before the view touches the database: give it a real token.
    with app.test_request_context():
        token = generate_csrf()
        secret = flask.session["csrf_token"]
    with client.session_transaction() as browser_session:
        browser_session["csrf_token"] = secret
    answer = client.post(
        "/preferences", data={"csrf_token": token, "policy_version": "v1", "visible": ["x"]}
    )
    assert answer.status_code == 503
    assert "briefly unavailable" in answer.text


def test_health_says_unreachable(unreachable):
    app, _ = unreachable
    answer = app.test_client().get("/healthz")
    assert answer.status_code == 503
    assert answer.json == {"status": "unavailable", "database": "unreachable"}


def test_the_same_app_recovers_once_the_database_is_back(unreachable):
    app, bring_up = unreachable
    client = app.test_client()
    factory = SubscriptionFactory()
    assert client.get("/").status_code == 503
    assert (
        client.post("/api/push/subscribe", json={"subscription": factory().to_json()}).status_code
        == 503
    )
    bring_up()
    assert client.get("/healthz").status_code == 200
    assert client.get("/").status_code == 200
    created = client.post("/api/push/subscribe", json={"subscription": factory().to_json()})
    assert created.status_code == 201
    engine = app.extensions["portal.db"].engine
    with engine.connect() as connection:
        # Only the request made after the outage wrote anything.
        assert connection.execute(sa.text("SELECT count(*) FROM push_subscription")).scalar() == 1


def test_scheduler_ticks_survive_the_outage_and_run_after_it(unreachable, caplog):
    app, bring_up = unreachable
    scheduler = PortalScheduler(app)
    with caplog.at_level(logging.WARNING, logger="portal.scheduler"):
        scheduler._tick("sweep")  # must not raise
    assert "job sweep failed" in caplog.text
    bring_up()
    scheduler._tick("sweep")
    engine = app.extensions["portal.db"].engine
    with engine.connect() as connection:
        runs = connection.execute(sa.text("SELECT name, error FROM job_run")).all()
    assert [(r.name, r.error) for r in runs] == [("sweep", None)]


def test_a_feedback_digest_is_answered_503_while_the_database_is_down_then_applies(
    unreachable,
):
    """The sender retries until a 2xx: a digest that could not be committed is never
    acknowledged, and the same bytes, sent again once the database is back, apply."""
    app, bring_up = unreachable
    client = app.test_client()
    subscription = SubscriptionFactory()()
    raw = json.dumps(
        {
            "organization": "acme",
            "events": [
                {
                    "deliveryId": "d-1",
                    "provider": "webpush",
                    "endpoint": subscription.endpoint,
                    "status": "FAILED",
                    "reason": "INVALID_TARGET",
                    "attempts": 1,
                }
            ],
            "truncated": False,
            "eventsOmitted": 0,
        }
    ).encode()

    def send() -> Any:
        signed = header_value("feedback-secret-one", int(time.time() * 1000), raw)
        return client.post(
            "/api/push/feedback",
            data=raw,
            headers={"X-CN1-Signature": signed, "Content-Type": "application/json"},
        )

    down = send()
    assert down.status_code == 503
    assert down.headers["Retry-After"] == "30"
    assert down.json["error"]["code"] == "unavailable"

    bring_up()
    assert (
        client.post(
            "/api/push/subscribe", json={"subscription": subscription.to_json()}
        ).status_code
        == 201
    )
    up = send()
    assert up.status_code == 200
    assert (up.json["applied"], up.json["revoked"]) == (1, 1)
    engine = app.extensions["portal.db"].engine
    with engine.connect() as connection:
        digests = connection.execute(sa.text("SELECT result FROM feedback_digest")).scalars()
        state = connection.execute(sa.text("SELECT state FROM push_subscription")).scalar_one()
    assert list(digests) == ["accepted"]  # the refusal during the outage could not be noted
    assert state == "revoked"
