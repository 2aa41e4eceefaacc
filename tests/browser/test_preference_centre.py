"""The preference centre in Chromium: saving, the error summary, the keyboard alone, and
all of it without JavaScript."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

import pytest
from playwright.sync_api import Page, Route

from portal.consent import catalogue
from portal.identity import sign_assertion
from portal.seams import current_portal
from tests.browser.conftest import active_element_id, subscribe_through_api

HOST_SECRET = "host-product-secret-for-the-browser"

pytestmark = pytest.mark.browser


def preferences(server) -> dict[str, str]:
    return dict(
        server.rows(
            "SELECT t.slug, p.state FROM topic_preference p JOIN topic t ON t.id = p.topic_id"
        )
    )


def publish_new_policy(server, version: str = "2026-02") -> None:
    with server.session() as session, session.begin():
        catalogue.publish_policy(
            session,
            version=version,
            text="We now also send a monthly summary, if you ask for it.",
            now=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1),
        )


def sign_in_link(server, subject: str) -> str:
    """A host product's sign-in link to the preference centre for account ``subject``."""
    app = server.app
    current_portal(app).settings = current_portal(app).settings.with_overrides(
        identity_assertion_secrets=(HOST_SECRET,)
    )
    assertion = sign_assertion({"sub": subject, "exp": time.time() + 300}, HOST_SECRET)
    return f"/preferences?assertion={assertion}"


def focused_classes(page: Page) -> str:
    return page.evaluate("document.activeElement.className")


def submit(page: Page, press: Callable[[], None]) -> None:
    """Sends the form and returns once the answer page has loaded. The element a test waits
    for is in the page while it is still being parsed, before the deferred script that
    moves focus to it has run; the load event comes after that script."""
    with page.expect_navigation(wait_until="load"):
        press()


def tab_to_button(page: Page, text: str, *, presses: int) -> None:
    """Press Tab until the button saying ``text`` has focus, at most ``presses`` times."""
    for _ in range(presses):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent.trim()") == text:
            return
    pytest.fail(f"Tab never reached the button {text!r}")


def slow_focus_script(route: Route) -> None:
    time.sleep(0.3)
    route.continue_()


@pytest.fixture
def known_page(context, browser_subscription) -> Page:
    subscribe_through_api(context, browser_subscription)
    page = context.new_page()
    page.goto("/preferences")
    # The script that moves focus arrives late, as on a slow phone: a test that reads focus
    # before the answer page has loaded fails every time instead of now and then.
    page.route("**/js/focus.js", slow_focus_script)
    return page


def test_saving_shows_a_focused_banner(known_page, server):
    page = known_page
    page.check("#topic-weekly-digest")
    submit(page, lambda: page.click("text=Save my choices"))
    page.wait_for_selector(".banner--success")
    assert "banner" in focused_classes(page)
    assert page.evaluate("document.activeElement.getAttribute('role')") == "status"
    assert "Your choices are saved." in page.inner_text(".banner--success")
    assert preferences(server) == {"weekly-digest": "opt_in"}


def test_a_stale_policy_gives_a_focused_error_summary_whose_links_work(known_page, server):
    page = known_page
    page.check("#topic-offers")
    publish_new_policy(server)  # the notice changes while the page is open
    submit(page, lambda: page.click("text=Save my choices"))
    page.wait_for_selector(".error-summary")

    assert page.title().startswith("Error: ")
    assert "error-summary" in focused_classes(page)
    assert page.is_checked("#topic-offers")  # what they ticked is kept
    assert preferences(server) == {}  # and nothing was written

    links = page.locator(".error-summary a")
    assert links.count() >= 1
    for index in range(links.count()):
        target = links.nth(index).get_attribute("href")
        assert target.startswith("#")
        assert page.locator(target).count() == 1, f"{target} names no element"
        links.nth(index).click()
        assert active_element_id(page) == target[1:]
        assert page.evaluate("document.activeElement.tagName") == "INPUT"

    # The field names its error and hint, and both exist.
    described = page.get_attribute("#policy-ack", "aria-describedby").split()
    assert "policy-ack-error" in described
    for ident in described:
        assert page.locator(f"#{ident}").count() == 1
    assert page.get_attribute("#policy-ack", "aria-invalid") == "true"

    page.check("#policy-ack")
    page.click("text=Save my choices")
    page.wait_for_selector(".banner--success")
    assert preferences(server) == {"offers": "opt_in"}
    assert server.scalar("SELECT DISTINCT policy_version FROM topic_preference") == "2026-02"


