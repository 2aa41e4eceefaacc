"""The delivery-feedback operations page: admins see recent digests and send a test."""

from __future__ import annotations

import json
import re

from portal.feedback.signature import header_value
from portal.staff.models import Role
from tests.helpers import all_rows, without_cell_labels

SECRET = "feedback-secret-one"  # what make_settings configures


def _signed_digest(client, clock, body: dict) -> int:
    raw = json.dumps(body).encode()
    t = int(clock.now().timestamp() * 1000)
    response = client.post(
        "/api/push/feedback",
        data=raw,
        headers={
            "X-CN1-Signature": header_value(SECRET, t, raw),
            "Content-Type": "application/json",
        },
    )
    return response.status_code


def test_admins_see_recent_digests_and_never_the_secret(app, admin_browser, clock):
    client = app.test_client()
    assert (
        _signed_digest(client, clock, {"organization": "acme", "events": [], "truncated": True})
        == 200
    )
    assert _signed_digest(client, clock, {"organization": "acme"}) == 422

    page = admin_browser.get("/staff/ops/feedback")

    assert page.status_code == 200
    assert page.headers["Cache-Control"] == "no-store"
    html = page.text
    assert "<h1>Delivery feedback</h1>" in html
    assert "1 configured" in html
    assert "Accepted" in html and "Rejected: <code>invalid_digest</code>" in html
    assert "More follow" in html
    assert SECRET not in html


def _digest_rows(html: str) -> list[list[str]]:
    body = (
        without_cell_labels(html)
        .split('aria-labelledby="digests-heading"')[1]
        .split("</tbody>", maxsplit=1)[0]
    )
    return [
        [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", body.split("<tbody>")[1], re.S)
    ]


def test_each_digest_shows_its_events_applied_duplicates_and_omitted(app, admin_browser, clock):
    client = app.test_client()
    gone = {
        "deliveryId": "d-1",
        "provider": "webpush",
        "endpoint": "https://fcm.googleapis.com/fcm/send/gone",
        "status": "FAILED",
        "reason": "INVALID_TARGET",
        "attempts": 1,
    }
    transient = {"provider": "webpush", "status": "DEAD", "reason": "TIMEOUT", "attempts": 5}
    body = {"organization": "acme", "events": [gone, transient], "eventsOmitted": 120}
    assert _signed_digest(client, clock, body) == 200
    clock.advance(seconds=1)
    assert _signed_digest(client, clock, body) == 200  # the same again: a duplicate

    rows = _digest_rows(admin_browser.get("/staff/ops/feedback").text)

    # Received, organization, result, events, applied, revoked, duplicates, ignored, page.
    assert [row[1:9] for row in rows] == [
        ["acme", "Accepted", "2", "0", "0", "1", "1", "Last; 120 accepted summarised"],
        ["acme", "Accepted", "2", "1", "0", "0", "1", "Last; 120 accepted summarised"],
    ]
    assert rows[0][0] > rows[1][0]  # newest first, with the time


def test_an_admin_sends_a_signed_test_digest(app, admin_browser, engine):
    response = admin_browser.post("/staff/ops/feedback/test")

    assert response.status_code == 303
    assert response.location.endswith("/staff/ops/feedback")
    page = admin_browser.get("/staff/ops/feedback").text
    assert "Test digest accepted: 1 applied, 1 ignored, 0 revoked." in page
    [digest] = all_rows(engine, "feedback_digest")
    assert (digest["result"], digest["organization"]) == ("accepted", "portal-test")
    [marker] = all_rows(engine, "feedback_applied")
    assert marker["outcome"] == "unmatched"
    entries = [r for r in all_rows(engine, "staff_audit") if r["action"] == "feedback.test_sent"]
    assert len(entries) == 1
    assert entries[0]["actor_email"] == "admin@example.test"
    detail = entries[0]["detail"]
    detail = json.loads(detail) if isinstance(detail, str) else detail
    assert detail == {"status": 200, "code": None}


def test_a_refusing_receiver_is_reported(make_app, make_staff, browser):
    bare = make_app(feedback_secrets=())
    make_staff("admin@example.test", Role.ADMIN)
    admin = browser(bare)
    admin.sign_in("admin@example.test")

    admin.post("/staff/ops/feedback/test")

    page = admin.get("/staff/ops/feedback").text
    assert "The receiver answered 401 (not_configured:" in page
    assert "None: every digest is refused" in page


def test_the_test_needs_a_csrf_token(admin_browser, engine):
    response = admin_browser.client.post("/staff/ops/feedback/test")
    assert response.status_code == 400
    assert all_rows(engine, "feedback_digest") == []


def test_an_answer_not_in_the_error_shape_is_still_reported(admin_browser, engine, monkeypatch):
    from portal.feedback import ops

    answers = iter([(502, {"error": "Bad Gateway"}), (503, {"text": "<html>busy</html>"})])
    monkeypatch.setattr(ops.services, "send_test_digest", lambda _app: next(answers))

    for expected in ("The receiver answered 502.", "The receiver answered 503."):
        response = admin_browser.post("/staff/ops/feedback/test")
        assert response.status_code == 303
        assert expected in admin_browser.get("/staff/ops/feedback").text

    entries = [r for r in all_rows(engine, "staff_audit") if r["action"] == "feedback.test_sent"]
    details = [
        json.loads(e["detail"]) if isinstance(e["detail"], str) else e["detail"] for e in entries
    ]
    assert sorted(d["status"] for d in details) == [502, 503]
    assert all(d["code"] is None for d in details)


def test_a_200_that_is_not_the_receiver_is_not_called_accepted(admin_browser, monkeypatch):
    from portal.feedback import ops

    answers = iter([(200, {"body": "<html>welcome</html>"}), (200, {})])
    monkeypatch.setattr(ops.services, "send_test_digest", lambda _app: next(answers))
    for _ in range(2):
        assert admin_browser.post("/staff/ops/feedback/test").status_code == 303
        page = admin_browser.get("/staff/ops/feedback").text
        assert "answered 200 but not as the feedback receiver does" in page
        assert "Test digest accepted" not in page
