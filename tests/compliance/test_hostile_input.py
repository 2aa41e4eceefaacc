"""Hostile input on the compliance pages and commands: control characters in the
look-up and erasure forms, export periods at the edge of the calendar, and bundles
nested deeper than any exporter writes. Each is refused clearly and writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from portal.compliance.verify import verify_bundle
from tests.helpers import Unchanged, error_summary, field_error

CONTROL = "must not contain control characters"


def _post(browser, url, data, token):
    """A form post with the page's CSRF token, sent exactly as given."""
    return browser.client.post(url, data={"csrf_token": token, **data})


SEARCH = "Reference, account ID, subscriber ID or erasure receipt ID"


@pytest.mark.parametrize(
    ("value", "what"),
    [
        ("user\x00-42", "a NUL at character 5"),
        ("user-42\r\n", "a line break at character 8"),
        ("0190d1c0-5b6a-7c3e-9f00-1a2b3c4d5e6f\x00", "a NUL at character 37"),
        ("k7qm-3xpa\x00", "a NUL at character 10"),
    ],
)
def test_the_search_refuses_control_characters(engine, officer, person, value, what):
    officer.token()  # (a signed-in page moves the session's idle deadline on)
    unchanged = Unchanged(engine)
    response = officer.get("/staff/compliance/lookup", query_string={"q": value})
    assert response.status_code == 422
    message = f"{SEARCH} {CONTROL} (there is {what})"
    assert field_error(response.text, "q") == message
    assert error_summary(response.text) == [("q", message)]
    assert unchanged.changed() == []  # not even the audit row of a look-up


def test_the_endpoint_look_up_refuses_control_characters(engine, officer, person):
    token = officer.token()
    unchanged = Unchanged(engine)
    value = "https://fcm.googleapis.com/fcm/send/\x00"
    response = _post(officer, "/staff/compliance/lookup", {"endpoint": value}, token)
    assert response.status_code == 422
    message = f"Push endpoint {CONTROL} (there is a NUL at character 37)"
    assert field_error(response.text, "endpoint") == message
    assert error_summary(response.text) == [("endpoint", message)]
    assert unchanged.changed() == []


def test_an_erasure_reference_with_a_nul_is_refused(engine, officer, person):
    token = officer.token()  # (a signed-in page moves the session's idle deadline on)
    unchanged = Unchanged(engine)
    response = _post(
        officer,
        f"/staff/compliance/subscribers/{person.subscriber_id}/erase",
        {"confirm": "y", "reference": "T-1\x00"},
        token,
    )
    assert response.status_code == 422
    message = f"Request reference {CONTROL} (there is a NUL at character 4)"
    assert field_error(response.text, "reference") == message
    assert unchanged.changed() == []


def _export_form(**changes):
    return {
        "date_from": "2026-01-01",
        "date_to": "2026-01-01",
        "data_format": "csv",
        "topic": "",
        "subscriber": "",
        **changes,
    }


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"date_to": "9999-12-31"}, "date_to", "To must be on or before 9999-12-30"),
        ({"date_from": "9999-12-31", "date_to": "9999-12-31"}, "date_from",
         "From must be on or before 9999-12-30"),
        ({"date_to": "10000-01-01"}, "date_to", "To must be a real date, like 2026-03-27"),
        ({"date_from": "2026-01-01\x00"}, "date_from",
         f"From {CONTROL} (there is a NUL at character 11)"),
        ({"topic": "offers\x00"}, "topic", f"Topic {CONTROL} (there is a NUL at character 7)"),
    ],
)  # fmt: skip
def test_the_export_form_refuses_far_dates_and_control_characters(
    engine, officer, person, changes, field, message
):
    token = officer.token()  # (a signed-in page moves the session's idle deadline on)
    unchanged = Unchanged(engine)
    response = _post(officer, "/staff/compliance/export", _export_form(**changes), token)
    assert response.status_code == 422
    assert field_error(response.text, field) == message
    assert (field, message) in error_summary(response.text)
    assert unchanged.changed() == []


def test_the_whole_calendar_can_be_exported(officer, person):
    response = _post(
        officer,
        "/staff/compliance/export",
        _export_form(date_from="0001-01-01", date_to="9999-12-30"),
        officer.token(),
    )
    assert response.status_code == 200
    assert response.mimetype == "application/zip"
    response.get_data()


@pytest.mark.parametrize(
    ("start", "end", "message"),
    [
        ("2026-01-01", "9999-12-31", "error: the last day must be on or before 9999-12-30\n"),
        ("9999-12-31", "9999-12-31", "error: the last day must be on or before 9999-12-30\n"),
    ],
)
def test_the_export_command_refuses_the_last_day_of_the_calendar(
    app, engine, tmp_path, person, start, end, message
):
    out = tmp_path / "far"
    unchanged = Unchanged(engine)
    result = app.test_cli_runner().invoke(
        args=["portal", "export", "--from", start, "--to", end, "--out", str(out)]
    )
    assert result.exit_code == 1
    assert result.output == message  # one line, no traceback
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert not out.exists()
    assert unchanged.changed() == []


def test_the_export_command_covers_the_whole_calendar(app, tmp_path, person):
    out = tmp_path / "all"
    result = app.test_cli_runner().invoke(
        args=["portal", "export", "--from", "0001-01-01", "--to", "9999-12-30", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert verify_bundle(out).ok


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [200, 100_000])
def test_verify_export_reports_a_manifest_nested_too_deeply(app, tmp_path, depth):
    bundle = tmp_path / "deep"
    bundle.mkdir()
    manifest = {"signature_algorithm": "ed25519", "data": {"nested": json.loads(_deep(50))}}
    text = json.dumps(manifest).replace("[]", _deep(depth), 1)
    (bundle / "manifest.json").write_text(text)
    result = app.test_cli_runner().invoke(args=["portal", "verify-export", str(bundle)])
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert "FAILED manifest.json: format: nested deeper than an export manifest is" in (
        result.output
    )


def test_verify_export_reports_a_data_line_nested_too_deeply(app, tmp_path, person):
    bundle = tmp_path / "nd"
    exported = app.test_cli_runner().invoke(
        args=["portal", "export", "--from", "2026-01-01", "--to", "2026-01-01",
              "--format", "ndjson", "--out", str(bundle)]
    )  # fmt: skip
    assert exported.exit_code == 0, exported.output
    data: Path = bundle / "consent-events.ndjson"
    lines = data.read_text().splitlines()
    data.write_text("\n".join([lines[0], _deep(100_000), *lines[1:]]) + "\n")
    result = app.test_cli_runner().invoke(args=["portal", "verify-export", str(bundle)])
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "FAILED consent-events.ndjson: format: cannot be read past row 1" in result.output
