"""The audit trail shows each entry's detail as labelled fields, not JSON: known keys in
words, targets linked to their pages for a viewer whose roles open them, and anything else
labelled from its key and escaped."""

from __future__ import annotations

import re
import uuid

import pytest

from portal.db import db
from portal.seams import current_portal
from portal.staff import audit
from portal.staff.audit_view import label_for
from portal.staff.models import Role
from tests.helpers import without_cell_labels


def _rows(page: str) -> list[str]:
    text = without_cell_labels(page)
    body = text[text.index("<tbody>") : text.index("</tbody>")]
    return re.findall(r"<tr>(.*?)</tr>", body, re.S)


def _plain(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def _record(app, actor, action, target=None, detail=None) -> None:
    with app.app_context(), db.begin() as session:
        audit.record(session, actor, action, target, detail)


@pytest.fixture
def published_on_the_command_line(app, catalogue_ready, tmp_path):
    current_portal(app).os_user = lambda: "deploy"
    notice = tmp_path / "notice.txt"
    notice.write_text("We send what you choose.\nAnd nothing else.\n", encoding="utf-8")
    result = app.test_cli_runner().invoke(
        args=["portal", "policy", "publish", "2026-02", "--file", str(notice)]
    )
    assert result.exit_code == 0, result.output


def test_a_command_line_publish_names_its_actor_and_links_the_version(
    published_on_the_command_line, admin_browser
):
    page = admin_browser.get("/staff/admin/audit?action=policy.published")
    assert page.status_code == 200
    (row,) = _rows(page.text)
    assert "<td>command line (os user: deploy)</td>" in row
    assert '<a href="/staff/admin/policies/versions/2026-02">Policy version: 2026-02</a>' in row
    assert (
        '<dt>Previous version:</dt> <dd><a href="/staff/admin/policies/versions/v1">v1</a></dd>'
        in row
    )
    text = _plain(row)
    assert "Lines added: 1" in text and "Lines removed: 0" in text
    assert "Text SHA-256:" in text
    assert "{" not in row and "&#34;" not in row  # no JSON left


def test_roles_are_words_and_the_new_account_is_linked(app, admin_browser, make_staff):
    colleague = make_staff("colleague@example.test", Role.CAMPAIGNS)
    page = admin_browser.get("/staff/admin/audit?action=staff.created")
    rows = [r for r in _rows(page.text) if "colleague@example.test" in r]
    (row,) = rows
    assert f'<a href="/staff/admin/staff/{colleague.id}">Staff: colleague@example.test</a>' in row
    assert "Roles: campaigns" in _plain(row)
    assert "Must choose own password: no" in _plain(row)


def test_a_role_change_says_before_and_after(app, admin_browser, make_staff):
    colleague = make_staff("colleague@example.test", Role.CAMPAIGNS)
    admin_browser.post(
        f"/staff/admin/staff/{colleague.id}/roles", {"roles": ["compliance", "campaigns"]}
    )
    page = admin_browser.get("/staff/admin/audit?action=staff.roles_changed")
    (row,) = _rows(page.text)
    text = _plain(row)
    assert "Roles before: campaigns" in text
    assert "Roles after: campaigns, compliance" in text


def test_targets_are_linked_only_where_the_viewer_may_go(app, make_staff, browser):
    subscriber = uuid.uuid4()
    campaign = uuid.uuid4()
    _record(app, None, "policy.published", "policy:v1", {"previous": None})
    _record(app, None, "subscriber.erased", f"subscriber:{subscriber}", {"event_seq": 7})
    _record(app, None, "campaign.paused", f"campaign:{campaign}", {"status": "paused"})
    make_staff("officer@example.test", Role.COMPLIANCE)
    officer = browser()
    assert officer.sign_in("officer@example.test").status_code == 303
    page = officer.get("/staff/admin/audit").text
    # Compliance opens subscriber histories, not the policy admin or campaign pages.
    assert f'<a href="/staff/compliance/subscribers/{subscriber}">' in page
    assert "Policy version: v1" in page and "/staff/admin/policies/versions/v1" not in page
    assert f"Campaign: {campaign}" in page and f"/staff/campaigns/{campaign}" not in page
    make_staff("both@example.test", Role.ADMIN, Role.CAMPAIGNS)
    both = browser()
    assert both.sign_in("both@example.test").status_code == 303
    page = both.get("/staff/admin/audit").text
    assert '<a href="/staff/admin/policies/versions/v1">' in page
    assert f'<a href="/staff/campaigns/{campaign}">' in page
    assert f"/staff/compliance/subscribers/{subscriber}" not in page
    assert "Previous version: none" in _plain(page)


def test_unknown_keys_are_labelled_and_every_value_is_escaped(app, admin_browser):
    hostile = "<script>alert(1)</script>"
    _record(
        app,
        audit.CommandLine('<img src=x onerror="alert(2)">'),
        "something.new",
        "staff:<b>x</b>@example.test",
        {
            "someCamelKey": 3,
            "odd_key": [hostile, True],
            "<i>key</i>": {"nested": hostile},
            "label": {"from": hostile, "to": "fine"},
        },
    )
    page = admin_browser.get("/staff/admin/audit").text
    assert "<script>alert(1)" not in page
    assert "<img src=x" not in page and "<b>x</b>" not in page and "<i>key</i>" not in page
    (row,) = [r for r in _rows(page) if "something.new" in r]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in row
    assert "command line (os user: &lt;img src=x onerror=&#34;alert(2)&#34;&gt;)" in row
    assert "Staff: &lt;b&gt;x&lt;/b&gt;@example.test" in row  # no such account: no link
    text = _plain(row)
    assert "Some camel key: 3" in text
    assert "Odd key: &lt;script&gt;alert(1)&lt;/script&gt;, yes" in text
    assert "&lt;i&gt;key&lt;/i&gt;: Nested: &lt;script&gt;" in text
    assert "Label: “&lt;script&gt;alert(1)&lt;/script&gt;” → “fine”" in text


@pytest.mark.parametrize(
    ("key", "label"),
    [
        ("lines_added", "Lines added"),
        ("linesAdded", "Lines added"),
        ("sendAt", "Sends at"),
        ("some-thing", "Some thing"),
        ("", "(no name)"),
    ],
)
def test_labels(key, label):
    assert label_for(key) == label


def test_an_entry_from_before_the_os_user_was_kept_still_says_command_line(app, admin_browser):
    _record(
        app, None, "staff.created", "staff:old@example.test", {"roles": ["admin"], "via": "cli"}
    )
    page = admin_browser.get("/staff/admin/audit?action=staff.created").text
    row = next(r for r in _rows(page) if "old@example.test" in r)
    assert "<td>command line</td>" in row
    assert "Done through: command line" in _plain(row)
