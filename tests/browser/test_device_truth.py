"""The subscribe page and the preference centre say the truth about this browser.

Each asks the server on load about the subscription the browser holds (the status
route, with its auth secret and device cookie), rather than trusting a check-in that
runs at most hourly; after "Stop notifications on this device" and after an erasure the
browser lets go of its subscription at once. At 1280 and 390 px, axe-core clean.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import Page, expect

from tests.browser.conftest import (
    DESKTOP,
    PHONE,
    SCREENSHOTS,
    LiveServer,
    calls,
    subscribe_through_page,
)
from tests.browser.test_accessibility import TARGETS, axe_results, page_overflow

pytestmark = pytest.mark.browser

SHOTS = SCREENSHOTS / "truth"
WIDTHS = pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=lambda v: f"{v['width']}px")
# The browser's own answer, not the page's: the push subscription it holds.
HOLDS_NONE = """async () => {
  const registration = await navigator.serviceWorker.getRegistration('/');
  return registration === undefined || (await registration.pushManager.getSubscription()) === null;
}"""


def _let_go(page: Page, within: float = 5.0) -> bool:
    """Whether the browser holds no push subscription, waiting up to ``within`` seconds
    for it to let go (page.wait_for_function would not wait for the promise)."""
    deadline = time.monotonic() + within
    while True:
        if page.evaluate(HOLDS_NONE):
            return True
        if time.monotonic() > deadline:
            return False
        page.wait_for_timeout(100)


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


def _page(new_context: Callable[..., Any], viewport: dict[str, int], **options: Any) -> Page:
    return new_context(viewport=viewport, **options).new_page()


def _settled(page: Page, path: str) -> None:
    page.goto(path)
    page.wait_for_load_state("networkidle")


def _shown_state(page: Page) -> list[str]:
    return page.eval_on_selector_all(
        "#subscribe-page [data-state]:not([hidden])", "panels => panels.map(p => p.id)"
    )


@WIDTHS
def test_after_stopping_this_device_the_subscribe_page_says_it_is_not_subscribed(
    new_context, server: LiveServer, viewport
):
    page = _page(new_context, viewport)
    subscribe_through_page(page)
    page.goto("/preferences")
    page.click("text=Stop notifications on this device")
    page.wait_for_selector(".banner--success")
    assert server.scalar("SELECT state FROM push_subscription") == "revoked"

    _settled(page, "/")
    assert _shown_state(page) == ["state-stopped"]
    assert "This browser gets our notifications" not in page.inner_text("main")
    assert "Notifications are stopped in this browser" in page.inner_text("#state-stopped")
    assert page.is_visible("#subscribe-button")  # and it may turn them on again
    assert _let_go(page), "the browser still holds its push subscription"
    _checked(page, "subscribe-stopped", viewport)


@WIDTHS
def test_the_preference_centre_says_whether_this_device_receives(
    new_context, server: LiveServer, viewport
):
    page = _page(new_context, viewport)
    subscribe_through_page(page)
    _settled(page, "/preferences")
    receiving = page.locator("#this-device [data-device-says=receiving]")
    assert receiving.is_visible()
    assert "This device gets your notifications." in receiving.inner_text()
    row = page.locator("table.stack tr", has_text="(this device)")
    assert row.locator("td[data-label=Status]").inner_text() == "Receiving"
    _checked(page, "preferences-this-device-receiving", viewport)

    page.click("text=Stop notifications on this device")
    page.wait_for_selector(".banner--success")
    # The answer page asks the server and the browser lets go at once.
    assert _let_go(page), "the browser still holds its push subscription"
    assert len(calls(page, "unsubscribe")) == 1
    page.wait_for_selector("#this-device[data-device-status=not-receiving]")
    assert page.locator("#this-device [data-device-says=not-receiving]").is_visible()
    assert not page.is_visible("text=Stop notifications on this device")  # nothing to stop
    _checked(page, "preferences-this-device-stopped", viewport)

    # A browser that holds no subscription is not receiving, whatever the record says.
    subscribe_through_page(page)
    page.evaluate("localStorage.removeItem('__pushStub.subscribed')")
    _settled(page, "/preferences")
    assert page.locator("#this-device [data-device-says=not-receiving]").is_visible()
    assert not page.is_visible("text=Stop notifications on this device")
    # The devices table says the same of this browser's row, not the server's "Receiving".
    row = page.locator("table.stack tr", has_text="(this device)")
    assert row.locator("td[data-label=Status]").inner_text() == "Not receiving in this browser"
    _checked(page, "preferences-this-device-not-held", viewport)


@WIDTHS
def test_a_device_stopped_elsewhere_is_said_on_the_subscribe_page_at_once(
    new_context, server: LiveServer, viewport
):
    """The issue as reported: stopped while the browser still holds its subscription
    and the hourly check-in has just run; the subscribe page asks anyway."""
    page = _page(new_context, viewport)
    subscribe_through_page(page)  # counts as the latest check-in
    with server.session() as session, session.begin():
        session.execute(
            sa.text(
                "UPDATE push_subscription SET state = 'revoked', end_reason = 'unsubscribed',"
                " revoked_at = CURRENT_TIMESTAMP, ended_at = CURRENT_TIMESTAMP"
            )
        )
    with page.expect_response("**/api/push/status") as answered:
        page.goto("/")
    assert answered.value.json() == {"status": "stopped", "action": "unsubscribe"}
    page.wait_for_selector("#state-stopped:not([hidden])")
    assert _shown_state(page) == ["state-stopped"]
    assert _let_go(page), "the browser still holds its push subscription"
    assert server.scalar("SELECT browser_told_at FROM push_subscription") is not None


@WIDTHS
def test_after_erasure_the_browser_lets_go_at_once_and_the_subscribe_page_says_so(
    new_context, server: LiveServer, viewport
):
    page = _page(new_context, viewport)
    subscribe_through_page(page)
    page.goto("/preferences/erase")
    page.check("#erase-confirm")
    page.click("button[type=submit]")
    page.wait_for_selector("text=Download your receipt")
    # Right after the erasure page: the browser holds no subscription any more.
    assert _let_go(page), "the browser still holds its push subscription"
    assert len(calls(page, "unsubscribe")) == 1
    page.wait_for_selector("#this-device[data-device-status=not-receiving]")
    assert "We send nothing to this browser any more." in page.inner_text("#this-device")
    assert server.scalar("SELECT browser_told_at FROM push_subscription") is not None
    _checked(page, "erased-this-browser", viewport)

    _settled(page, "/")
    assert _shown_state(page) == ["state-erased"]
    assert "Your data was erased" in page.inner_text("#state-erased")
    assert "This browser gets our notifications" not in page.inner_text("main")
    assert page.is_visible("#subscribe-button")
    _checked(page, "subscribe-erased", viewport)


@WIDTHS
def test_a_subscription_the_server_does_not_know_is_dropped_and_offered_again(
    new_context, server: LiveServer, viewport
):
    page = _page(new_context, viewport)
    subscribe_through_page(page)
    with server.session() as session, session.begin():  # purged long after it ended
        session.execute(sa.text("DELETE FROM push_subscription"))
    with page.expect_response("**/api/push/status") as answered:
        page.goto("/")
    assert answered.value.json() == {"status": "unknown", "action": "unsubscribe"}
    page.wait_for_selector("#state-not-subscribed:not([hidden])")
    assert _let_go(page), "the browser still holds its push subscription"
    assert len(calls(page, "subscribe")) == 1  # not registered again unasked
    assert page.is_visible("#subscribe-button")
    _checked(page, "subscribe-not-subscribed", viewport)


@WIDTHS
def test_a_server_that_does_not_answer_is_said_and_can_be_asked_again(
    new_context, server: LiveServer, viewport
):
    page = _page(new_context, viewport)
    subscribe_through_page(page)
    page.route("**/api/push/status", lambda route: route.abort("internetdisconnected"))
    page.goto("/")
    page.wait_for_selector("#state-check-failed:not([hidden])")
    assert page.title().startswith("Error: ")
    _checked(page, "subscribe-check-failed", viewport)
    page.unroute("**/api/push/status")
    page.click("#check-retry-button")
    page.wait_for_selector("#state-subscribed:not([hidden])")
    assert page.evaluate(HOLDS_NONE) is False


@WIDTHS
def test_without_javascript_the_pages_say_what_the_server_knows(
    new_context, server: LiveServer, browser_subscription, viewport
):
    context = new_context(
        java_script_enabled=False, stub=False, permission=False, viewport=viewport
    )
    response = context.request.post(
        "/api/push/subscribe", data={"subscription": browser_subscription.to_json()}
    )
    assert response.status == 201
    page = context.new_page()
    page.goto("/")
    assert "Our records say this browser gets our notifications" in page.inner_text(
        "#server-status"
    )
    page.goto("/preferences")
    assert page.is_visible("#this-device [data-device-says=receiving]")
    # A form post: the checks wait for the page it leads to (click returns once the
    # navigation starts, before that page's elements are there).
    with page.expect_navigation():
        page.click("text=Stop notifications on this device")
    expect(page.locator("#this-device [data-device-says=not-receiving]")).to_be_visible()
    expect(page.locator("text=Stop notifications on this device")).to_be_hidden()
    page.goto("/")
    assert "Notifications are stopped in this browser" in page.inner_text("#server-status")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(
        path=SHOTS / f"subscribe-stopped-no-javascript-{viewport['width']}.png", full_page=True
    )
