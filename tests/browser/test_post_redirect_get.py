"""Reloading the answer to a form submits nothing again.

Every form of the product is filled in and submitted in Chromium as the person who uses it,
at 1280 and 390 px; then the answer page is reloaded. The reload must send no POST, the
work must have been done exactly once (counted in the database: an audit row, a consent
event, a test campaign; for a test send, one push at the push service once the dispatcher
runs), the answer must still show, and axe-core must find nothing on it. A one-time message (a flash) is gone after the
reload, as it should be: the page then shows the state the submission left.

Two POSTs are left out, as tests/walk/test_post_redirect_get.py allow-lists them: the
compliance look-up (a search, being made a GET) and the export (a download: the browser
stays on the form).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from playwright.sync_api import Page, Request

from portal.delivery.engine import Dispatcher
from portal.push.transport import PushResponse
from tests.browser.conftest import (
    DESKTOP,
    PHONE,
    SCREENSHOTS,
    LiveServer,
    subscribe_through_api,
)
from tests.browser.test_accessibility import (
    _account_link,
    _campaign_form,
    _campaign_page,
    _campaign_review_with_a_device,
    _colleague,
    _compliance_subscriber,
    _erase,
    _known,
    _known_device,
    _preferences_notice_changed,
    _staff,
    axe_problems,
)
from tests.factories import SubscriptionFactory

pytestmark = pytest.mark.browser

NewContext = Callable[..., Any]


@dataclass(frozen=True)
class FormCase:
    """A form: how to reach it (a Page showing it), how to submit it (returns once the
    answer shows ``answer``), and what it does, counted in the database."""

    name: str
    reach: Callable[[NewContext, LiveServer], Page]
    submit: Callable[[Page], None]
    done: str  # SQL counting what a submission does
    answer: str  # a selector the answer page shows
    # What the answer still shows once reloaded: a one-time message (a flash) is gone by
    # then, and the page shows the state it left; a receipt or a test send stays.
    kept: str = "main h1"

    def __str__(self) -> str:
        return self.name


def _audited(action: str) -> str:
    return f"SELECT count(*) FROM staff_audit WHERE action = '{action}'"


EVENTS = "SELECT count(*) FROM consent_event"


def _click(text: str, answer: str = ".banner") -> Callable[[Page], None]:
    def submit(page: Page) -> None:
        page.locator("main").get_by_role("button", name=text).first.click()
        page.wait_for_selector(answer)

    return submit


def _at(path: str) -> Callable[[NewContext, LiveServer], Page]:
    def reach(new_context: NewContext, server: LiveServer) -> Page:
        page = _staff(new_context, server)
        page.goto(path)
        return page

    return reach


def _subscriber(new_context: NewContext, server: LiveServer) -> Page:
    return _known(new_context)


def _how_often(page: Page) -> None:
    page.check("#how-often-one-a-day")
    _click("Save how often", ".banner--success")(page)


def _receiving_device(new_context: NewContext, server: LiveServer) -> Page:
    """The centre offers to stop this device only when this browser holds a subscription
    the server says receives: subscribed through the page, not only the API."""
    return _known_device(new_context)


def _two_devices(new_context: NewContext, server: LiveServer) -> Page:
    context = new_context()
    factory = SubscriptionFactory()
    subscribe_through_api(context, factory())
    subscribe_through_api(context, factory())  # the cookie's subscriber: the same person
    page = context.new_page()
    page.goto("/preferences")
    return page


def _stop_other(page: Page) -> None:
    page.locator("form[action*='/preferences/devices/'] button").first.click()
    page.wait_for_selector(".banner--success")


def _with_marketing(new_context: NewContext, server: LiveServer) -> Page:
    """A subscriber with a marketing topic on, so turning marketing off changes something."""
    page = _known(new_context)
    _save(page)
    return page


def _save(page: Page) -> None:
    page.check("#topic-weekly-digest")
    _click("Save my choices", ".banner--success")(page)


def _erase_form(new_context: NewContext, server: LiveServer) -> Page:
    return _erase(new_context, False)


def _erase_mine(page: Page) -> None:
    page.check("#erase-confirm")
    page.click("button[type=submit]")
    page.wait_for_selector("text=Download your receipt")


def _login_page(new_context: NewContext, server: LiveServer) -> Page:
    _staff(new_context, server).context.close()  # the account, made and signed in once
    page = new_context().new_page()
    page.goto("/staff/login")
    return page


def _sign_in(page: Page) -> None:
    from tests.browser.test_accessibility import STAFF_EMAIL, STAFF_PASSWORD

    page.fill("#email", STAFF_EMAIL)
    page.fill("#password", STAFF_PASSWORD)
    page.click("main button[type=submit]")
    page.wait_for_url("**/staff/")


def _change_password(page: Page) -> None:
    from tests.browser.test_accessibility import STAFF_PASSWORD

    page.fill("#current_password", STAFF_PASSWORD)
    page.fill("#new_password", "a long and lovely passphrase")
    page.fill("#confirm_password", "a long and lovely passphrase")
    _click("Change password")(page)


def _sign_out(page: Page) -> None:
    page.click("text=Sign out")
    page.wait_for_url("**/staff/login")
    page.wait_for_selector(".banner")


def _add_staff(page: Page) -> None:
    page.fill("#email", "new.colleague@example.test")
    page.fill("#password", "a long enough first password")
    page.check("#roles-compliance")
    page.locator("form:has(#email) button[type=submit]").last.click()
    page.wait_for_selector(".banner")


def _colleague_page(new_context: NewContext, server: LiveServer) -> Page:
    colleague = _colleague(server)
    page = _staff(new_context, server)
    page.goto(f"/staff/admin/staff/{colleague}")
    return page


def _disabled_colleague(new_context: NewContext, server: LiveServer) -> Page:
    page = _colleague_page(new_context, server)
    page.locator("main").get_by_role("button", name="Disable").click()
    page.wait_for_selector(".banner")
    return page


def _save_roles(page: Page) -> None:
    page.check("input[name=roles][value=compliance]")
    _click("Save roles")(page)


def _new_topic(page: Page) -> None:
    """The form, its review step (which writes nothing), then the create itself."""
    page.fill("#slug", "monthly-summary")
    page.get_by_label("News", exact=True).check()
    page.fill("#label", "Monthly summary")
    page.check("#topic_class")
    page.check("#default_state")
    page.get_by_role("button", name="Continue").click()
    page.get_by_role("button", name="Create topic").click()
    page.wait_for_selector(".banner")


def _edit_topic(page: Page) -> None:
    page.fill("#label", "Deals")
    page.locator("main button[type=submit]").first.click()
    page.wait_for_selector(".banner")


def _submit_last(answer: str = ".banner") -> Callable[[Page], None]:
    def submit(page: Page) -> None:
        page.locator("main button[type=submit]").last.click()
        page.wait_for_selector(answer)

    return submit


def _publish(page: Page) -> None:
    page.fill("#version", "2026-02")
    page.fill("#text", "We send what you choose.\nNow also a monthly summary, if you ask.")
    page.click("button[value=preview]")
    page.wait_for_selector("#preview-heading")
    page.click("button[value=publish]")
    page.wait_for_selector(".banner")


def _erase_person_form(new_context: NewContext, server: LiveServer) -> Page:
    page = _compliance_subscriber(new_context, server)
    page.click("text=Erase this person's data")
    page.wait_for_selector("#confirm")
    return page


def _erase_person(page: Page) -> None:
    page.check("#confirm")
    page.locator("main button[type=submit]").click()
    page.wait_for_selector("text=Download the erasure receipt")


def _review(new_context: NewContext, server: LiveServer) -> Page:
    return _campaign_form("review", fill=True)(new_context, server)


def _launch(page: Page) -> None:
    page.click("button[value=launch]")
    page.wait_for_selector(".banner")


def _test_send(page: Page) -> None:
    page.click("text=Send a test to this browser")
    page.wait_for_selector("text=Test queued")


def _paused_campaign(new_context: NewContext, server: LiveServer) -> Page:
    page = _campaign_page(new_context, server)
    _click("Pause sending")(page)
    return page


def _cancel(page: Page) -> None:
    page.check("#confirm")
    _click("Cancel campaign")(page)


CASES = [
    FormCase("preferences-save", _subscriber, _save, EVENTS, ".banner--success"),
    FormCase(
        "preferences-marketing-off",
        _with_marketing,
        _click("Turn off all marketing", ".banner--success"),
        EVENTS,
        ".banner--success",
    ),
    FormCase(
        "preferences-how-often",
        _subscriber,
        _how_often,
        "SELECT count(*) FROM subscriber WHERE one_a_day",
        ".banner--success",
    ),
    FormCase(
        "preferences-confirm-notice",
        _preferences_notice_changed,
        _click("Keep my choices under version", ".banner--success"),
        EVENTS,
        ".banner--success",
    ),
    FormCase(
        "preferences-stop-device",
        _receiving_device,
        _click("Stop notifications on this device", ".banner--success"),
        EVENTS,
        ".banner--success",
    ),
    FormCase("preferences-stop-other-device", _two_devices, _stop_other, EVENTS, ".banner"),
    FormCase(
        "preferences-account-link",
        _account_link(),
        _click("Link this browser", ".banner--success"),
        "SELECT count(*) FROM subscriber WHERE external_user_id IS NOT NULL",
        ".banner--success",
    ),
    FormCase(
        "preferences-erase",
        _erase_form,
        _erase_mine,
        "SELECT count(*) FROM subscriber WHERE erased_at IS NOT NULL",
        "text=Download your receipt",
        kept="text=Download your receipt",
    ),
    FormCase("staff-sign-in", _login_page, _sign_in, _audited("staff.signed_in"), "main h1"),
    FormCase(
        "staff-sign-out",
        _at("/staff/"),
        _sign_out,
        _audited("staff.signed_out"),
        ".banner",
    ),
    FormCase(
        "staff-password",
        _at("/staff/password"),
        _change_password,
        _audited("staff.password_changed"),
        ".banner",
    ),
    FormCase(
        "staff-add", _at("/staff/admin/staff"), _add_staff, _audited("staff.created"), ".banner"
    ),
    FormCase(
        "staff-roles", _colleague_page, _save_roles, _audited("staff.roles_changed"), ".banner"
    ),
    FormCase(
        "staff-disable",
        _colleague_page,
        _click("Disable"),
        _audited("staff.disabled"),
        ".banner",
    ),
    FormCase(
        "staff-enable",
        _disabled_colleague,
        _click("Enable"),
        _audited("staff.enabled"),
        ".banner",
    ),
    FormCase(
        "ops-feedback-test",
        _at("/staff/ops/feedback"),
        _click("Send a test digest"),
        _audited("feedback.test_sent"),
        ".banner",
    ),
    FormCase(
        "ops-job-run",
        _at("/staff/ops/jobs"),
        _click("Run sweep now"),
        _audited("operations.job_run"),
        ".banner",
    ),
    FormCase(
        "admin-topic-new",
        _at("/staff/admin/topics/new"),
        _new_topic,
        _audited("topic.created"),
        ".banner",
    ),
    FormCase(
        "admin-topic-edit",
        _at("/staff/admin/topics/offers/edit"),
        _edit_topic,
        _audited("topic.edited"),
        ".banner",
    ),
    FormCase(
        "admin-topic-retire",
        _at("/staff/admin/topics/offers/retire"),
        _submit_last(),
        _audited("topic.retired"),
        ".banner",
    ),
    FormCase(
        "admin-policy-publish",
        _at("/staff/admin/policies/new"),
        _publish,
        _audited("policy.published"),
        ".banner",
    ),
    FormCase(
        "compliance-erase",
        _erase_person_form,
        _erase_person,
        _audited("subscriber.erased"),
        "text=Download the erasure receipt",
    ),
    FormCase(
        "compliance-verify-log",
        _at("/staff/compliance/"),
        _click("Check the whole log now"),
        _audited("consent.log_verification_requested"),
        ".banner",
    ),
    FormCase("campaign-launch", _review, _launch, _audited("campaign.launched"), ".banner"),
    FormCase(
        "campaign-test-send",
        _campaign_review_with_a_device,
        _test_send,
        _audited("campaign.test_sent"),
        "text=Test queued",
        kept="text=Test queued",
    ),
    FormCase(
        "campaign-pause",
        _campaign_page,
        _click("Pause sending"),
        _audited("campaign.paused"),
        ".banner",
    ),
    FormCase(
        "campaign-resume",
        _paused_campaign,
        _click("Resume sending"),
        _audited("campaign.resumed"),
        ".banner",
    ),
    FormCase("campaign-cancel", _campaign_page, _cancel, _audited("campaign.cancelled"), ".banner"),
]


class CountingPushService:
    """Accepts every message and counts them."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, request: Any) -> PushResponse:
        self.sent.append(request)
        return PushResponse(201)

    def send_batch(self, requests: Any) -> list[PushResponse]:
        return [self.send(request) for request in requests]

    def close(self) -> None:
        pass


