"""Hostile input in the campaign form and command: control characters in what a
campaign stores, schedules that fall off the calendar once converted to UTC, and
numbers that only look like digits. Each is a field error (or a one-line command
error) and writes nothing."""

from __future__ import annotations

import pytest

from portal.campaigns.forms import LocalTimeError, local_to_utc
from tests.campaigns.conftest import form_data
from tests.helpers import Unchanged, error_summary, field_error

CONTROL = "must not contain control characters"


def _post(person, url, data):
    return person.client.post(url, data={"csrf_token": person.token(), **data})


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"title": "Monday\x00digest"}, "title", f"Title {CONTROL} (there is a NUL at character 7)"),
        ({"title": "Monday\ndigest"}, "title", f"Title {CONTROL} (there is a line break at character 7)"),
        ({"topic": "weekly-digest\x00"}, "topic", f"Topic {CONTROL} (there is a NUL at character 14)"),
        ({"body": "Five things\x00"}, "body", f"Message {CONTROL} (there is a NUL at character 12)"),
        ({"body": "Five\x1b[31m things"}, "body", f"Message {CONTROL} (there is U+001B at character 5)"),
        # Browsers drop tabs from URLs, so "/\t/evil.example" would open another site.
        ({"url": "/\t/evil.example"}, "url", f"Link {CONTROL} (there is a tab at character 2)"),
        ({"url": "/news\x00"}, "url", f"Link {CONTROL} (there is a NUL at character 6)"),
        ({"url": "https://example.com/\x00"}, "url", f"Link {CONTROL} (there is a NUL at character 21)"),
        ({"collapse_key": "k\x00"}, "collapse_key", f"Collapse key {CONTROL} (there is a NUL at character 2)"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("action", ["review", "launch"])
def test_campaign_text_with_a_control_character_is_refused(
    engine, campaigner, fields, field, message, action
):
    unchanged = Unchanged(engine)
    response = _post(campaigner, "/staff/campaigns/new", {**form_data(**fields), "action": action})
    assert response.status_code == 422
    assert field_error(response.text, field) == message
    assert (field, message) in error_summary(response.text)
    assert unchanged.changed() == []


def test_a_message_keeps_its_line_breaks_and_tabs(campaigner):
    response = _post(
        campaigner,
        "/staff/campaigns/new",
        {**form_data(body="Five things:\r\n\t1. this"), "action": "review"},
    )
    assert response.status_code == 200
    assert error_summary(response.text) == []


def test_a_test_send_with_a_nul_in_the_title_is_refused(engine, campaigner):
    unchanged = Unchanged(engine)
    response = _post(
        campaigner,
        "/staff/campaigns/test-send",
        {**form_data(title="Monday\x00"), "subscription": "0190d1c0-5b6a-7c3e-9f00-1a2b3c4d5e6f"},
    )
    assert response.status_code == 422
    assert field_error(response.text, "title") == (
        f"Title {CONTROL} (there is a NUL at character 7)"
    )
    assert unchanged.changed() == []


FAR = "is outside the calendar once converted to UTC: choose an earlier or later time"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"send_at": "9999-12-31T23:00", "timezone": "America/New_York"}, "send_at"),
        ({"send_at": "0001-01-01T00:00", "timezone": "Asia/Tokyo"}, "send_at"),
        (
            {"send_at": "2026-03-27T09:30", "deliver_until": "9999-12-31T22:00",
             "timezone": "America/Los_Angeles"},
            "deliver_until",
        ),
    ],
)  # fmt: skip
def test_a_schedule_off_the_calendar_in_utc_is_a_field_error(engine, campaigner, fields, field):
    unchanged = Unchanged(engine)
    response = _post(
        campaigner,
        "/staff/campaigns/new",
        {**form_data(schedule="later", **fields), "action": "review"},
    )
    assert response.status_code == 422
    message = field_error(response.text, field)
    assert message is not None
    assert message.endswith(FAR)
    assert (field, message) in error_summary(response.text)
    assert unchanged.changed() == []


AHEAD = "The send time must be within two years from now: choose an earlier time"


