"""Every kind of staff action the audit trail promises, done through the console as a
person would, leaves one entry naming who, when, what and on what, and the audit page
lists and filters it.

The list is the one the console promises: sign-in, failed sign-in, campaign create and
launch (one step: a campaign is created by launching it), pause, cancel, export,
erasure, topic and policy changes, role changes.
"""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
import sqlalchemy as sa

from portal.consent.catalogue import text_digest
from portal.db import db
from portal.staff.models import Role, StaffUser
from tests.campaigns.conftest import form_data
from tests.compliance.conftest import subscribe
from tests.helpers import all_rows, without_cell_labels

EMAIL = "all-roles@example.test"
POLICY_V2 = "We send what you choose.\nYou can change your mind at any time.\n"


def _rows(engine) -> list[dict]:
    rows = all_rows(engine, "staff_audit")
    for row in rows:
        if isinstance(row["detail"], str):  # SQLite hands JSON back as text
            row["detail"] = json.loads(row["detail"])
    return rows


def _utc(value) -> dt.datetime:
    """A time read back with plain SQL: aware on PostgreSQL, text or naive UTC on SQLite."""
    if not isinstance(value, dt.datetime):
        value = dt.datetime.fromisoformat(str(value))
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def _id_text(value) -> str:
    return str(value).replace("-", "")


@pytest.fixture
def done(app, engine, clock, catalogue_ready, subscriptions, make_staff, browser):
    """Each promised action done once, one minute apart; returns each one's target and time."""
    make_staff(EMAIL, Role.ADMIN, Role.COMPLIANCE, Role.CAMPAIGNS)
    colleague = make_staff("colleague@example.test", Role.CAMPAIGNS)
    someone = subscribe(app, subscriptions)
    targets: dict[str, tuple[str, dt.datetime]] = {}

    def step(action: str, target: str) -> None:
        targets[action] = (target, clock.now())
        clock.advance(minutes=1)

    person = browser()
    assert person.sign_in(EMAIL, "not the password at all").status_code == 401
    step("staff.sign_in_failed", f"staff:{EMAIL}")
    assert person.sign_in(EMAIL).status_code == 303
    step("staff.signed_in", f"staff:{EMAIL}")

    roles = person.post(f"/staff/admin/staff/{colleague.id}/roles", {"roles": ["compliance"]})
    assert roles.status_code == 303
    step("staff.roles_changed", "staff:colleague@example.test")

    new_topic = {
        "slug": "product-news",
        "category": "News",
        "label": "Product news",
        "description": "Once a month.",
        "topic_class": "marketing",
        "default_state": "opt_out",
        "action": "create",  # the review's button
    }
    assert person.post("/staff/admin/topics/new", new_topic).status_code == 303
    step("topic.created", "topic:product-news")
    edit = {"label": "Product updates", "description": "Once a month."}
    assert person.post("/staff/admin/topics/product-news/edit", edit).status_code == 303
    step("topic.edited", "topic:product-news")
    assert person.post("/staff/admin/topics/offers/retire").status_code == 303
    step("topic.retired", "topic:offers")

    preview = person.post(
        "/staff/admin/policies/new", {"version": "v2", "text": POLICY_V2, "action": "preview"}
    )
    assert preview.status_code == 200
    published = person.post(
        "/staff/admin/policies/new",
        {
            "version": "v2",
            "text": POLICY_V2,
            "action": "publish",
            "previewed": text_digest(POLICY_V2),
        },
    )
    assert published.status_code == 303
    step("policy.published", "policy:v2")

    review = person.post("/staff/campaigns/new", {**form_data(), "action": "review"})
    assert review.status_code == 200, review.text
    campaign_id = re.search(r'name="campaign_id" value="([0-9a-f-]{36})"', review.text).group(1)
    launched = person.post(
        "/staff/campaigns/new", {**form_data(campaign_id=campaign_id), "action": "launch"}
    )
    assert launched.status_code == 303
    step("campaign.launched", f"campaign:{campaign_id}")
    assert person.post(f"/staff/campaigns/{campaign_id}/pause").status_code == 303
    step("campaign.paused", f"campaign:{campaign_id}")
    cancelled = person.post(f"/staff/campaigns/{campaign_id}/cancel", {"confirm": "yes"})
    assert cancelled.status_code == 303
    step("campaign.cancelled", f"campaign:{campaign_id}")

    exported = person.post(
        "/staff/compliance/export",
        {
            "date_from": "2026-01-01",
            "date_to": "2026-01-01",
            "data_format": "csv",
            "topic": "",
            "subscriber": "",
        },
    )
    assert exported.status_code == 200
    assert exported.mimetype == "application/zip"
    exported.get_data()  # the whole download, as a browser would take it
    step("consent.exported", "consent-log")

    erased = person.post(
        f"/staff/compliance/subscribers/{someone.subscriber_id}/erase",
        {"confirm": "y", "reference": "T-1"},
    )
    assert erased.status_code == 303
    step("subscriber.erased", f"subscriber:{someone.subscriber_id}")
    return person, targets


