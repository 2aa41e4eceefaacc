"""Test devices in Chromium at 1280 and 390 px: the page empty, with this browser
registered through the real page (permission granted, the real service worker, the push
stub's subscription), refusing a registration, and the review page's choice of devices
and its answer after a test to them. axe-core finds nothing in any of these states,
nothing scrolls sideways, every control is large enough.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from portal.push.transport import PushResponse
from portal.seams import current_portal
from tests.browser.conftest import DESKTOP, PHONE, SCREENSHOTS, LiveServer, calls
from tests.browser.test_accessibility import TARGETS, _staff, axe_results, page_overflow

pytestmark = pytest.mark.browser

SHOTS = SCREENSHOTS / "testdevices"
WIDTHS = pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=lambda v: f"{v['width']}px")
EMAIL = "tester@example.test"


class ScriptedTransport:
    """Answers each test in order: 201 for the first device, 410 for a second."""

    def __init__(self, statuses: tuple[int, ...]) -> None:
        self.statuses = statuses
        self.sent: list[Any] = []

    def send(self, request: Any) -> PushResponse:
        return self.send_batch([request])[0]

    def send_batch(self, requests: Iterable[Any]) -> list[PushResponse]:
        batch = list(requests)
        self.sent.extend(batch)
        return [PushResponse(self.statuses[i % len(self.statuses)]) for i in range(len(batch))]

    def close(self) -> None:
        pass


def sized(new_context: Callable[..., Any], viewport: dict[str, int] | None) -> Callable[..., Any]:
    def make(**options: Any) -> Any:
        if viewport:
            options["viewport"] = viewport
        return new_context(**options)

    return make


def empty(viewport: dict[str, int] | None = None) -> Callable[..., Page]:
    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        page = _staff(sized(new_context, viewport), server, email=EMAIL, roles=("campaigns",))
        page.goto("/staff/campaigns/test-devices")
        page.wait_for_selector("text=You have no test devices yet")
        return page

    return reach


def registered(viewport: dict[str, int] | None = None) -> Callable[..., Page]:
    """This browser registered through the page: the permission prompt (granted), the
    service worker, the subscription, the form."""

    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        page = empty(viewport)(new_context, server)
        page.fill("#device-name", "Work laptop, Chromium")
        page.click("#register-button")
        page.wait_for_selector("text=This browser is registered as", timeout=30_000)
        return page

    return reach


def refused(viewport: dict[str, int] | None = None) -> Callable[..., Page]:
    """A registration without a name: the error summary, the field marked."""

    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        page = empty(viewport)(new_context, server)
        page.click("#register-button")
        page.wait_for_selector(".error-summary", timeout=30_000)
        return page

    return reach


def _second_device(server: LiveServer) -> None:
    """Another of the tester's browsers, registered elsewhere (straight in the database)."""
    from portal.campaigns import testdevices
    from portal.db import db
    from portal.staff import services
    from portal.subscriptions.validation import HostAllowList, validate_subscription
    from tests.factories import SubscriptionFactory

    app = server.app
    settings = current_portal(app).settings
    subscription = validate_subscription(
        SubscriptionFactory()("autopush").to_json(),
        allowed=HostAllowList(settings.push_allowed_hosts),
        max_length=settings.endpoint_max_length,
    )
    with app.app_context(), db.begin() as session:
        staff = services.find_by_email(session, EMAIL)
        assert staff is not None
        testdevices.register(
            session,
            staff.id,
            "Phone, Firefox",
            subscription,
            user_agent="Mozilla/5.0 (Android 14; Mobile; rv:133.0) Gecko/133.0 Firefox/133.0",
            keys=current_portal(app).keys,
            now=current_portal(app).clock.now(),
        )


def review(viewport: dict[str, int] | None = None) -> Callable[..., Page]:
    """The review page with two test devices to choose from."""

    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        page = registered(viewport)(new_context, server)
        _second_device(server)
        page.goto("/staff/campaigns/new")
        page.select_option("#topic", "weekly-digest")
        page.fill("#title", "Monday digest")
        page.fill("#body", "Five things this week.")
        page.fill("#image", "/static/img/icon.svg")
        page.fill("#action1_title", "Read it")
        page.fill("#action1_url", "/news")
        page.click("button[value=review]")
        page.wait_for_selector("text=Which of your test devices")
        return page

    return reach


def after_a_test(viewport: dict[str, int] | None = None) -> Callable[..., Page]:
    """After a test to both: the first accepted, the second gone (410)."""

    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        page = review(viewport)(new_context, server)
        send_to_both(page, server)
        return page

    return reach


def send_to_both(page: Page, server: LiveServer) -> None:
    transport = ScriptedTransport((201, 410))
    current_portal(server.app).transport_factory = lambda portal: transport
    page.check("#device")
    page.locator(".device-test input[name=device]").nth(1).check()
    page.click("text=Send test to the chosen devices")
    page.wait_for_selector("text=What each device's push service answered")
    assert len(transport.sent) == 2