def _page_posts(page: Page) -> list[str]:
    """Form posts the page sends from now on (the JSON API's, from scripts, aside)."""
    posts: list[str] = []

    def seen(request: Request) -> None:
        if request.method == "POST" and "/api/" not in request.url:
            posts.append(request.url)

    page.on("request", seen)
    return posts


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1280", "390"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_reloading_the_answer_to_a_form_submits_nothing_again(
    case: FormCase, viewport: dict[str, int], new_context: NewContext, server: LiveServer
) -> None:
    def sized(**options: Any) -> Any:
        return new_context(**{"viewport": viewport, **options})

    page = case.reach(sized, server)
    page.set_viewport_size(viewport)
    before = server.scalar(case.done)
    case.submit(page)
    page.wait_for_load_state("load")
    done = server.scalar(case.done)
    assert done > before, f"{case}: the submission did not do its work"
    answered_at = page.url

    posts = _page_posts(page)
    page.reload(wait_until="load")
    assert posts == [], f"{case}: reloading the answer ({answered_at}) posted the form again"
    page.wait_for_selector(case.kept)
    assert page.url == answered_at
    assert server.scalar(case.done) == done, f"{case}: reloading did the work again"
    assert axe_problems(page) == []
    if case.kept != "main h1":  # an answer that stays: for people to look at
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shot = SCREENSHOTS / f"reloaded-{case}-{viewport['width']}.png"
        page.screenshot(path=shot, full_page=True)

    if case.name == "campaign-test-send":
        push_service = CountingPushService()
        Dispatcher(server.app, push_service).tick()
        assert len(push_service.sent) == 1, "one test send, one push"
        assert server.scalar("SELECT count(*) FROM campaign WHERE is_test") == 1
        # The page still says the truth: the test, and a way to follow it.
        assert page.get_by_role("link", name="Follow the test send").count() == 1
        uuid.UUID(page.url.rsplit("/", 1)[1])  # the test campaign's own address