def test_the_form_can_be_completed_with_the_keyboard_alone(known_page, server):
    page = known_page
    page.evaluate("document.activeElement && document.activeElement.blur()")
    target = "topic-product-news"
    for _ in range(40):
        page.keyboard.press("Tab")
        if active_element_id(page) == target:
            break
    else:
        pytest.fail(f"Tab never reached #{target}")
    page.keyboard.press("Space")
    assert page.is_checked(f"#{target}")
    tab_to_button(page, "Save my choices", presses=40)
    submit(page, lambda: page.keyboard.press("Enter"))
    page.wait_for_selector(".banner--success")
    assert "banner" in focused_classes(page)
    assert preferences(server) == {"product-news": "opt_in"}


def test_every_fieldset_names_hints_that_exist(known_page):
    page = known_page
    missing = page.evaluate(
        """() => {
          const out = [];
          for (const el of document.querySelectorAll('[aria-describedby]')) {
            for (const id of el.getAttribute('aria-describedby').split(/\\s+/)) {
              if (id && !document.getElementById(id)) out.push(el.id + ' -> ' + id);
            }
          }
          return out;
        }"""
    )
    assert missing == []
    assert page.locator("fieldset[aria-describedby]").count() >= 1


def test_the_preference_centre_works_without_javascript(new_context, server, browser_subscription):
    context = new_context(java_script_enabled=False, stub=False, permission=False)
    subscribe_through_api(context, browser_subscription)
    page = context.new_page()
    page.goto("/preferences")
    assert page.evaluate("typeof window.PortalPush") == "undefined"  # nothing ran

    page.check("#topic-offers")
    page.check("#topic-weekly-digest")
    with page.expect_navigation():  # a form post: wait for the page it leads to
        page.click("text=Save my choices")
    assert "Your choices are saved." in page.inner_text(".banner--success")
    assert preferences(server) == {"offers": "opt_in", "weekly-digest": "opt_in"}

    # A failed save shows the error summary, whose link leads to the field.
    page.check("#topic-product-news")
    publish_new_policy(server)
    with page.expect_navigation():  # a form post: wait for the page it leads to
        page.click("text=Save my choices")
    assert page.title().startswith("Error: ")
    page.click(".error-summary a[href='#policy-ack']")
    assert page.url.endswith("#policy-ack")
    page.check("#policy-ack")
    with page.expect_navigation():  # a form post: wait for the page it leads to
        page.click("text=Save my choices")
    assert page.locator(".banner--success").count() == 1
    assert preferences(server)["product-news"] == "opt_in"

    with page.expect_navigation():  # a form post: wait for the page it leads to
        page.click("text=Turn off all marketing")
    assert "All marketing notifications are off" in page.inner_text(".banner--success")
    assert preferences(server) == {
        "offers": "opt_out",
        "weekly-digest": "opt_out",
        "product-news": "opt_out",
    }

    with page.expect_navigation():  # a form post: wait for the page it leads to
        page.click("text=Stop notifications on this device")
    assert page.locator(".banner--success").count() == 1
    assert "No device gets notifications from us" in page.inner_text("main")
    assert server.scalar("SELECT state FROM push_subscription") == "revoked"


