"""The one logging configuration: JSON lines in production, text in development, the
``extra=`` fields written, no secret on a line, and gunicorn configured the same way."""

from __future__ import annotations

import io
import json
import logging
import runpy
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from flask import Flask

from portal import create_app, logconfig
from portal.accesslog import REDACTED
from portal.campaigns import services as campaigns
from portal.campaigns.services import CampaignDraft
from portal.db import db
from portal.delivery.models import Delivery
from tests.campaigns.conftest import settings  # noqa: F401 - the campaign tests' settings
from tests.conftest import KEY_V1, VAPID_PRIVATE, make_settings
from tests.delivery.conftest import (  # noqa: F401 - fixtures shared with the engine's tests
    dispatcher,
    fake_push,
    push_app,
    push_transport,
)
from tests.support import ROOT


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    """The root logger, its handlers and level put back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    logconfig.remove()
    root.handlers[:] = handlers
    root.setLevel(level)


def _lines(stream: io.StringIO) -> list[str]:
    return [line for line in stream.getvalue().splitlines() if line]


def _prune_one(request: pytest.FixtureRequest):
    """A subscriber to the weekly digest whose push service answers 410 to a campaign."""
    app: Flask = request.getfixturevalue("push_app")
    service = request.getfixturevalue("fake_push")
    engine = request.getfixturevalue("dispatcher")
    clock = request.getfixturevalue("clock")
    sub = service.subscribe()
    body = {
        "subscription": sub.to_json(),
        "topics": ["weekly-digest"],
        "policyVersion": "v1",
    }
    assert app.test_client().post("/api/push/subscribe", json=body).status_code == 201
    service.script(sub, 410)
    with db.begin(app) as session:
        draft = CampaignDraft(topic="weekly-digest", title="Digest", body="News", url="/news")
        campaigns.create_campaign(session, draft, created_by="test", now=clock.now())
    assert engine.tick().revoked == 1
    with db.begin(app) as session:
        (delivery,) = session.scalars(sa.select(Delivery)).all()
        return sub, str(delivery.subscription_id), delivery.id


def test_the_pruned_token_audit_event_is_a_json_line_with_its_fields(root_logger, request):
    stream = io.StringIO()
    logconfig.configure(production=True, stream=stream, force=True)
    sub, subscription_id, delivery_id = _prune_one(request)

    records = [json.loads(line) for line in _lines(stream)]  # every line is one JSON object
    (pruned,) = [r for r in records if r["message"] == "push_token_pruned"]
    assert pruned["logger"] == "portal.audit"
    assert pruned["level"] == "WARNING"
    assert pruned["subscription"] == subscription_id
    assert pruned["provider"] == "other"
    assert pruned["delivery"] == delivery_id
    assert pruned["reason"] == "410 Gone"
    assert pruned["time"].endswith("Z")
    # The subscription's keys and the server's never reach a line.
    output = stream.getvalue()
    for secret in (sub.auth_b64, sub.p256dh, VAPID_PRIVATE, KEY_V1, sub.endpoint):
        assert secret not in output


def test_development_text_lines_carry_the_same_fields(root_logger, request):
    stream = io.StringIO()
    logconfig.configure(production=False, stream=stream, force=True)
    _, subscription_id, delivery_id = _prune_one(request)

    (line,) = [line for line in _lines(stream) if " push_token_pruned " in line]
    assert " WARNING portal.audit push_token_pruned " in line
    assert f"subscription={subscription_id}" in line
    assert "provider=other" in line
    assert f"delivery={delivery_id}" in line
    assert 'reason="410 Gone"' in line
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)


@pytest.mark.parametrize("fmt", logconfig.FORMATS)
def test_no_secret_reaches_a_line(root_logger, fmt):
    stream = io.StringIO()
    logconfig.configure(production=True, fmt=fmt, stream=stream, force=True)
    log = logging.getLogger("portal.test")
    log.warning(
        "opened /preferences?token=link-secret-1 and /preferences/erasure-receipt/rcpt-2",
        extra={
            "password": "pw-secret-3",
            "auth_key": "key-secret-4",
            "session_cookie": "cookie-secret-5",
            "target": "/preferences?assertion=assert-secret-6&from=push",
            "context": {"token": "nested-secret-7", "screen": "preferences"},
            "subscriber": "3f2a",
        },
    )
    output = stream.getvalue()
    for n, secret in enumerate(
        ("link-secret", "rcpt", "pw-secret", "key-secret", "cookie-secret", "assert-secret"),
        start=1,
    ):
        assert f"{secret}-{n}" not in output
    assert "nested-secret-7" not in output
    assert REDACTED in output
    assert "subscriber" in output and "3f2a" in output  # the fields that are no secret stay
    if fmt == logconfig.JSON:
        line = json.loads(output)
        assert line["password"] == REDACTED
        assert line["context"] == {"token": REDACTED, "screen": "preferences"}
        assert line["target"] == f"/preferences?assertion={REDACTED}&from=push"


def test_text_lines_stay_one_line_and_tracebacks_follow(root_logger):
    stream = io.StringIO()
    logconfig.configure(production=False, stream=stream, force=True)
    log = logging.getLogger("portal.test")
    log.info("path /a\nFORGED line", extra={"note": "two\nlines"})
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("failed")
    first, *rest = stream.getvalue().splitlines()
    assert first.endswith('path /a\\x0aFORGED line note="two\\x0alines"')
    assert rest[0].endswith(" ERROR portal.test failed")
    assert "RuntimeError: boom" in rest[-1]


def test_json_lines_carry_the_traceback(root_logger):
    stream = io.StringIO()
    logconfig.configure(production=True, stream=stream, force=True)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("portal.test").exception("failed")
    (line,) = _lines(stream)
    record = json.loads(line)
    assert record["message"] == "failed"
    assert "RuntimeError: boom" in record["exception"]


def test_create_app_configures_logging_by_environment(root_logger, database_url, tmp_path):
    root_logger.handlers[:] = []  # as in a fresh process: nobody configured logging yet
    create_app(make_settings(database_url, str(tmp_path / "dev"), env="development"))
    (installed,) = root_logger.handlers
    assert isinstance(installed.formatter, logconfig.TextFormatter)
    assert root_logger.level == logging.INFO
    # A production start (settings alone: nothing is served) writes JSON lines.
    production = make_settings(database_url, str(tmp_path / "prod"), env="production")
    create_app(production).extensions["portal.db"].engine.dispose()
    (installed,) = root_logger.handlers  # replaced, not added to
    assert isinstance(installed.formatter, logconfig.JsonFormatter)


def test_create_app_leaves_logging_someone_else_configured(root_logger, database_url, tmp_path):
    theirs = logging.StreamHandler(io.StringIO())
    root_logger.handlers[:] = [theirs]
    create_app(make_settings(database_url, str(tmp_path / "instance")))
    assert root_logger.handlers == [theirs]


def test_the_environment_chooses_format_and_level():
    assert logconfig.choose_format(production=True, environ={}) == "json"
    assert logconfig.choose_format(production=False, environ={}) == "text"
    assert logconfig.choose_format(production=True, environ={"PORTAL_LOG_FORMAT": "Text"}) == (
        "text"
    )
    with pytest.raises(ValueError, match="PORTAL_LOG_FORMAT"):
        logconfig.choose_format(production=True, environ={"PORTAL_LOG_FORMAT": "xml"})
    assert logconfig.choose_level({"PORTAL_LOG_LEVEL": "debug"}) == "DEBUG"
    with pytest.raises(ValueError, match="PORTAL_LOG_LEVEL"):
        logconfig.choose_level({"PORTAL_LOG_LEVEL": "loud"})


def test_gunicorn_writes_its_lines_through_the_same_configuration(
    root_logger, monkeypatch, tmp_path, capsys
):
    from gunicorn.config import Config

    from portal.accesslog import AccessLogger

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "metrics"))
    monkeypatch.delenv("PORTAL_LOG_FORMAT", raising=False)
    conf = runpy.run_path(str(ROOT / "gunicorn.conf.py"))
    cfg = Config()
    for name in ("logconfig_dict", "accesslog", "logger_class"):
        cfg.set(name, conf[name])
    gunicorn_log = AccessLogger(cfg)
    gunicorn_log.error("worker %s booted", 7)
    logging.getLogger("portal.audit").warning("push_token_pruned", extra={"provider": "fcm"})
    logging.getLogger("gunicorn.access").info("GET /preferences?token=gunicorn-secret HTTP/1.1")

    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.err.splitlines() if line]
    by_logger = {line["logger"]: line for line in lines}
    assert by_logger["gunicorn.error"]["message"] == "worker 7 booted"
    assert by_logger["portal.audit"]["provider"] == "fcm"
    assert by_logger["gunicorn.access"]["message"] == f"GET /preferences?token={REDACTED} HTTP/1.1"
    assert len(lines) == 3  # one line each: no second copy from gunicorn's own handlers
    assert "gunicorn-secret" not in captured.out + captured.err
