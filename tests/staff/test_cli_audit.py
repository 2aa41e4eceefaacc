"""Every ``portal …`` command that changes what staff actions change writes the audit
entry the console would, with the command line as its actor: ``cli`` and the
operating-system user who ran it (from the ``os_user`` seam)."""

from __future__ import annotations

import getpass
import json

import pytest

from portal import create_app
from portal.seams import current_portal, system_user
from tests.helpers import all_rows


@pytest.fixture(autouse=True)
def deploy(app):
    current_portal(app).os_user = lambda: "deploy"


def _entries(engine, action: str) -> list[dict]:
    rows = [r for r in all_rows(engine, "staff_audit") if r["action"] == action]
    for row in rows:
        if isinstance(row["detail"], str):
            row["detail"] = json.loads(row["detail"])
    return rows


def _by_command_line(row: dict) -> bool:
    return (row["actor_via"], row["actor_os_user"], row["actor_id"], row["actor_email"]) == (
        "cli",
        "deploy",
        None,
        None,
    )


def _run(app, *args: str, input: str | None = None):
    result = app.test_cli_runner().invoke(args=["portal", *args], input=input)
    assert result.exit_code == 0, result.output
    return result


def test_policy_publish(app, engine, catalogue_ready, tmp_path):
    notice = tmp_path / "notice.txt"
    notice.write_text("We send what you choose.\nAnd nothing else.\n", encoding="utf-8")
    _run(app, "policy", "publish", "2026-02", "--file", str(notice))
    (row,) = _entries(engine, "policy.published")
    assert _by_command_line(row)
    assert row["target"] == "policy:2026-02"
    assert row["detail"]["previous"] == "v1"
    assert row["detail"]["lines_added"] == 1


def test_topic_add_and_retire(app, engine):
    _run(app, "topic", "add", "flash-sales", "--new-category", "Offers", "--label", "Flash sales")
    (created,) = _entries(engine, "topic.created")
    assert _by_command_line(created) and created["target"] == "topic:flash-sales"
    assert created["detail"]["label"] == "Flash sales"
    retired = _run(app, "topic", "retire", "flash-sales")
    assert "retired flash-sales" in retired.output
    (row,) = _entries(engine, "topic.retired")
    assert _by_command_line(row) and row["target"] == "topic:flash-sales"
    # Retiring again changes nothing, and writes nothing.
    _run(app, "topic", "retire", "flash-sales")
    assert len(_entries(engine, "topic.retired")) == 1


def test_create_staff(app, engine):
    _run(
        app,
        *("create-staff", "ops@example.test", "--role", "admin", "--password-stdin"),
        input="a long and lovely passphrase\n",
    )
    (row,) = _entries(engine, "staff.created")
    assert _by_command_line(row) and row["target"] == "staff:ops@example.test"


def test_campaign_create(app, engine, catalogue_ready):
    _run(app, "campaign", "create", "--topic", "weekly-digest", "--title", "Hi", "--body", "Hello")
    (row,) = _entries(engine, "campaign.launched")
    assert _by_command_line(row) and row["target"].startswith("campaign:")


def test_run_job(app, engine):
    _run(app, "run-job", "rate-limit-prune")
    (row,) = _entries(engine, "operations.job_run")
    assert _by_command_line(row)
    assert row["target"] == "job:rate-limit-prune" and row["detail"] == {"changed": 0}


def test_the_operating_system_user_is_getpass_by_default(monkeypatch):
    monkeypatch.setattr(getpass, "getuser", lambda: "deploy")
    assert system_user() == "deploy"


def test_without_a_user_name_the_uid_stands_in(monkeypatch):
    def no_name() -> str:
        raise OSError("No username set in the environment")

    monkeypatch.setattr(getpass, "getuser", no_name)
    assert system_user().startswith("uid ")


def test_the_seam_is_a_create_app_keyword(settings):
    app = create_app(settings, os_user=lambda: "release-bot")
    assert current_portal(app).os_user() == "release-bot"
    app.extensions["portal.db"].engine.dispose()


def test_a_name_with_control_characters_is_cleaned(app, engine):
    current_portal(app).os_user = lambda: "evil\x1b[31m\nname"
    _run(app, "topic", "add", "flash-sales", "--new-category", "Offers", "--label", "Flash sales")
    (row,) = _entries(engine, "topic.created")
    assert row["actor_os_user"] == "evil[31mname"
