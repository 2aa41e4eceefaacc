"""What the operations page builds on: a signed test digest and the recent digests."""

from __future__ import annotations

import json

import pytest

from portal import create_app
from portal.config import ConfigError, Settings
from portal.db import db
from portal.feedback import services
from tests.feedback.conftest import HEADER, URL
from tests.helpers import all_rows
from tests.test_config import GOOD_PRODUCTION


def test_send_test_digest_through_the_app(app, engine):
    status, body = services.send_test_digest(app)

    assert status == 200
    assert (body["organization"], body["events"]) == (services.TEST_ORGANIZATION, 2)
    assert (body["applied"], body["revoked"], body["ignored"]) == (1, 0, 1)
    [marker] = all_rows(engine, "feedback_applied")
    assert marker["outcome"] == "unmatched"  # an .invalid endpoint: no subscription touched
    with db.begin(app) as session:
        [recent] = services.recent_digests(session)
    assert (recent.result, recent.secret_index, recent.applied) == ("accepted", 0, 1)


def test_send_test_digest_uses_the_configured_organization(settings, clock):
    scoped = create_app(settings.with_overrides(feedback_organization="acme"), clock=clock)
    try:
        status, body = services.send_test_digest(scoped)
        assert (status, body["organization"]) == (200, "acme")
    finally:
        scoped.extensions["portal.db"].engine.dispose()


def test_send_test_digest_reports_a_receiver_that_refuses(settings, clock):
    bare = create_app(settings.with_overrides(feedback_secrets=()), clock=clock)
    try:
        status, body = services.send_test_digest(bare)
        assert (status, body["error"]["code"]) == (401, "not_configured")
    finally:
        bare.extensions["portal.db"].engine.dispose()


def test_send_test_digest_over_http_to_the_configured_url(settings, clock, monkeypatch):
    remote = create_app(
        settings.with_overrides(feedback_test_url="https://portal.example/api/push/feedback"),
        clock=clock,
    )
    seen = {}

    class Answer:
        status_code = 200

        def __init__(self, response):
            self._response = response
            self.text = response.get_data(as_text=True)

        def json(self):
            return self._response.json

    def post(url, *, data, headers, timeout):
        seen.update(url=url, timeout=timeout, signed=HEADER in headers)
        return Answer(remote.test_client().post(URL, data=data, headers=headers))

    import requests

    monkeypatch.setattr(requests, "post", post)
    try:
        status, body = services.send_test_digest(remote)
        assert (status, body["applied"]) == (200, 1)
        assert seen == {
            "url": "https://portal.example/api/push/feedback",
            "timeout": 10,
            "signed": True,
        }

        def unreachable(*_args, **_kwargs):
            raise requests.ConnectionError("connection refused")

        monkeypatch.setattr(requests, "post", unreachable)
        status, body = services.send_test_digest(remote)
        assert (status, body["error"]["code"]) == (0, "unreachable")
    finally:
        remote.extensions["portal.db"].engine.dispose()


def test_recent_digests_newest_first_and_bounded(app, clock):
    for _ in range(3):
        services.send_test_digest(app)
        clock.advance(minutes=1)
    with db.begin(app) as session:
        recent = services.recent_digests(session, limit=2)
    assert len(recent) == 2
    assert recent[0].received_at > recent[1].received_at


def test_the_test_digest_is_compact_json_with_the_contract_fields(settings, clock):
    body = json.loads(services.build_test_digest(settings, clock.now()))
    assert set(body) >= {"organization", "events", "truncated", "eventsOmitted"}
    assert {e["reason"] for e in body["events"]} == {"INVALID_TARGET", "PROVIDER_UNAVAILABLE"}


def test_feedback_settings_from_the_environment(tmp_path):
    settings = Settings.from_env(
        {
            "FEEDBACK_SECRETS": " new , old ",
            "FEEDBACK_SIGNATURE_HEADER": "X-Signature",
            "FEEDBACK_MAX_AGE_SECONDS": "60",
            "FEEDBACK_ORGANIZATION": "acme",
            "FEEDBACK_MAX_BODY_BYTES": "65536",
            "FEEDBACK_TEST_URL": "https://portal.example/api/push/feedback",
        },
        str(tmp_path),
    )
    assert settings.feedback_secrets == ("new", "old")
    assert settings.feedback_signature_header == "X-Signature"
    assert settings.feedback_max_age_seconds == 60
    assert settings.feedback_organization == "acme"
    assert settings.feedback_max_body_bytes == 65536
    assert settings.feedback_test_url == "https://portal.example/api/push/feedback"
    defaults = Settings.from_env({}, str(tmp_path / "other"))
    assert defaults.feedback_signature_header == "X-CN1-Signature"
    assert defaults.feedback_max_age_seconds == 300
    assert defaults.feedback_organization is None
    assert len(defaults.feedback_secrets) == 1  # generated once in development


def test_production_refuses_a_placeholder_feedback_secret(tmp_path):
    assert Settings.from_env(GOOD_PRODUCTION, str(tmp_path)).feedback_secrets == ()
    with pytest.raises(ConfigError, match="FEEDBACK_SECRETS"):
        Settings.from_env(
            {**GOOD_PRODUCTION, "FEEDBACK_SECRETS": "real-one,changeme"}, str(tmp_path)
        )
