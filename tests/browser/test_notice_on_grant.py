"""The notice the subscribe page showed is the notice the permission grant and the
subscription are recorded against, and the compliance history says which it was."""

from __future__ import annotations

import re
import uuid

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import DESKTOP, PHONE, SCREENSHOTS, LiveServer, subscribe_through_page
from tests.browser.test_accessibility import _staff, axe_results

pytestmark = pytest.mark.browser

SHOTS = SCREENSHOTS / "catalogue"


def _timeline_item(page: Page, label: str):
    return page.locator(".timeline__item").filter(
        has=page.locator(".timeline__what", has_text=re.compile(f"^{re.escape(label)}$"))
    )


def _no_axe_violations(page: Page) -> None:
    results = axe_results(page)
    assert results.violations_count == 0, results.generate_report()


def _shoot(page: Page, name: str, width: int, *, full_page: bool = True) -> None:
    """For the reviewer's eyes, where the notes folder exists; nothing is compared."""
    if SHOTS.parent.is_dir():
        SHOTS.mkdir(exist_ok=True)
        page.screenshot(path=SHOTS / f"{name}-{width}.png", full_page=full_page)


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=lambda v: str(v["width"]))
def test_the_history_shows_the_notice_shown_when_permission_was_granted(
    new_context, server: LiveServer, viewport
):
    visitor = new_context(viewport=viewport).new_page()
    visitor.goto("/")
    shown = visitor.get_attribute("#subscribe-page", "data-policy-version")
    assert shown == "2026-01"
    assert f"Notice version {shown}" in visitor.inner_text("#subscribe-form")
    _no_axe_violations(visitor)
    _shoot(visitor, "subscribe-page", viewport["width"])
    with visitor.expect_request("**/api/push/subscribe") as posted:
        subscribe_through_page(visitor, topics=("weekly-digest",))
    assert posted.value.post_data_json["policyVersion"] == shown
    _no_axe_violations(visitor)

    subscriber_id = uuid.UUID(str(server.scalar("SELECT subscriber_id FROM push_subscription")))
    staff = _staff(new_context, server)
    staff.set_viewport_size(viewport)
    staff.goto(f"/staff/compliance/subscribers/{subscriber_id}")
    for label in ("Notification permission granted", "Subscribed"):
        item = _timeline_item(staff, label)
        expect(item).to_have_count(1)
        notice = item.locator("div").filter(has=staff.locator("dt", has_text="Notice text"))
        expect(notice.locator("dd")).to_have_text(f"version {shown}")
        expect(notice.locator("dd a")).to_have_attribute("href", f"/policy/{shown}")
    # The topic chosen on the page is recorded against the same notice, as before.
    chosen = _timeline_item(staff, "Preference changed: Weekly digest")
    expect(chosen.locator("dd").filter(has_text="version")).to_have_text(f"version {shown}")
    _no_axe_violations(staff)
    _shoot(staff, "compliance-history", viewport["width"])
    _timeline_item(staff, "Notification permission granted").scroll_into_view_if_needed()
    _shoot(staff, "compliance-grant", viewport["width"], full_page=False)
