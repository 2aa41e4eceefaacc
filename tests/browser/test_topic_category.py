"""Adding a topic, at 1280 and 390 px: the category is chosen from those in use or added
explicitly ("news" beside "News" is refused, naming "News"), and a review step shows
what cannot change once the topic exists before anything is saved. Going back keeps
every value; the final POST redirects, so a reload creates nothing twice. axe-core finds
nothing on any of these states, and nothing scrolls sideways.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import DESKTOP, PHONE, SCREENSHOTS, LiveServer
from tests.browser.test_accessibility import TARGETS, _staff, axe_results, page_overflow

pytestmark = pytest.mark.browser

SHOTS = SCREENSHOTS / "category"
WIDTHS = pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=lambda v: f"{v['width']}px")


def _admin(new_context: Callable[..., Any], server: LiveServer, viewport: dict[str, int]) -> Page:
    def sized(**options: Any) -> Any:
        options["viewport"] = viewport
        return new_context(**options)

    page = _staff(sized, server, roles=("admin",))
    page.goto("/staff/admin/topics/new")
    return page


def _checked(page: Page, name: str, viewport: dict[str, int]) -> None:
    results = axe_results(page)
    assert results.violations_count == 0, results.generate_report()
    found = page_overflow(page)
    assert found["scroll"] <= 0 and not found["wide"], found
    assert page.evaluate(TARGETS) == []
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SHOTS / f"{name}-{viewport['width']}.png", full_page=True)


def _fill(page: Page, slug: str, label: str) -> None:
    page.fill("#slug", slug)
    page.fill("#label", label)
    page.fill("#description", "What is new, once a month.")
    page.check("#topic_class")  # marketing
    page.check("#default_state")  # off until chosen


def _count(server: LiveServer, slug: str) -> int:
    return int(server.scalar("SELECT count(*) FROM topic WHERE slug = :s", s=slug))


@WIDTHS
def test_a_topic_joins_a_category_in_use_after_a_review(viewport, new_context, server):
    page = _admin(new_context, server, viewport)
    choices = page.locator("input[name=category]")
    assert [choices.nth(i).input_value() for i in range(choices.count())] == [
        "Your account",
        "News",
        "Offers",
        "",
    ]
    expect(page.get_by_label("A new category")).to_be_visible()
    _fill(page, "monthly-summary", "Monthly summary")
    page.get_by_label("News", exact=True).check()
    _checked(page, "form-filled", viewport)
    page.get_by_role("button", name="Continue").click()

    expect(page.get_by_role("heading", level=1)).to_have_text(
        "Check the new topic before you create it"
    )
    fixed = page.locator(
        "section", has=page.get_by_role("heading", name="Cannot change once created")
    )
    rows = fixed.locator(".summary-list__row")
    expect(rows).to_have_count(4)
    for i, (term, shown) in enumerate(
        [
            ("Slug", "monthly-summary"),
            ("Category", "News"),
            ("Class", "Marketing"),
            ("Default", "Off until the person turns it on"),
        ]
    ):
        expect(rows.nth(i).locator("dt")).to_have_text(term)
        expect(rows.nth(i).locator("dd")).to_contain_text(shown)
        expect(rows.nth(i).locator(".tag")).to_have_text("Cannot change")
    expect(fixed).to_contain_text("A category in use: the topic joins its heading.")
    later = page.locator("section", has=page.get_by_role("heading", name="Can change later"))
    expect(later).to_contain_text("Monthly summary")
    assert _count(server, "monthly-summary") == 0  # the review wrote nothing
    _checked(page, "review-existing-category", viewport)

    # Going back keeps every value.
    page.get_by_role("button", name="Go back and change").click()
    expect(page.locator("#slug")).to_have_value("monthly-summary")
    expect(page.get_by_label("News", exact=True)).to_be_checked()
    expect(page.locator("#label")).to_have_value("Monthly summary")
    expect(page.locator("#description")).to_have_value("What is new, once a month.")
    expect(page.locator("#topic_class")).to_be_checked()
    expect(page.locator("#default_state")).to_be_checked()
    assert page.locator(".error-summary").count() == 0
    _checked(page, "form-after-going-back", viewport)

    page.get_by_role("button", name="Continue").click()
    with page.expect_response("**/staff/admin/topics/new") as answered:
        page.get_by_role("button", name="Create topic").click()
    assert answered.value.status == 303
    expect(page).to_have_url(f"{server.url}/staff/admin/topics")
    expect(page.locator(".banner")).to_have_text("Topic monthly-summary added under News.")
    news = page.locator("table", has=page.locator("caption", has_text="News"))
    expect(news).to_contain_text("monthly-summary")
    assert _count(server, "monthly-summary") == 1
    _checked(page, "created", viewport)

    # A reload asks for the list again: nothing is created twice.
    with page.expect_response("**/staff/admin/topics") as reloaded:
        page.reload()
    assert reloaded.value.request.method == "GET"
    assert _count(server, "monthly-summary") == 1
    audited = server.scalar(
        "SELECT count(*) FROM staff_audit WHERE action = 'topic.created' "
        "AND target = 'topic:monthly-summary'"
    )
    assert audited == 1


@WIDTHS
def test_news_beside_news_is_refused_and_a_new_category_is_added_explicitly(
    viewport, new_context, server
):
    page = _admin(new_context, server, viewport)
    _fill(page, "local-events", "Local events")
    page.get_by_label("A new category").check()
    page.fill("#new_category", "news")
    page.get_by_role("button", name="Continue").click()

    summary = page.locator(".error-summary")
    expect(summary).to_be_focused()
    expect(summary.locator("a")).to_have_text(
        'There is a category "News" already: choose "News" rather than adding "news"'
    )
    expect(page.locator("#new_category-error")).to_contain_text('choose "News"')
    expect(page.locator("#new_category")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#new_category")).to_have_value("news")
    assert _count(server, "local-events") == 0
    _checked(page, "refused-near-duplicate", viewport)
    summary.locator("a").click()
    expect(page.locator("#new_category")).to_be_focused()

    page.fill("#new_category", "Events")
    page.get_by_role("button", name="Continue").click()
    category = page.locator(".summary-list__row", has=page.locator("dt", has_text="Category"))
    expect(category.locator("dd")).to_contain_text("Events")
    expect(category).to_contain_text("A new category: people will see a new heading, “Events”.")
    _checked(page, "review-new-category", viewport)
    page.get_by_role("button", name="Create topic").click()
    expect(page.locator(".banner")).to_have_text("Topic local-events added under Events.")
    expect(page.locator("caption", has_text="Events")).to_be_visible()
    assert server.scalar("SELECT category FROM topic WHERE slug = 'local-events'") == "Events"