def test_how_often_is_chosen_with_the_keyboard_and_kept(known_page, server):
    """The radio group: reached with Tab, changed with the arrow keys, saved with Enter;
    the banner takes focus, the page shows the choice kept, the log has its event."""
    page = known_page
    assert page.is_checked("#how-often-as-sent")
    page.focus("#how-often-as-sent")
    page.keyboard.press("ArrowDown")
    assert page.is_checked("#how-often-one-a-day")
    tab_to_button(page, "Save how often", presses=10)
    submit(page, lambda: page.keyboard.press("Enter"))
    page.wait_for_selector(".banner--success")
    assert "banner" in focused_classes(page)
    assert "Saved: at most one marketing notification a day." in page.inner_text(".banner--success")
    assert page.is_checked("#how-often-one-a-day")
    assert server.scalar("SELECT one_a_day FROM subscriber") in (True, 1)
    assert (
        server.scalar("SELECT new_state FROM consent_event WHERE kind = 'frequency_chosen'")
        == "one_a_day"
    )
    # The group says what it is to a screen reader: its legend and its hint.
    group = page.get_by_role("group", name="Marketing notifications", exact=True)
    assert group.get_attribute("aria-describedby") == "how-often-hint"
    assert page.get_by_role("radio", name="At most one a day").is_checked()


def test_how_often_works_without_javascript(new_context, server, browser_subscription):
    context = new_context(java_script_enabled=False, stub=False, permission=False)
    subscribe_through_api(context, browser_subscription)
    page = context.new_page()
    page.goto("/preferences")
    page.check("#how-often-one-a-day")
    with page.expect_navigation():  # a form post: wait for the page it leads to
        page.click("text=Save how often")
    assert "at most one marketing notification a day" in page.inner_text(".banner--success")
    assert page.is_checked("#how-often-one-a-day")
    page.check("#how-often-as-sent")
    with page.expect_navigation():
        page.click("text=Save how often")
    assert "come as we send them" in page.inner_text(".banner--success")
    assert server.scalar("SELECT count(*) FROM consent_event WHERE kind = 'frequency_chosen'") == 2


def test_quiet_hours_are_set_and_removed_with_the_keyboard(known_page, server):
    """From and Until reached with Tab, saved with Enter; the banner takes focus, the page
    shows the hours kept and offers to remove them; each change is a consent event."""
    page = known_page
    assert "You have no quiet hours of your own." in page.inner_text("#quiet-hours")
    assert page.locator("text=Remove my quiet hours").count() == 0
    page.focus("#quiet-from")
    page.fill("#quiet-from", "22:30")
    # Tab walks the time field's parts (hours, minutes, AM/PM), then the next field.
    for _ in range(4):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.id") == "quiet-until":
            break
    assert page.evaluate("document.activeElement.id") == "quiet-until"
    page.fill("#quiet-until", "07:15")
    tab_to_button(page, "Save quiet hours", presses=8)
    submit(page, lambda: page.keyboard.press("Enter"))
    page.wait_for_selector(".banner--success")
    assert "banner" in focused_classes(page)
    assert "Saved: no marketing notifications between 22:30 and 07:15 where you are." in (
        page.inner_text(".banner--success")
    )
    assert "Your quiet hours: no marketing notifications between 22:30 and 07:15" in (
        page.inner_text("#quiet-hours")
    )
    assert page.input_value("#quiet-from") == "22:30"
    assert page.input_value("#quiet-until") == "07:15"
    group = page.get_by_role("group", name="Do not send me marketing notifications between")
    assert group.count() == 1
    tab_to_button(page, "Remove my quiet hours", presses=40)
    submit(page, lambda: page.keyboard.press("Enter"))
    page.wait_for_selector(".banner--success")
    assert "Saved: you have no quiet hours of your own." in page.inner_text(".banner--success")
    states = server.rows(
        "SELECT previous_state, new_state FROM consent_event WHERE kind = 'quiet_hours_chosen'"
        " ORDER BY seq"
    )
    assert [tuple(row) for row in states] == [("none", "22:30-07:15"), ("22:30-07:15", "none")]


