"""At 1280 and 390 px: a new member of staff is sent to choose their own password at first
sign-in and no other staff page opens until they do; the audit trail names a policy
published on the command line by its actor (the command line and the operating-system
user) and shows its detail as labelled fields with the versions linked. axe-core finds
nothing in any of these states, and nothing scrolls sideways."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import DESKTOP, PHONE, SCREENSHOTS, LiveServer
from tests.browser.test_accessibility import (
    GIVEN_PASSWORD,
    TARGETS,
    audit_after_cli_publish,
    axe_results,
    first_sign_in,
    page_overflow,
)

pytestmark = pytest.mark.browser

SHOTS = SCREENSHOTS / "staffaudit"
WIDTHS = pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=lambda v: f"{v['width']}px")
OWN_PASSWORD = "a passphrase only I know"


def _sized(new_context: Callable[..., Any], viewport: dict[str, int]) -> Callable[..., Any]:
    def sized(**options: Any) -> Any:
        options["viewport"] = viewport
        return new_context(**options)

    return sized


def _checked(page: Page, name: str, viewport: dict[str, int]) -> None:
    """axe-core finds nothing, nothing scrolls sideways, targets are large enough; a
    full-page screenshot kept."""
    results = axe_results(page)
    assert results.violations_count == 0, results.generate_report()
    found = page_overflow(page)
    assert found["scroll"] <= 0 and not found["wide"], found
    assert page.evaluate(TARGETS) == []
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SHOTS / f"{name}-{viewport['width']}.png", full_page=True)


@WIDTHS
def test_first_sign_in_is_sent_to_choose_a_password_and_nothing_else_opens(
    viewport, new_context, server: LiveServer
):
    page = first_sign_in(_sized(new_context, viewport), server)
    expect(page.locator("h1")).to_have_text("Choose your own password")
    expect(page.locator("#replace-password-reason")).to_contain_text(
        "Your password was set by someone else"
    )
    expect(page.locator(".staff-nav__links")).to_have_count(0)  # no way round it offered
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()
    _checked(page, "first-sign-in", viewport)

    for path in ("/staff/", "/staff/admin/staff", "/staff/admin/audit"):
        page.goto(path)
        expect(page).to_have_url(f"{server.url}/staff/password")

    for field in ("#current_password", "#new_password", "#confirm_password"):
        page.fill(field, GIVEN_PASSWORD)
    page.click("main button[type=submit]")
    summary = page.locator(".error-summary")
    expect(summary).to_contain_text("Your new password must be different from your current one")
    _checked(page, "first-sign-in-same-password", viewport)

    page.fill("#current_password", GIVEN_PASSWORD)
    page.fill("#new_password", OWN_PASSWORD)
    page.fill("#confirm_password", OWN_PASSWORD)
    page.click("main button[type=submit]")
    expect(page).to_have_url(f"{server.url}/staff/")
    expect(page.locator(".banner")).to_contain_text("Your password has been changed")
    page.goto("/staff/admin/staff")
    expect(page.locator("h1")).to_have_text("Staff accounts")


@WIDTHS
def test_the_audit_trail_shows_a_command_line_publish_readably(
    viewport, new_context, server: LiveServer
):
    page = audit_after_cli_publish(_sized(new_context, viewport), server)
    rows = page.locator("main tbody tr")
    expect(rows).to_have_count(1)
    row = rows.first
    expect(row.locator("td").nth(1)).to_have_text("command line (os user: deploy)")
    expect(row.locator("td").nth(2)).to_have_text("Policy version published")
    target = row.locator("td").nth(3).get_by_role("link", name="Policy version: 2026-02")
    expect(target).to_have_attribute("href", "/staff/admin/policies/versions/2026-02")
    detail = row.locator("td").nth(4)
    expect(detail.get_by_role("link", name="2026-01")).to_have_attribute(
        "href", "/staff/admin/policies/versions/2026-01"
    )
    expect(detail).to_contain_text("Previous version: 2026-01")
    expect(detail).to_contain_text("Lines added: 2")
    expect(detail).not_to_contain_text("{")
    _checked(page, "audit-command-line-publish", viewport)

    target.click()
    expect(page.locator("h1")).to_contain_text("2026-02")
