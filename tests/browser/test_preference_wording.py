"""What the preference centre says about each topic, and about a changed notice, in
Chromium at 1280 and 390 px: the words are true, and axe-core finds nothing."""

from __future__ import annotations

import datetime as dt

import pytest
from playwright.sync_api import Page

from tests.browser.conftest import DESKTOP, PHONE, SCREENSHOTS, subscribe_through_page
from tests.browser.test_accessibility import axe_problems, styled
from tests.browser.test_preference_centre import publish_new_policy

pytestmark = pytest.mark.browser

SHOTS = SCREENSHOTS / "wording"
WIDTHS = pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=lambda v: str(v["width"]))


def _shot(page: Page, name: str) -> None:
    """Screenshots for people to look at, where the notes folder exists."""
    if SHOTS.parent.is_dir():
        SHOTS.mkdir(parents=True, exist_ok=True)
        width = (page.viewport_size or DESKTOP)["width"]
        page.screenshot(path=SHOTS / f"{name}-{width}.png", full_page=True)


def _states(page: Page) -> dict[str, str]:
    return {
        element.get_attribute("id").removeprefix("topic-").removesuffix("-state"): (
            element.inner_text().strip()
        )
        for element in page.locator(".choice__state").all()
    }


def _today() -> str:
    return f"{dt.datetime.now(dt.UTC):%d %B %Y}"


def _no_sideways_scroll(page: Page) -> None:
    assert styled(page).evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0


@WIDTHS
def test_topics_nobody_touched_never_say_you_turned_them_off(viewport, new_context):
    page = new_context(viewport=viewport).new_page()
    subscribe_through_page(page)  # nothing ticked
    page.goto("/preferences")
    states = _states(page)
    for slug in ("weekly-digest", "product-news", "offers"):
        assert states[slug] == (
            f"Off: you left this unticked when you subscribed on {_today()}, "
            "under notice version 2026-01."
        )
    assert states["security-alerts"].startswith("On by default for account messages")
    assert all("you turned" not in sentence for sentence in states.values())
    assert axe_problems(page) == []
    _no_sideways_scroll(page)
    _shot(page, "preferences-untouched")


@WIDTHS
def test_a_chosen_topic_says_when_and_under_which_notice(viewport, new_context):
    page = new_context(viewport=viewport).new_page()
    subscribe_through_page(page, topics=("offers",))
    page.goto("/preferences")
    page.check("#topic-weekly-digest")
    with page.expect_navigation():  # a form post: wait for the page it leads to
        page.click("text=Save my choices")
    page.wait_for_selector(".banner--success")
    states = _states(page)
    chosen = f"On: you chose this on {_today()}, under notice version 2026-01."
    assert states["offers"] == chosen
    assert states["weekly-digest"] == chosen
    assert all(" on on " not in sentence for sentence in states.values())
    assert axe_problems(page) == []
    _no_sideways_scroll(page)
    _shot(page, "preferences-chosen")


@WIDTHS
def test_a_new_notice_shows_what_changed_and_keeping_the_choices_confirms_them(
    viewport, new_context, server
):
    page = new_context(viewport=viewport).new_page()
    subscribe_through_page(page, topics=("offers",))
    publish_new_policy(server)
    page.goto("/preferences")

    section = page.locator("#notice-changes")
    assert section.is_visible()
    assert "Changes from notice version 2026-01 to version 2026-02" in section.inner_text()
    added = section.locator("ins")
    assert added.all_inner_texts() == ["We now also send a monthly summary, if you ask for it."]
    assert section.locator("del").count() >= 1
    assert axe_problems(page) == []
    _no_sideways_scroll(page)
    _shot(page, "preferences-notice-changed")

    # The full text is one link away, text first and its digest folded away.
    page.click("text=Read the full notice, version 2026-02")
    page.wait_for_selector("h1:has-text('Notice version 2026-02')")
    assert page.locator(".policy__text").inner_text().startswith("We now also send")
    digest = page.locator("details code")
    assert not digest.is_visible()
    assert axe_problems(page) == []
    _no_sideways_scroll(page)
    _shot(page, "policy-page")
    page.click("details summary")
    assert len(digest.inner_text()) == 64
    assert axe_problems(page) == []
    _no_sideways_scroll(page)
    _shot(page, "policy-page-digest-open")
    page.go_back()

    with page.expect_navigation():  # a form post: wait for the page it leads to
        page.click("text=Keep my choices under version 2026-02")
    assert "kept under notice version 2026-02" in page.inner_text(".banner--success")
    assert page.locator("#notice-changes").count() == 0
    states = _states(page)
    assert states["offers"] == f"On: you chose this on {_today()}, under notice version 2026-02."
    for slug in ("weekly-digest", "product-news"):  # kept off when confirming
        assert (
            states[slug] == f"Off: you said no to this on {_today()}, under notice version 2026-02."
        )
    assert all("you turned" not in sentence for sentence in states.values())
    versions = server.rows("SELECT DISTINCT policy_version FROM topic_preference")
    assert [tuple(row) for row in versions] == [("2026-02",)]
    assert axe_problems(page) == []
    _shot(page, "preferences-notice-confirmed")


@WIDTHS
def test_a_save_opened_before_the_new_notice_shows_what_changed(viewport, new_context, server):
    page = new_context(viewport=viewport).new_page()
    subscribe_through_page(page, topics=("offers",))
    page.goto("/preferences")
    page.check("#topic-product-news")
    publish_new_policy(server)
    with page.expect_navigation():  # a form post: wait for the page it leads to
        page.click("text=Save my choices")
    page.wait_for_selector(".error-summary")
    assert "What changed since you opened this page" in page.inner_text(".policy")
    assert page.locator(".policy ins").all_inner_texts() == [
        "We now also send a monthly summary, if you ask for it."
    ]
    assert page.is_checked("#topic-product-news")  # kept, not saved
    assert axe_problems(page) == []
    _no_sideways_scroll(page)
    _shot(page, "preferences-stale-save")
    page.check("#policy-ack")
    with page.expect_navigation():  # a form post: wait for the page it leads to
        page.click("text=Save my choices")
    page.wait_for_selector(".banner--success")
    assert _states(page)["product-news"] == (
        f"On: you chose this on {_today()}, under notice version 2026-02."
    )