def _checked(page: Page, name: str, viewport: dict[str, int], part: str | None = None) -> None:
    page.wait_for_load_state("load")
    results = axe_results(page)
    assert results.violations_count == 0, results.generate_report()
    found = page_overflow(page)
    assert found["scroll"] <= 0 and not found["wide"], found
    assert page.evaluate(TARGETS) == []
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SHOTS / f"{name}-{viewport['width']}.png", full_page=True)
    if part:
        page.locator(part).screenshot(path=SHOTS / f"{name}-{viewport['width']}-part.png")


@WIDTHS
def test_the_empty_page_then_this_browser_registered(viewport, new_context, server):
    page = empty(viewport)(new_context, server)
    expect(page.locator("h1")).to_have_text("Test devices")
    _checked(page, "test-devices-empty", viewport)

    page.fill("#device-name", "Work laptop, Chromium")
    page.click("#register-button")
    page.wait_for_selector("text=This browser is registered as", timeout=30_000)
    expect(page.locator("table.test-devices tbody tr")).to_have_count(1)
    expect(page.locator("table.test-devices")).to_contain_text("Work laptop, Chromium")
    expect(page.locator("table.test-devices")).to_contain_text("Never tested")
    # The row of this very browser says so (its endpoint's SHA-256 matches).
    expect(page.locator("table.test-devices [data-this-browser]")).to_be_visible()
    # The real service worker was registered and the subscription asked for once.
    assert page.evaluate("navigator.serviceWorker.getRegistration('/').then(r => !!r)")
    assert len(calls(page, "subscribe")) == 1
    _checked(page, "test-devices-one", viewport)
    (row,) = server.rows("SELECT name, push_service, user_agent FROM staff_test_device")
    assert row.name == "Work laptop, Chromium"
    assert "Chrome" in row.user_agent
    assert server.scalar("SELECT count(*) FROM push_subscription") == 0

    # The next page's heartbeat leaves the subscription in the browser.
    page.evaluate("localStorage.removeItem('portal.heartbeatAt')")
    page.goto("/staff/")
    page.wait_for_load_state("load")
    page.wait_for_timeout(500)
    assert calls(page, "unsubscribe") == []


@WIDTHS
def test_a_refused_registration(viewport, new_context, server):
    page = refused(viewport)(new_context, server)
    expect(page.locator(".error-summary")).to_contain_text("Enter a name for this device")
    expect(page.locator("#device-name")).to_have_attribute("aria-invalid", "true")
    assert page.title().startswith("Error: ")
    _checked(page, "test-devices-error", viewport)
    assert server.scalar("SELECT count(*) FROM staff_test_device") == 0


def test_a_browser_that_refuses_notifications_is_told_so(new_context, server):
    page = _staff(
        lambda **o: new_context(permission=False, **o), server, email=EMAIL, roles=("campaigns",)
    )
    page.context.clear_permissions()
    page.goto("/staff/campaigns/test-devices")
    page.evaluate(
        "Notification.requestPermission = () => Promise.resolve('denied')"
    )  # what a person's "Block" answers
    page.fill("#device-name", "Laptop")
    page.click("#register-button")
    expect(page.locator("#register-status")).to_contain_text("Notifications are blocked")
    assert server.scalar("SELECT count(*) FROM staff_test_device") == 0


@WIDTHS
def test_the_review_page_chooses_devices_and_says_what_each_answered(viewport, new_context, server):
    page = review(viewport)(new_context, server)
    boxes = page.locator(".device-test input[type=checkbox][name=device]")
    expect(boxes).to_have_count(2)
    expect(page.locator(".device-test input[name=device]:checked")).to_have_count(0)
    expect(page.locator(".device-test")).to_contain_text("Work laptop, Chromium")
    expect(page.locator(".device-test")).to_contain_text("Phone, Firefox")
    _checked(page, "review-devices", viewport, part=".device-test")

    send_to_both(page, server)
    outcomes = page.locator("table.device-outcomes")
    expect(outcomes).to_contain_text("Sent")
    expect(outcomes).to_contain_text("Gone")
    expect(page.locator(".device-test .banner")).to_contain_text(
        "1 of 2 accepted by the push service, 1 gone"
    )
    expect(page.locator(".device-test")).to_contain_text("Gone, so not offered: “Phone, Firefox”")
    expect(page.locator(".device-test input[name=device]")).to_have_count(1)
    _checked(page, "review-devices-tested", viewport, part=".device-test")
    assert server.scalar("SELECT count(*) FROM campaign") == 0
    assert server.scalar("SELECT count(*) FROM delivery") == 0
    sent = server.scalar("SELECT outcomes FROM staff_test_send")
    sent = json.loads(sent) if isinstance(sent, str) else sent  # text on SQLite
    assert [o["result"] for o in sent] == ["sent", "gone"]