# What the console promises to audit, and the entry each one writes.
PROMISED = {
    "sign-in": "staff.signed_in",
    "failed sign-in": "staff.sign_in_failed",
    "campaign create": "campaign.launched",
    "launch": "campaign.launched",
    "pause": "campaign.paused",
    "cancel": "campaign.cancelled",
    "export": "consent.exported",
    "erasure": "subscriber.erased",
    "topic created": "topic.created",
    "topic edited": "topic.edited",
    "topic retired": "topic.retired",
    "policy published": "policy.published",
    "role change": "staff.roles_changed",
}


def test_each_promised_action_leaves_one_entry_with_actor_time_and_target(app, engine, done):
    _, targets = done
    with app.app_context():
        actor_id = db.session.scalars(sa.select(StaffUser.id).where(StaffUser.email == EMAIL)).one()
    rows = _rows(engine)
    for promise, action in PROMISED.items():
        mine = [r for r in rows if r["action"] == action]
        assert len(mine) == 1, (promise, action, mine)
        (row,) = mine
        assert row["actor_email"] == EMAIL, promise
        assert _id_text(row["actor_id"]) == _id_text(actor_id), promise
        target, when = targets[action]
        assert row["target"] == target, promise
        # The clock moved one minute after each step: the entry has its own step's time.
        assert _utc(row["at"]) == when, (promise, row["at"])


def test_the_audit_page_shows_and_filters_each_of_them(app, done):
    person, targets = done
    page = person.get("/staff/admin/audit")
    assert page.status_code == 200
    options = set(re.findall(r'<option value="([\w.]+)"', page.text))
    for action in set(PROMISED.values()):
        assert action in options, action
        filtered = person.get(f"/staff/admin/audit?action={action}&actor={EMAIL}")
        assert filtered.status_code == 200
        text = without_cell_labels(filtered.text)
        body = text[text.index("<tbody>") : text.index("</tbody>")]
        rows = re.findall(r"<tr>(.*?)</tr>", body, re.S)
        assert len(rows) == 1, (action, rows)
        cells = [re.sub(r"<[^>]+>", "", cell).strip() for cell in _cells(rows[0])]
        assert cells[1] == EMAIL
        assert cells[3] == _readable(targets[action][0])


def _cells(row: str) -> list[str]:
    return re.findall(r"<td>(.*?)</td>", row, re.S)


_KINDS = {
    "staff": "Staff",
    "topic": "Topic",
    "policy": "Policy version",
    "campaign": "Campaign",
    "subscriber": "Subscriber",
}


def _readable(target: str) -> str:
    """How the page names a target: ``topic:news`` is "Topic: news"."""
    if target == "consent-log":
        return "Consent log"
    kind, _, rest = target.partition(":")
    return f"{_KINDS[kind]}: {rest}"