@pytest.mark.parametrize("action", ["review", "launch"])
@pytest.mark.parametrize(
    "fields",
    [
        # Each once worked out a time past 9999-12-31: a local time three days on, the
        # winner hours later, a last time zone's delivery; pages and the dispatcher failed.
        {"send_at": "9999-12-31T22:00", "local_time": "09:00"},
        {"send_at": "9999-12-31T22:00", "variant_b_title": "B", "variant_b_body": "b",
         "test_share": "20", "winner_after_hours": "4"},
        {"send_at": "9999-12-31T22:00", "variant_b_title": "B", "variant_b_body": "b",
         "test_share": "20", "winner_after_hours": "4", "deliver_until": "9999-12-31T23:00"},
        {"send_at": "2030-01-01T09:00"},
    ],
    ids=["local-time", "winner", "winner-and-deliver-until", "four-years-on"],
)  # fmt: skip
def test_a_send_time_years_ahead_is_a_field_error(engine, campaigner, fields, action):
    unchanged = Unchanged(engine)
    response = _post(
        campaigner,
        "/staff/campaigns/new",
        {**form_data(schedule="later", **fields), "action": action},
    )
    assert response.status_code == 422
    assert field_error(response.text, "send_at") == AHEAD
    assert ("send_at", AHEAD) in error_summary(response.text)
    assert unchanged.changed() == []


def test_the_create_command_refuses_a_send_time_years_ahead(catalogue_ready, engine):
    unchanged = Unchanged(engine)
    result = catalogue_ready.test_cli_runner().invoke(
        args=["portal", "campaign", "create", "--topic", "weekly-digest", "--title", "T",
              "--body", "B", "--send-at", "9999-12-30T22:00+00:00", "--local-time", "09:00",
              "--fallback-zone", "UTC"]
    )  # fmt: skip
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "send_at" in result.stderr and "within two years" in result.stderr
    assert unchanged.changed() == []


def test_local_to_utc_names_a_time_off_the_calendar():
    with pytest.raises(LocalTimeError, match=FAR):
        local_to_utc("9999-12-31T23:00", "America/New_York")
    with pytest.raises(LocalTimeError, match=FAR):
        local_to_utc("0001-01-01T00:00", "Asia/Tokyo")


@pytest.mark.parametrize("ttl", ["²", "٣٠", "１２", "-1", "99999999999999999999"])
def test_a_time_to_live_that_only_looks_like_digits_is_a_field_error(engine, campaigner, ttl):
    unchanged = Unchanged(engine)
    response = _post(campaigner, "/staff/campaigns/new", {**form_data(ttl=ttl), "action": "review"})
    assert response.status_code == 422
    assert field_error(response.text, "ttl") == (
        "Enter the time to live as a whole number of seconds, like 86400"
    )
    assert unchanged.changed() == []


@pytest.mark.parametrize("draft", [False, True], ids=["create", "draft"])
@pytest.mark.parametrize("ttl", ["²", "٣٠٠", "１２", "-1", "99999999999999999999", " "])
def test_the_create_command_reads_a_time_to_live_as_the_form_does(
    catalogue_ready, engine, ttl, draft
):
    """The form's rule at the other door: once "²" failed with a traceback and "٣٠٠" was
    taken as 300, and a draft kept what the form then refused."""
    unchanged = Unchanged(engine)
    result = catalogue_ready.test_cli_runner().invoke(
        args=["portal", "campaign", "create", "--topic", "weekly-digest", "--title", "T",
              "--body", "B", "--ttl", ttl, *(["--draft"] if draft else [])]
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "error: ttl: a whole number of seconds" in result.stderr.splitlines()
    assert unchanged.changed() == []


@pytest.mark.parametrize(
    ("option", "value"),
    [("--send-at", "9999-12-31T23:00-05:00"), ("--deliver-until", "0001-01-01T00:00+09:00")],
)
def test_the_create_command_refuses_a_time_off_the_calendar(catalogue_ready, engine, option, value):
    unchanged = Unchanged(engine)
    result = catalogue_ready.test_cli_runner().invoke(
        args=["portal", "campaign", "create", "--topic", "weekly-digest", "--title", "T",
              "--body", "B", option, value]
    )  # fmt: skip
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    field = option.removeprefix("--").replace("-", "_")
    assert result.stderr == f"error: {field}: the time is outside the calendar in UTC\n"
    assert unchanged.changed() == []


def test_the_create_command_refuses_a_control_character_in_the_title(catalogue_ready, engine):
    unchanged = Unchanged(engine)
    result = catalogue_ready.test_cli_runner().invoke(
        args=["portal", "campaign", "create", "--topic", "weekly-digest", "--title",
              "Monday\x07digest", "--body", "B"]
    )  # fmt: skip
    assert result.exit_code == 1
    assert result.stderr == (
        f"error: title: The title {CONTROL} (there is U+0007 at character 7)\n"
    )
    assert unchanged.changed() == []
