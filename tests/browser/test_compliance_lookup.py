"""The compliance look-up as an officer uses it, at 1280 and 390 px: a person found by the
reference they read on their own preference centre, everyone whose account ID starts the
same way over two pages, an erased person by the receipt ID on their erasure page, a
search that finds nobody and one the look-up refuses. axe-core finds nothing in any state,
nothing scrolls sideways, and every state's screenshot is kept.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from portal.db import db
from portal.seams import current_portal
from tests.browser.conftest import DESKTOP, PHONE, SCREENSHOTS, LiveServer, subscribe_through_api
from tests.browser.test_accessibility import (
    BROKEN_WORDS,
    TARGETS,
    PageState,
    _staff,
    axe_results,
    error_summary_problems,
    page_overflow,
)
from tests.factories import SubscriptionFactory, make_accounts, make_subscriber

pytestmark = pytest.mark.browser

SHOTS = SCREENSHOTS / "lookup"
WIDTHS = pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=lambda v: f"{v['width']}px")
REFERENCE = re.compile(r"^[0-9A-HJKMNP-TV-Z]{4}-[0-9A-HJKMNP-TV-Z]{4}$")


def _sized(new_context: Callable[..., Any], viewport: dict[str, int]) -> Callable[..., Any]:
    def make(**options: Any) -> Any:
        options["viewport"] = viewport
        return new_context(**options)

    return make


def _officer(new_context: Callable[..., Any], server: LiveServer, viewport: dict[str, int]) -> Page:
    page = _staff(_sized(new_context, viewport), server, roles=("compliance",))
    page.goto("/staff/compliance/lookup")
    return page


def _search(page: Page, text: str) -> None:
    page.fill("#q", text)
    page.locator("form[role=search] button[type=submit]").click()
    page.wait_for_load_state("load")


def _checked(page: Page, name: str, viewport: dict[str, int]) -> None:
    """axe-core finds nothing, nothing scrolls sideways, targets are large enough; a
    full-page screenshot kept."""
    page.wait_for_load_state("load")
    results = axe_results(page)
    assert results.violations_count == 0, results.generate_report()
    found = page_overflow(page)
    assert found["scroll"] <= 0 and not found["wide"], found
    assert page.evaluate(TARGETS) == []
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SHOTS / f"{name}-{viewport['width']}.png", full_page=True)


def _person_reads_their_reference(
    new_context: Callable[..., Any], viewport: dict[str, int]
) -> tuple[Page, str]:
    context = _sized(new_context, viewport)()
    subscribe_through_api(context, SubscriptionFactory()())
    page = context.new_page()
    page.goto("/preferences")
    line = page.locator(".reference-line")
    expect(line).to_contain_text("Your reference:")
    expect(line).to_contain_text("Quote it if you write to us")
    shown = page.locator(".reference-line .reference").inner_text()
    assert REFERENCE.match(shown), shown
    return page, shown


@WIDTHS
def test_a_person_is_found_by_the_reference_on_their_preference_centre(
    viewport, new_context, server
):
    person, shown = _person_reads_their_reference(new_context, viewport)
    _checked(person, "preference-centre-reference", viewport)
    person.reload()
    expect(person.locator(".reference-line .reference")).to_have_text(shown)  # it stays

    officer = _officer(new_context, server, viewport)
    # As it came in an e-mail: lower case, a space for the dash, O for zero.
    _search(officer, shown.lower().replace("-", " ").replace("0", "o"))
    assert "/staff/compliance/lookup?q=" in officer.url
    expect(officer.locator("#results-count")).to_have_text(
        "Showing 1–1 of 1 person, exact matches first."
    )
    row = officer.locator("main tbody tr")
    expect(row).to_have_count(1)
    expect(row.locator("td[data-label='Reference']")).to_have_text(shown)
    expect(row.locator("td[data-label='Matched by']")).to_have_text("Reference")
    _checked(officer, "lookup-by-reference", viewport)
    row.locator("a").click()
    officer.wait_for_url("**/staff/compliance/subscribers/*")
    expect(officer.locator(".summary-list")).to_contain_text(f"Reference{shown}")
    expect(officer.locator("#deliveries + .hint")).to_have_text(
        "Each delivery is kept until 13 months after its campaign finished; after that it "
        "is only counted with its campaign, not listed here."
    )
    _checked(officer, "person", viewport)
    if viewport == DESKTOP:
        # Tables of words at a desktop width: no word split across lines ("pendin/g").
        assert officer.evaluate(BROKEN_WORDS) == []


@WIDTHS
def test_an_account_id_prefix_pages_through_everyone(viewport, new_context, server):
    with db.begin(server.app) as session:
        for n in range(1, 26):
            make_subscriber(
                session, f"shop-{n:03d}", created_at=current_portal(server.app).clock.now()
            )
        make_subscriber(session, "shopping-list")  # starts otherwise
    officer = _officer(new_context, server, viewport)
    _search(officer, "shop-")
    counted = officer.locator("#results-count")
    expect(counted).to_have_text("Showing 1–20 of 25 people, exact matches first.")
    rows = officer.locator("main tbody tr")
    expect(rows).to_have_count(20)
    expect(rows.first).to_contain_text("Account shop-001")
    expect(officer.locator(".pagination")).to_contain_text("Page 1 of 2")
    assert officer.locator("a[rel=prev]").count() == 0
    _checked(officer, "lookup-prefix-page-1", viewport)

    officer.locator("a[rel=next]").click()
    officer.wait_for_url("**page=2")
    expect(counted).to_have_text("Showing 21–25 of 25 people, exact matches first.")
    expect(rows).to_have_count(5)
    expect(rows.last).to_contain_text("Account shop-025")
    assert officer.locator("a[rel=next]").count() == 0
    expect(officer.locator("main")).not_to_contain_text("shopping-list")
    _checked(officer, "lookup-prefix-page-2", viewport)
    officer.reload()  # a GET: reloading asks nothing and shows the same page
    expect(counted).to_have_text("Showing 21–25 of 25 people, exact matches first.")
    officer.locator("a[rel=prev]").click()
    officer.wait_for_url("**page=1")
    expect(counted).to_have_text("Showing 1–20 of 25 people, exact matches first.")


@WIDTHS
def test_a_broad_start_lists_the_first_thousand_and_asks_for_more(viewport, new_context, server):
    with db.begin(server.app) as session:
        make_accounts(session, [f"club-{n:04d}" for n in range(1, 1206)])
    officer = _officer(new_context, server, viewport)
    _search(officer, "club")
    counted = officer.locator("#results-count")
    expect(counted).to_have_text(
        "Showing 1–20 of the first 1,000 people found, exact matches first. More account "
        "IDs start with “club” than are listed: type more of the account ID to narrow the "
        "search."
    )
    expect(officer.locator(".pagination")).to_contain_text("Page 1 of 50")
    _checked(officer, "lookup-prefix-more", viewport)
    officer.goto(f"{officer.url}&page=50")
    expect(counted).to_contain_text("Showing 981–1,000 of the first 1,000 people found")
    rows = officer.locator("main tbody tr")
    expect(rows.last).to_contain_text("Account club-1000")
    assert officer.locator("a[rel=next]").count() == 0
    _search(officer, "club-1")  # narrowed: 206 of them, all listed
    expect(counted).to_have_text("Showing 1–20 of 206 people, exact matches first.")


@WIDTHS
def test_an_erased_person_is_found_by_their_receipt_id(viewport, new_context, server):
    person, _shown = _person_reads_their_reference(new_context, viewport)
    person.goto("/preferences/erase")
    person.check("#erase-confirm")
    person.click("button[type=submit]")
    person.wait_for_selector("text=Download your receipt")
    receipt_id = person.locator(".reference").inner_text()
    assert re.fullmatch(r"ER-\d+-[0-9A-F]{8}", receipt_id), receipt_id
    _checked(person, "erased-receipt-id", viewport)

    officer = _officer(new_context, server, viewport)
    _search(officer, receipt_id)
    row = officer.locator("main tbody tr")
    expect(row).to_have_count(1)
    expect(row.locator("td[data-label='Matched by']")).to_have_text("Erasure receipt ID")
    expect(row.locator("td[data-label='Status']")).to_contain_text("Erased on")
    expect(row.locator("td[data-label='Reference']")).to_have_text("Removed at erasure")
    _checked(officer, "lookup-by-receipt-id", viewport)
    row.locator("a").click()
    officer.wait_for_url("**/staff/compliance/subscribers/*")
    expect(officer.locator(".summary-list")).to_contain_text(f"Erasure receipt ID{receipt_id}")
    expect(officer.locator("main")).to_contain_text("Tombstone")


@WIDTHS
def test_a_search_that_finds_nobody_says_so(viewport, new_context, server):
    officer = _officer(new_context, server, viewport)
    _search(officer, "nobody-by-this-name")
    expect(officer.locator("#results-count")).to_have_text("Nobody matches “nobody-by-this-name”.")
    assert officer.locator("main table").count() == 0
    expect(officer.locator("#q")).to_have_value("nobody-by-this-name")
    _checked(officer, "lookup-no-results", viewport)


@WIDTHS
def test_a_refused_search_names_the_problem_by_the_box(viewport, new_context, server):
    officer = _officer(new_context, server, viewport)
    _search(officer, "ab")
    summary = officer.locator(".error-summary")
    expect(summary).to_contain_text("To search by the start of an account ID, type at least 3")
    expect(officer.locator("#q-error")).to_contain_text("No account ID is exactly “ab”")
    expect(officer.locator("#q")).to_have_attribute("aria-invalid", "true")
    _checked(officer, "lookup-refused", viewport)
    state = PageState("lookup-refused", lambda *_: officer, error_summary=True)
    assert error_summary_problems(officer, state) == []  # focused, and leads to the box
    officer.goto("/staff/compliance/lookup?q=shop&page=0")
    expect(summary).to_contain_text("The page is a whole number from 1")
    _checked(officer, "lookup-bad-page", viewport)