def test_quiet_hours_refused_name_the_field_and_work_without_javascript(
    new_context, server, browser_subscription
):
    context = new_context(java_script_enabled=False, stub=False, permission=False)
    subscribe_through_api(context, browser_subscription)
    page = context.new_page()
    page.goto("/preferences")
    page.fill("#quiet-from", "22:00")
    page.fill("#quiet-until", "22:00")
    with page.expect_navigation():
        page.click("text=Save quiet hours")
    summary = page.locator(".error-summary a[href='#quiet-until']")
    assert summary.inner_text() == "Enter an end time different from the start time"
    assert page.get_attribute("#quiet-until", "aria-invalid") == "true"
    assert page.input_value("#quiet-from") == "22:00"  # what was typed is kept
    assert server.scalar("SELECT quiet_from FROM subscriber") is None
    page.fill("#quiet-until", "06:00")
    with page.expect_navigation():
        page.click("text=Save quiet hours")
    assert "between 22:00 and 06:00" in page.inner_text(".banner--success")


def _owners(server) -> set[object]:
    return {
        row.external_user_id
        for row in server.rows(
            "SELECT s.external_user_id FROM push_subscription p"
            " JOIN subscriber s ON s.id = p.subscriber_id"
        )
    }


def test_a_sign_in_link_asks_before_linking_and_links_on_the_click(known_page, server):
    page = known_page
    link = sign_in_link(server, "customer-2041")
    page.goto(link)
    # The token left the address bar at once; the page names the account and the device.
    assert page.url == server.url + "/preferences/link"
    assert "assertion" not in page.url
    assert page.title() == "Link this browser to your account – Push consent portal"
    assert "customer-2041" in page.inner_text("main")
    assert "1 device" in page.inner_text("main")
    assert _owners(server) == {None}  # nothing linked by opening the link
    with page.expect_navigation():  # a form post: wait for the page it leads to
        page.click("button[value=link]")
    page.wait_for_selector(".banner--success")
    assert page.url == server.url + "/preferences"
    assert "This browser is now linked to your account." in page.inner_text(".banner--success")
    assert _owners(server) == {"customer-2041"}


def test_choosing_not_to_link_links_nothing(known_page, server):
    page = known_page
    page.goto(sign_in_link(server, "customer-2042"))
    with page.expect_navigation():  # a form post: wait for the page it leads to
        page.click("button[value=cancel]")
    page.wait_for_selector(".banner--info")
    assert "Nothing was linked." in page.inner_text(".banner--info")
    assert _owners(server) == {None}
    assert server.scalar("SELECT count(*) FROM consent_event WHERE kind = 'account_linked'") == 0


def test_the_confirmation_works_from_the_keyboard_alone(known_page, server):
    page = known_page
    page.goto(sign_in_link(server, "customer-2043"))
    page.focus("button[value=link]")
    submit(page, lambda: page.keyboard.press("Enter"))
    page.wait_for_selector(".banner--success")
    assert _owners(server) == {"customer-2043"}


def test_the_receipt_downloads_and_checks_with_the_standalone_tool(known_page, server, tmp_path):
    """As a person would: save, take the receipt from the banner's link, and check it with
    tools/verify_receipt.py run on its own, against the log key the API publishes."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    page = known_page
    page.check("#topic-weekly-digest")
    submit(page, lambda: page.click("text=Save my choices"))
    link = page.locator(".banner--success a", has_text="Download a receipt of your choices")
    with page.expect_download() as caught:
        link.click()
    download = caught.value
    assert download.suggested_filename.startswith("consent-receipt-")
    path = tmp_path / download.suggested_filename
    download.save_as(path)
    receipt = json.loads(path.read_text())
    purposes = {p["purpose_id"]: p for p in receipt["purposes"]}
    assert purposes["weekly-digest"]["state"] == "given"
    key = tmp_path / "log-key.json"
    key.write_text(page.request.get("/api/consent-log/key").text())
    tool = Path(__file__).resolve().parents[2] / "tools" / "verify_receipt.py"
    run = subprocess.run(
        [sys.executable, "-I", str(tool), str(path), "--log-key", str(key)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert " OK: " in run.stdout
