"""Accessibility of every public page, in each state a person can reach.

``PAGES`` lists (name, how to reach the state). A page added later joins every check by
adding one entry: a function that takes the browser-context factory and the live server
and returns a Page showing that state.

axe-core checks WCAG 2.0/2.1/2.2 A and AA rules; the hand-written checks cover what it
cannot see: a visible focus indicator on every element Tab reaches, targets of at least
24×24 CSS pixels (links inside running text excepted, as WCAG 2.5.8 allows), a plain-text
title naming the page, fieldsets that point at their hint and error, in error states a
focused error summary whose links lead to the fields, and at phone widths (320 and 390 px)
no sideways scroll and no word broken anywhere. Each state is reached once and given every
check.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from axe_playwright_python.base import AxeResults
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import Page, Route
from sqlalchemy.orm import sessionmaker

from portal.db import create_engine
from portal.seams import current_portal
from tests.browser.conftest import (
    DESKTOP,
    PHONE,
    LiveServer,
    subscribe_through_api,
    subscribe_through_page,
)
from tests.browser.test_preference_centre import publish_new_policy, sign_in_link
from tests.browser.test_subscribe_page import (
    IPHONE_UA,
    NO_PUSH,
    REFUSING_PUSH_SERVICE,
    answering,
    erase_behind_the_browser,
)

pytestmark = pytest.mark.browser

AXE_OPTIONS = {
    "runOnly": {
        "type": "tag",
        "values": ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa"],
    },
    "resultTypes": ["violations"],  # options replace the library's default: keep this
}
_axe = Axe()

Reach = Callable[[Callable[..., Any], LiveServer], Page]


@dataclass(frozen=True)
class PageState:
    name: str
    reach: Reach
    error_summary: bool = False  # a server-rendered error summary (GOV.UK pattern)
    # Its links lead to form fields; False where the error is about a section, not a field.
    summary_links_to_fields: bool = True

    def __str__(self) -> str:
        return self.name


def _open(path: str, **context_options: Any) -> Reach:
    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        page = new_context(**context_options).new_page()
        page.goto(path)
        return page

    return reach


def _without_javascript(
    path: str, prepare: Callable[[Any, LiveServer], None] | None = None
) -> Reach:
    """The page as a browser without JavaScript shows it, in a browser with JavaScript
    (axe-core runs on the page's timers, which a script-less page never fires): the
    server's HTML with its scripts removed and its <noscript> contents shown, served at
    the page's own address with the server's own headers. The real script-less browser
    is tested in test_subscribe_page."""

    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        context = new_context(stub=False, permission=False)
        if prepare is not None:
            prepare(context, server)
        served = context.request.get(path)
        assert served.status == 200, served.status
        html = re.sub(r"<script\b[^>]*>.*?</script>", "", served.text(), flags=re.S)
        html = re.sub(r"</?noscript>", "", html)
        page = context.new_page()
        page.route(
            f"{server.url}{path}",
            lambda route: route.fulfill(status=200, headers=served.headers, body=html),
        )
        page.goto(path)
        return page

    return reach


def _subscribe_page_after(
    click_state: str, *, answer: str | None = None, abort: bool = False, init: str = ""
):
    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        context = new_context(permission=answer is None)
        if answer is not None:
            context.add_init_script(answering(answer))
        if init:
            context.add_init_script(init)
        page = context.new_page()
        page.goto("/")
        if abort:
            page.route("**/api/push/subscribe", lambda route: route.abort("internetdisconnected"))
        page.click("#subscribe-button")
        page.wait_for_selector(f"#{click_state}:not([hidden])")
        return page

    return reach


def _subscribe_page_with(init_script: str, state: str, **options: Any) -> Reach:
    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        context = new_context(**options)
        context.add_init_script(init_script)
        page = context.new_page()
        page.goto("/")
        page.wait_for_selector(f"#{state}:not([hidden])")
        return page

    return reach


def _already_subscribed(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = new_context().new_page()
    subscribe_through_page(page)
    page.reload()
    page.wait_for_selector("#state-subscribed:not([hidden])")
    return page


def _unsubscribed(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _already_subscribed(new_context, server)
    page.click("#unsubscribe-button")
    page.wait_for_selector("#state-unsubscribed:not([hidden])")
    return page


def _unsubscribe_failed(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _already_subscribed(new_context, server)
    page.route("**/api/push/unsubscribe", lambda route: route.abort("internetdisconnected"))
    page.click("#unsubscribe-button")
    page.wait_for_selector("#state-unsubscribe-failed:not([hidden])")
    return page


def _cancelled(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _subscribe_page_after("state-failed", abort=True)(new_context, server)
    page.click("#cancel-button")
    page.wait_for_selector("#state-cancelled:not([hidden])")
    return page


def _after_the_server_ended_it(
    end: Callable[[LiveServer], None], state: str, **context_options: Any
) -> Reach:
    """The subscribe page of a subscribed browser whose subscription the server ended
    behind it: the page asks on load, the browser lets go, the page says why."""

    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        page = new_context(**context_options).new_page()
        subscribe_through_page(page)
        end(server)
        page.reload()
        page.wait_for_selector(f"#{state}:not([hidden])")
        return page

    return reach


def _stop_behind_the_browser(server: LiveServer) -> None:
    with server.session() as session, session.begin():
        session.execute(
            sa.text(
                "UPDATE push_subscription SET state = 'revoked', end_reason = 'unsubscribed',"
                " revoked_at = CURRENT_TIMESTAMP, ended_at = CURRENT_TIMESTAMP"
            )
        )


def _purge_behind_the_browser(server: LiveServer) -> None:
    with server.session() as session, session.begin():
        session.execute(sa.text("DELETE FROM push_subscription"))


def _check_failed(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = new_context().new_page()
    subscribe_through_page(page)
    page.route("**/api/push/status", lambda route: route.abort("internetdisconnected"))
    page.reload()
    page.wait_for_selector("#state-check-failed:not([hidden])")
    return page


def _subscribed_without_javascript(context: Any, server: LiveServer) -> None:
    from tests.factories import SubscriptionFactory

    subscribe_through_api(context, SubscriptionFactory()())


def _stopped_without_javascript(context: Any, server: LiveServer) -> None:
    _subscribed_without_javascript(context, server)
    _stop_behind_the_browser(server)


def _erased_without_javascript(context: Any, server: LiveServer) -> None:
    _subscribed_without_javascript(context, server)
    erase_behind_the_browser(server)


def _known(new_context: Callable[..., Any]) -> Page:
    from tests.factories import SubscriptionFactory

    context = new_context()
    subscribe_through_api(context, SubscriptionFactory()())
    page = context.new_page()
    page.goto("/preferences")
    return page


def _preferences(new_context: Callable[..., Any], server: LiveServer) -> Page:
    return _known(new_context)


def _preferences_saved(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _known(new_context)
    page.check("#topic-weekly-digest")
    page.click("text=Save my choices")
    page.wait_for_selector(".banner--success")
    return page


def _preferences_one_a_day(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _known(new_context)
    page.check("#how-often-one-a-day")
    with page.expect_navigation():
        page.click("text=Save how often")
    page.wait_for_selector(".banner--success")
    return page


def _preferences_how_often_refused(new_context: Callable[..., Any], server: LiveServer) -> Page:
    """No choice sent (a browser cannot untick both radios; a forged or broken form can):
    the page names the group's error and links to its first choice."""
    page = _known(new_context)
    page.evaluate("document.querySelectorAll('[name=how_often]').forEach(r => r.checked = false)")
    with page.expect_navigation():
        page.click("text=Save how often")
    page.wait_for_selector(".error-summary")
    return page


def _preferences_quiet_hours_saved(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _known(new_context)
    page.fill("#quiet-from", "22:00")
    page.fill("#quiet-until", "07:00")
    with page.expect_navigation():
        page.click("text=Save quiet hours")
    page.wait_for_selector(".banner--success")
    return page


def _preferences_quiet_hours_refused(new_context: Callable[..., Any], server: LiveServer) -> Page:
    """The same time twice: the page names the field's error and links to it."""
    page = _known(new_context)
    page.fill("#quiet-from", "22:00")
    page.fill("#quiet-until", "22:00")
    with page.expect_navigation():
        page.click("text=Save quiet hours")
    page.wait_for_selector(".error-summary")
    return page


def _preferences_receipts_limited(new_context: Callable[..., Any], server: LiveServer) -> Page:
    """The receipt link asked for once too often in one rate-limit window: a page, not a
    download, saying when to try again."""
    portal = current_portal(server.app)
    limits = dataclasses.replace(portal.settings.rate_limit, receipts=1)
    portal.settings = dataclasses.replace(portal.settings, rate_limit=limits)
    page = _known(new_context)
    page.request.get("/preferences/receipt")
    response = page.goto("/preferences/receipt")
    assert response is not None and response.status == 429
    page.wait_for_selector("text=Too many receipts at once")
    return page


def _preferences_saves_limited(new_context: Callable[..., Any], server: LiveServer) -> Page:
    """A form saved once too often in one rate-limit window: a page saying nothing
    changed and when to save again."""
    portal = current_portal(server.app)
    limits = dataclasses.replace(portal.settings.rate_limit, saves=1)
    portal.settings = dataclasses.replace(portal.settings, rate_limit=limits)
    page = _known(new_context)
    for choice in ("#how-often-one-a-day", "#how-often-as-sent"):
        page.goto("/preferences")
        page.check(choice)
        with page.expect_navigation():
            page.click("text=Save how often")
    page.wait_for_selector("text=Too many changes at once")
    return page


def _known_device(new_context: Callable[..., Any]) -> Page:
    """The preference centre of a browser that holds its subscription (the stop control
    is offered only to a device that receives)."""
    page = new_context().new_page()
    subscribe_through_page(page)
    page.goto("/preferences")
    page.wait_for_load_state("networkidle")
    return page


def _preferences_device_stopped(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _known_device(new_context)
    page.click("text=Stop notifications on this device")
    page.wait_for_selector(".banner--success")
    page.wait_for_selector("#this-device[data-device-status=not-receiving]")
    return page


def _preferences_stale_policy(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _known(new_context)
    publish_new_policy(server)
    page.click("text=Save my choices")
    page.wait_for_selector(".error-summary")
    return page


def _preferences_notice_changed(new_context: Callable[..., Any], server: LiveServer) -> Page:
    """Choices made under one notice, seen after the next was published."""
    page = new_context().new_page()
    subscribe_through_page(page, topics=("offers",))
    publish_new_policy(server)
    page.goto("/preferences")
    page.wait_for_selector("#notice-changes")
    return page


def _policy_digest_open(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = new_context().new_page()
    page.goto("/policy/2026-01")
    page.click("details summary")
    return page


def _preferences_unknown_device(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _known_device(new_context)
    page.context.clear_cookies(name="portal_device")
    page.click("text=Stop notifications on this device")
    page.wait_for_selector(".error-summary")
    return page


def _account_link(**context_options: Any) -> Reach:
    """The question a sign-in link asks a browser with a device (at a given viewport)."""

    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        from tests.factories import SubscriptionFactory

        context = new_context(**context_options)
        subscribe_through_api(context, SubscriptionFactory()())
        page = context.new_page()
        # A long account id (the host product's choice, up to 255 characters) wraps.
        page.goto(sign_in_link(server, "customer-3307-" + "a1b2c3d4" * 12))
        page.wait_for_selector("button[value=link]")
        return page

    return reach


def _erase(new_context: Callable[..., Any], submit: bool) -> Page:
    page = _known(new_context)
    page.goto("/preferences/erase")
    if submit:
        page.click("button[type=submit]")
        page.wait_for_selector(".error-summary")
    return page


def _erased(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _erase(new_context, False)
    page.check("#erase-confirm")
    page.click("button[type=submit]")
    page.wait_for_selector("text=Download your receipt")
    return page


def _database_down(new_context: Callable[..., Any], server: LiveServer) -> Page:
    """The preference centre while the database cannot be reached: a real driver failure
    (a database file in a folder that does not exist), for this one page load."""
    page = _known(new_context)
    state = server.app.extensions["portal.db"]
    missing = Path(tempfile.gettempdir()) / f"absent-{uuid.uuid4().hex}" / "portal.sqlite3"
    engine = create_engine(f"sqlite:///{missing}")
    server.app.extensions["portal.db"] = dataclasses.replace(
        state, engine=engine, session_factory=sessionmaker(engine, expire_on_commit=False)
    )
    try:
        response = page.reload(wait_until="load")
    finally:
        server.app.extensions["portal.db"] = state
        engine.dispose()
    assert response is not None and response.status == 503
    return page


STAFF_EMAIL = "officer@example.test"
STAFF_PASSWORD = "correct horse battery staple"


def _staff(
    new_context: Callable[..., Any],
    server: LiveServer,
    *,
    email: str = STAFF_EMAIL,
    roles: tuple[str, ...] | None = None,
) -> Page:
    """A member of staff (every role unless ``roles`` says), signed in, on a blank page:
    the caller opens the page it needs.

    The sign-in service runs as the sign-in form runs it (password checked, session
    started, the sign-in audited) and its session cookie goes to a new browser context
    as the form's answer would set it. The form's own pages are checked by their own
    states (``staff-login``, ``staff-login-error``, ``staff-first-password``) and by
    ``test_post_redirect_get``; going through it for every staff state cost two page
    loads each (measured: 93 staff states took 167 s through the form, 142 s this way).
    """
    from portal.db import db
    from portal.staff import services
    from portal.staff.access import STAFF_COOKIE
    from portal.staff.blueprint import policy
    from portal.staff.models import Role

    app = server.app
    portal = current_portal(app)
    with app.app_context(), db.begin() as session:
        if services.find_by_email(session, email) is None:
            services.create_staff(
                session,
                email=email,
                password=STAFF_PASSWORD,
                roles=tuple(Role(role) for role in roles) if roles else tuple(Role),
                actor=None,
                passwords=portal.passwords,
                now=portal.clock.now(),
                via="test",
                must_replace_password=False,
            )
        result = services.sign_in(
            session,
            email=email,
            password=STAFF_PASSWORD,
            client_address="127.0.0.1",
            old_token=None,
            passwords=portal.passwords,
            policy=policy(),
            now=portal.clock.now(),
            pepper=app.config["SECRET_KEY"].encode(),
        )
    assert result.outcome is services.Outcome.SIGNED_IN and result.token, result
    context = new_context()
    host = urllib.parse.urlsplit(server.url).hostname
    assert host is not None
    context.add_cookies(
        [
            {
                "name": STAFF_COOKIE,
                "value": result.token,
                "domain": host,
                "path": "/staff",
                "httpOnly": True,
                "sameSite": "Lax",
            }
        ]
    )
    return context.new_page()


def _staff_page(path: str) -> Reach:
    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        page = _staff(new_context, server)
        page.goto(path)
        return page

    return reach


def _staff_signed_out(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _staff(new_context, server)
    page.goto("/staff/")
    page.click("text=Sign out")
    page.wait_for_url("**/staff/login")
    page.wait_for_selector(".banner")
    return page


def _staff_forbidden(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _staff(new_context, server, email="sender@example.test", roles=("campaigns",))
    response = page.goto("/staff/admin/staff")
    assert response is not None and response.status == 403
    return page


def _staff_missing(path: str) -> Reach:
    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        page = _staff(new_context, server)
        response = page.goto(path)
        assert response is not None and response.status == 404
        return page

    return reach


def _staff_expired_form(new_context: Callable[..., Any], server: LiveServer) -> Page:
    """A form whose CSRF token no longer matches: the "form has expired" page."""
    page = _staff(new_context, server)
    page.goto("/staff/password")
    page.evaluate("document.querySelector('main input[name=csrf_token]').value = 'expired'")
    with page.expect_response("**/staff/password") as answered:
        page.locator("main button[type=submit]").click()
    assert answered.value.status == 400
    page.wait_for_load_state()
    return page


def _staff_id(server: LiveServer, email: str = STAFF_EMAIL) -> str:
    return str(uuid.UUID(str(server.scalar("SELECT id FROM staff_user WHERE email = :e", e=email))))


def _own_staff_detail(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _staff(new_context, server)
    page.goto(f"/staff/admin/staff/{_staff_id(server)}")
    return page


def _staff_detail_error(new_context: Callable[..., Any], server: LiveServer) -> Page:
    """Their own roles, all unticked: they may not remove their own admin role."""
    page = _own_staff_detail(new_context, server)
    for box in page.locator("input[name=roles]").all():
        box.uncheck()
    page.click("text=Save roles")
    page.wait_for_selector(".error-summary")
    return page


def _staff_disable_self(new_context: Callable[..., Any], server: LiveServer) -> Page:
    """The page offers no button to disable your own account; a request made anyway (a
    form built in the page, with its CSRF token) is answered with the page and why."""
    page = _own_staff_detail(new_context, server)
    with page.expect_navigation():
        page.evaluate(
            """() => {
              const form = document.createElement('form');
              form.method = 'post';
              form.action = location.pathname + '/disable';
              form.appendChild(document.querySelector('input[name=csrf_token]').cloneNode());
              document.body.appendChild(form);
              form.submit();
            }"""
        )
    page.wait_for_selector(".error-summary")
    return page


def _staff_added(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _staff(new_context, server)
    page.goto("/staff/admin/staff")
    page.fill("#email", "new.colleague@example.test")
    page.fill("#password", "a long enough first password")
    page.check("#roles-compliance")
    page.locator("form:has(#email) button[type=submit]").last.click()
    page.wait_for_selector(".banner")
    return page


def _staff_form(
    path: str, fill: dict[str, str], done: str = ".banner", check: tuple[str, ...] = ()
) -> Reach:
    """A staff form filled in (``fill``: selector → value, "" empties a field; ``check``:
    boxes and radios to choose) and submitted; the state is reached when ``done`` shows."""

    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        page = _staff(new_context, server)
        page.goto(path)
        for selector, value in fill.items():
            page.fill(selector, value)
        for selector in check:
            page.check(selector)
        page.locator("main button[type=submit]").first.click()
        page.wait_for_selector(done)
        return page

    return reach


def _topic_review(
    category: str,
    *,
    new_category: str = "",
    then: str | None = None,
    done: str = "main h1",
) -> Reach:
    """The new-topic form filled in under ``category`` (a category's radio value; "" for
    "A new category", named ``new_category``) and continued to its review; then the
    review's button ``then``, if any."""

    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        page = _staff(new_context, server)
        page.goto("/staff/admin/topics/new")
        page.fill("#slug", "monthly-summary")
        page.locator(f"input[name=category][value='{category}']").check()
        if new_category:
            page.fill("#new_category", new_category)
        page.fill("#label", "Monthly summary")
        page.check("#topic_class")
        page.check("#default_state")
        page.click("button[value=review]")
        page.wait_for_selector(done)
        if then is not None:
            page.get_by_role("button", name=then).click()
            page.wait_for_selector(".banner" if then == "Create topic" else "#slug")
        return page

    return reach


def _policy_preview(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _staff(new_context, server)
    page.goto("/staff/admin/policies/new")
    page.fill("#version", "2026-02")
    page.fill("#text", "We send what you choose.\nNow also a monthly summary, if you ask.")
    page.click("button[value=preview]")
    page.wait_for_selector("#preview-heading")
    return page


def _policy_published(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _policy_preview(new_context, server)
    page.click("button[value=publish]")
    page.wait_for_selector(".banner")
    return page


def _staff_login_error(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = new_context().new_page()
    page.goto("/staff/login")
    page.click("button[type=submit]")
    page.wait_for_selector(".error-summary")
    return page


def _staff_add_error(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _staff(new_context, server)
    page.goto("/staff/admin/staff")
    page.locator("form:has(#email) button[type=submit]").last.click()
    page.wait_for_selector(".error-summary")
    return page


def _staff_job_ran(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _staff(new_context, server)
    page.goto("/staff/ops/jobs")
    page.locator("form[action$='/sweep/run'] button").click()
    page.wait_for_selector(".banner")
    return page


def _staff_submit(path: str, button: str = "button[type=submit]") -> Reach:
    """A staff form submitted empty: its error state."""

    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        page = _staff(new_context, server)
        page.goto(path)
        page.locator(f"main {button}").last.click()
        page.wait_for_selector(".error-summary")
        return page

    return reach


def _lookup_by_no_endpoint(new_context: Callable[..., Any], server: LiveServer) -> Page:
    """The look-up by endpoint given text that is no push endpoint: its form error."""
    page = _staff(new_context, server)
    page.goto("/staff/compliance/lookup")
    page.locator("input[name=endpoint]").fill("not an endpoint")
    page.locator("main button[type=submit]").last.click()
    page.wait_for_selector(".error-summary")
    return page


def _lookup_search(kind: str) -> Reach:
    """The look-up's search: a person by the reference their preference centre shows, a
    second page of account IDs that start alike, an erased person by their receipt ID,
    a search that finds nobody, and one refused (too short to be a prefix)."""

    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        from portal.db import db
        from tests.factories import make_subscriber

        query = {"empty": "nobody-by-this-name", "refused": "ab"}.get(kind, "")
        if kind in ("reference", "receipt"):
            person = _known(new_context)
            query = person.locator(".reference-line .reference").inner_text()
            if kind == "receipt":
                person.goto("/preferences/erase")
                person.check("#erase-confirm")
                person.click("button[type=submit]")
                query = person.locator(".reference").inner_text()
        if kind == "prefix":
            with db.begin(server.app) as session:
                for n in range(1, 26):
                    make_subscriber(session, f"shop-{n:03d}")
            query = "shop-"
        if kind == "more":  # more start alike than the search lists
            from tests.factories import make_accounts

            with db.begin(server.app) as session:
                make_accounts(session, [f"club-{n:04d}" for n in range(1, 1006)])
            query = "club-"
        page = _staff(new_context, server)
        page.goto("/staff/compliance/lookup")
        page.fill("#q", query)
        page.locator("form[role=search] button[type=submit]").click()
        page.wait_for_selector(".error-summary" if kind == "refused" else "#results-count")
        if kind == "prefix":
            page.click("a[rel=next]")
            page.wait_for_url("**page=2")
        return page

    return reach


def _compliance_subscriber(new_context: Callable[..., Any], server: LiveServer) -> Page:
    from tests.factories import SubscriptionFactory

    visitor = new_context()
    subscribe_through_api(visitor, SubscriptionFactory()())
    subscriber_id = uuid.UUID(
        str(server.scalar("SELECT subscriber_id FROM push_subscription LIMIT 1"))
    )
    page = _staff(new_context, server)
    page.goto(f"/staff/compliance/subscribers/{subscriber_id}")
    return page


def _compliance_erase(outcome: str) -> Reach:
    """A compliance officer's erasure: the confirmation, refused unticked, or done (the
    person's history with the receipt to pass on)."""

    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        page = _compliance_subscriber(new_context, server)
        page.click("text=Erase this person's data")
        page.wait_for_selector("#confirm")
        if outcome == "error":
            page.locator("main button[type=submit]").click()
            page.wait_for_selector(".error-summary")
        elif outcome == "done":
            page.check("#confirm")
            page.locator("main button[type=submit]").click()
            page.wait_for_selector("text=Download the erasure receipt")
        return page

    return reach


def _staff_feedback_test(refused: bool) -> Reach:
    """The feedback page after a test digest: accepted, or refused (no secret configured)."""

    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        if refused:
            app = server.app
            settings = current_portal(app).settings.with_overrides(feedback_secrets=())
            current_portal(app).settings = settings
        page = _staff(new_context, server)
        page.goto("/staff/ops/feedback")
        page.click("form[action$='/ops/feedback/test'] button")
        page.wait_for_selector(".banner")
        return page

    return reach


def _staff_job_failed(new_context: Callable[..., Any], server: LiveServer) -> Page:
    """The jobs page with a failed run in its history."""
    import datetime as dt

    with server.session() as session, session.begin():
        session.execute(
            sa.text(
                "INSERT INTO job_run (name, trigger, host, started_at, seconds, processed, "
                "changed, error) VALUES ('purge', 'scheduler', 'web-1:4242', :t, 0.5, 0, 0, "
                "'OperationalError: the database is starting up')"
            ),
            {"t": dt.datetime.now(dt.UTC)},
        )
    page = _staff(new_context, server)
    page.goto("/staff/ops/jobs")
    return page


def _campaign_form(action: str, fill: bool) -> Reach:
    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        page = _staff(new_context, server)
        page.goto("/staff/campaigns/new")
        if fill:
            page.check("#topic") if page.locator(
                "#topic[type=radio]"
            ).count() else page.select_option("#topic", "weekly-digest")
            page.fill("#title", "Monday digest")
            page.fill("#body", "Five things this week.")
        page.click(f"button[value={action}]")
        page.wait_for_load_state()
        return page

    return reach


def _campaign_review_counted_earlier(new_context: Callable[..., Any], server: LiveServer) -> Page:
    """The review page answered with a costly audience count kept from moments ago
    (among millions of subscribers): it says when it was counted, not "right now". Each
    count here costs a second on the count's own clock, so it is kept (the autouse
    fixture of tests/conftest.py puts the views' own back after the test)."""
    from portal.campaigns import views
    from portal.campaigns.readings import CostlyReadings

    ticks = iter(range(1_000_000))
    views._AUDIENCES = CostlyReadings(lambda: float(next(ticks)))
    page = _campaign_form("review", fill=True)(new_context, server)
    assert "as counted at" in page.locator(".audience-total").inner_text()
    return page


def _composer(state: str) -> Reach:
    """The composer's states of test_campaign_composer.py: a rich notification previewed
    per platform and reviewed, a saved draft, a stale save refused, the list of drafts."""

    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        from tests.browser import test_campaign_composer as composer

        made: Reach = getattr(composer, state)()
        return made(new_context, server)

    return reach


def _test_devices(state: str) -> Reach:
    """The states of test_test_devices.py: the Test devices page empty, with this browser
    registered, a refused registration; the review page's choice of devices and its
    answer after a test to them."""

    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        from tests.browser import test_test_devices as devices

        made: Reach = getattr(devices, state)()
        return made(new_context, server)

    return reach


def _campaign_review_with_a_device(new_context: Callable[..., Any], server: LiveServer) -> Page:
    """The review page in a browser the campaigner subscribed on: it offers a test send."""
    from tests.factories import SubscriptionFactory

    page = _staff(new_context, server, email="sender@example.test", roles=("campaigns",))
    subscribe_through_api(page.context, SubscriptionFactory()())
    page.goto("/staff/campaigns/new")
    if page.locator("#topic[type=radio]").count():
        page.check("#topic")
    else:
        page.select_option("#topic", "weekly-digest")
    page.fill("#title", "Monday digest")
    page.fill("#body", "Five things this week.")
    page.click("button[value=review]")
    page.wait_for_selector("text=Send a test to this browser")
    return page


def _campaign_test_sent(new_context: Callable[..., Any], server: LiveServer) -> Page:
    """The review page after a test send to this browser (a GET, after the redirect)."""
    page = _campaign_review_with_a_device(new_context, server)
    page.click("text=Send a test to this browser")
    page.wait_for_selector("text=Test queued")
    return page


def _campaign_page(new_context: Callable[..., Any], server: LiveServer) -> Page:
    from portal.campaigns import services as campaigns
    from portal.db import db

    app = server.app
    with db.begin(app) as session:
        draft = campaigns.CampaignDraft(
            topic="security-alerts", title="New sign-in", body="A new device signed in."
        )
        campaign = campaigns.create_campaign(
            session, draft, created_by="staff", now=current_portal(app).clock.now()
        )
    page = _staff(new_context, server)
    page.goto(f"/staff/campaigns/{campaign.id}")
    return page


def _campaign_outcome(kind: str) -> Reach:
    """The campaign page when every delivery failed, or while deliveries are retried
    (the states of test_campaign_outcome.py)."""

    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        from tests.browser.test_campaign_outcome import failed_campaign, retrying_campaign

        made = failed_campaign if kind == "failed" else retrying_campaign
        campaign_id = made(server)
        page = _staff(new_context, server, email="sender@example.test", roles=("campaigns",))
        page.goto(f"/staff/campaigns/{campaign_id}")
        return page

    return reach


def _campaign_funnel(kind: str) -> Reach:
    """The campaign page's delivery funnel with receipts, or before any (the states of
    test_campaign_funnel.py)."""

    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        from tests.browser.test_campaign_funnel import (
            buttons_campaign,
            seen_campaign,
            unseen_campaign,
        )

        made = {"seen": seen_campaign, "buttons": buttons_campaign}.get(kind, unseen_campaign)
        campaign_id = made(server)
        page = _staff(new_context, server, email="sender@example.test", roles=("campaigns",))
        page.goto(f"/staff/campaigns/{campaign_id}")
        page.wait_for_selector("#funnel-counts")
        return page

    return reach


def _campaign_zone(state: str) -> Reach:
    """The campaign form's zone picker listing what was typed ("matches"), the form
    refusing an alias ("alias-error"), and a campaign scheduled in Europe/Paris on its page
    ("page") and in the list ("list") (the states of test_campaign_zones.py)."""

    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        from tests.browser.test_campaign_zones import fill_campaign, send_day, type_zone

        page = _staff(new_context, server, email="sender@example.test", roles=("campaigns",))
        page.goto("/staff/campaigns/new")
        page.wait_for_load_state("load")
        fill_campaign(page, f"{send_day().isoformat()}T09:00")
        if state == "matches":
            type_zone(page, "europe")
            page.wait_for_selector("#timezone-listbox:not([hidden])")
            return page
        type_zone(page, "US/Eastern" if state == "alias-error" else "Europe/Paris")
        page.click("button[value=review]")
        if state == "alias-error":
            page.wait_for_selector(".error-summary")
            return page
        page.click("button[value=launch]")
        page.wait_for_selector("#campaign-sends time")
        if state == "list":
            page.goto("/staff/campaigns")
            page.wait_for_selector(".campaign-sends time")
        return page

    return reach


def _banner(page: Page) -> Page:
    page.wait_for_selector(".banner")
    return page


def _campaign_launched(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _campaign_form("review", fill=True)(new_context, server)
    page.click("button[value=launch]")
    page.wait_for_selector(".banner")
    return page


def _colleague(server: LiveServer) -> str:
    """Another member of staff (campaigns role) to look at; their id."""
    from portal.db import db
    from portal.staff import services
    from portal.staff.models import Role

    app = server.app
    with app.app_context(), db.begin() as session:
        user = services.create_staff(
            session,
            email="colleague@example.test",
            password=STAFF_PASSWORD,
            roles=(Role.CAMPAIGNS,),
            actor=None,
            passwords=current_portal(app).passwords,
            now=current_portal(app).clock.now(),
            via="test",
            must_replace_password=False,
        )
        return str(user.id)


def _staff_detail(roles: tuple[str, ...] | None) -> Reach:
    """A staff account's page: as opened (``roles`` None), or with ``roles`` saved (an
    empty tuple is the error state)."""

    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        colleague = _colleague(server)
        page = _staff(new_context, server)
        page.goto(f"/staff/admin/staff/{colleague}")
        page.wait_for_selector("input[name=roles]")
        if roles is None:
            return page
        for box in page.locator("input[name=roles]").all():
            box.set_checked(box.get_attribute("value") in roles)
        page.click("text=Save roles")
        page.wait_for_selector(".error-summary" if not roles else ".banner")
        return page

    return reach


def _password_changed(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _staff(new_context, server)
    page.goto("/staff/password")
    page.fill("#current_password", STAFF_PASSWORD)
    page.fill("#new_password", "a long and lovely passphrase")
    page.fill("#confirm_password", "a long and lovely passphrase")
    page.click("main button[type=submit]")
    return _banner(page)


def _campaigns_listed(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _campaign_page(new_context, server)
    page.goto("/staff/campaigns")
    page.wait_for_selector("main table")
    return page


def _campaign_cancel_error(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _campaign_page(new_context, server)
    page.click("text=Cancel campaign")
    page.wait_for_selector(".error-summary")
    return page


def _topic_retired(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _staff(new_context, server)
    page.goto("/staff/admin/topics/offers/retire")
    page.locator("main button[type=submit]").last.click()
    return _banner(page)


def _log_check_requested(new_context: Callable[..., Any], server: LiveServer) -> Page:
    page = _staff(new_context, server)
    page.goto("/staff/compliance/")
    page.click("text=Check the whole log now")
    return _banner(page)


NEWCOMER = "newcomer@example.test"
GIVEN_PASSWORD = "a password an admin typed"


def first_sign_in(new_context: Callable[..., Any], server: LiveServer) -> Page:
    """Someone whose account was made with ``portal create-staff``, signing in for the
    first time: sent to choose their own password."""
    made = server.app.test_cli_runner().invoke(
        args=["portal", "create-staff", NEWCOMER, "--role", "admin", "--password-stdin"],
        input=GIVEN_PASSWORD + "\n",
    )
    assert made.exit_code == 0, made.output
    page = new_context().new_page()
    page.goto("/staff/login")
    page.fill("#email", NEWCOMER)
    page.fill("#password", GIVEN_PASSWORD)
    page.click("main button[type=submit]")
    page.wait_for_url("**/staff/password")
    return page


def _first_password_kept(new_context: Callable[..., Any], server: LiveServer) -> Page:
    """At first sign-in, the password one was given typed again as the new one."""
    page = first_sign_in(new_context, server)
    for field in ("#current_password", "#new_password", "#confirm_password"):
        page.fill(field, GIVEN_PASSWORD)
    page.click("main button[type=submit]")
    page.wait_for_selector(".error-summary")
    return page


def audit_after_cli_publish(new_context: Callable[..., Any], server: LiveServer) -> Page:
    """The audit trail, filtered to policy versions, after ``portal policy publish`` run
    by the operating-system user ``deploy``."""
    current_portal(server.app).os_user = lambda: "deploy"
    with tempfile.TemporaryDirectory() as folder:
        notice = Path(folder) / "notice.txt"
        notice.write_text("We send only what you choose.\nStop at any time.\n", encoding="utf-8")
        published = server.app.test_cli_runner().invoke(
            args=["portal", "policy", "publish", "2026-02", "--file", str(notice)]
        )
    assert published.exit_code == 0, published.output
    page = _staff(new_context, server)
    page.goto("/staff/admin/audit?action=policy.published")
    return page


STAFF_PAGES = [
    PageState("staff-campaigns", _staff_page("/staff/campaigns")),
    PageState("staff-campaign-new", _staff_page("/staff/campaigns/new")),
    PageState("staff-campaign-new-error", _campaign_form("review", fill=False), error_summary=True),
    PageState("staff-campaign-preview", _campaign_form("preview", fill=True)),
    PageState("staff-campaign-review", _campaign_form("review", fill=True)),
    PageState("staff-campaign-review-counted-earlier", _campaign_review_counted_earlier),
    PageState("staff-campaign", _campaign_page),
    PageState("staff-campaign-all-failed", _campaign_outcome("failed")),
    PageState("staff-campaign-retrying", _campaign_outcome("retrying")),
    PageState("staff-campaign-funnel", _campaign_funnel("seen")),
    PageState("staff-campaign-funnel-no-receipts", _campaign_funnel("unseen")),
    PageState("staff-campaign-funnel-buttons", _campaign_funnel("buttons")),
    PageState("staff-campaign-launched", _campaign_launched),
    PageState("staff-campaign-test-sent", _campaign_test_sent),
    PageState("staff-campaigns-listed", _campaigns_listed),
    PageState("staff-campaign-new-zone-matches", _campaign_zone("matches")),
    PageState(
        "staff-campaign-new-zone-alias-error", _campaign_zone("alias-error"), error_summary=True
    ),
    PageState("staff-campaign-scheduled-in-zone", _campaign_zone("page")),
    PageState("staff-campaigns-listed-in-zone", _campaign_zone("list")),
    PageState("staff-campaign-cancel-error", _campaign_cancel_error, error_summary=True),
    PageState("staff-campaign-not-found", _staff_missing(f"/staff/campaigns/{uuid.uuid4()}")),
    PageState("staff-campaign-rich-preview", _composer("rich_preview")),
    PageState("staff-campaign-rich-review", _composer("rich_review")),
    PageState("staff-campaign-draft", _composer("saved_draft")),
    PageState("staff-campaign-draft-stale", _composer("stale_draft")),
    PageState("staff-campaigns-with-drafts", _composer("drafts_listed")),
    PageState("staff-campaign-picture-uploaded", _composer("picture_uploaded")),
    PageState("staff-campaign-picture-refused", _composer("picture_refused"), error_summary=True),
    PageState("staff-test-devices-empty", _test_devices("empty")),
    PageState("staff-test-devices-one", _test_devices("registered")),
    PageState("staff-test-devices-error", _test_devices("refused"), error_summary=True),
    PageState("staff-campaign-review-devices", _test_devices("review")),
    PageState("staff-campaign-devices-tested", _test_devices("after_a_test")),
    PageState("staff-admin-topics", _staff_page("/staff/admin/topics")),
    PageState("staff-admin-topic-new", _staff_page("/staff/admin/topics/new")),
    PageState(
        "staff-admin-topic-new-error", _staff_submit("/staff/admin/topics/new"), error_summary=True
    ),
    PageState("staff-admin-topic-review", _topic_review("News")),
    PageState("staff-admin-topic-review-new-category", _topic_review("", new_category="Events")),
    PageState("staff-admin-topic-back", _topic_review("News", then="Go back and change")),
    PageState(
        "staff-admin-topic-new-near-duplicate",
        _topic_review("", new_category="news", done=".error-summary"),
        error_summary=True,
    ),
    PageState("staff-admin-topic-added", _topic_review("News", then="Create topic")),
    PageState("staff-admin-topic-edit", _staff_page("/staff/admin/topics/offers/edit")),
    PageState(
        "staff-admin-topic-edit-error",
        _staff_form("/staff/admin/topics/offers/edit", {"#label": ""}, ".error-summary"),
        error_summary=True,
    ),
    PageState("staff-admin-topic-retire", _staff_page("/staff/admin/topics/offers/retire")),
    PageState("staff-admin-policies", _staff_page("/staff/admin/policies")),
    PageState("staff-admin-policy-new", _staff_page("/staff/admin/policies/new")),
    PageState(
        "staff-admin-policy-new-error",
        _staff_submit("/staff/admin/policies/new"),
        error_summary=True,
    ),
    PageState("staff-admin-policy-preview", _policy_preview),
    PageState("staff-admin-policy-published", _policy_published),
    PageState("staff-admin-policy-version", _staff_page("/staff/admin/policies/versions/2026-01")),
    PageState("staff-compliance-dashboard", _staff_page("/staff/compliance/")),
    PageState("staff-compliance-lookup", _staff_page("/staff/compliance/lookup")),
    PageState(
        "staff-compliance-lookup-error",
        _staff_submit("/staff/compliance/lookup"),
        error_summary=True,
    ),
    PageState("staff-compliance-lookup-endpoint-error", _lookup_by_no_endpoint, error_summary=True),
    PageState("staff-compliance-lookup-by-reference", _lookup_search("reference")),
    PageState("staff-compliance-lookup-page-2", _lookup_search("prefix")),
    PageState("staff-compliance-lookup-more-than-listed", _lookup_search("more")),
    PageState("staff-compliance-lookup-by-receipt", _lookup_search("receipt")),
    PageState("staff-compliance-lookup-no-results", _lookup_search("empty")),
    PageState(
        "staff-compliance-lookup-search-error", _lookup_search("refused"), error_summary=True
    ),
    PageState("staff-compliance-subscriber", _compliance_subscriber),
    PageState("staff-compliance-erase", _compliance_erase("confirm")),
    PageState("staff-compliance-erase-error", _compliance_erase("error"), error_summary=True),
    PageState("staff-compliance-erased", _compliance_erase("done")),
    PageState("staff-compliance-export", _staff_page("/staff/compliance/export")),
    PageState(
        "staff-compliance-export-error",
        _staff_form("/staff/compliance/export", {"#date_from": ""}, ".error-summary"),
        error_summary=True,
    ),
    PageState("staff-compliance-signing-key", _staff_page("/staff/compliance/signing-key")),
    PageState("staff-compliance-consent-log", _staff_page("/staff/compliance/consent-log")),
    PageState("staff-login", _open("/staff/login")),
    PageState("staff-login-error", _staff_login_error, error_summary=True),
    PageState("staff-signed-out", _staff_signed_out),
    PageState("staff-dashboard", _staff_page("/staff/")),
    PageState("staff-forbidden", _staff_forbidden),
    PageState("staff-not-found", _staff_missing(f"/staff/admin/staff/{uuid.uuid4()}")),
    PageState("staff-form-expired", _staff_expired_form),
    PageState("staff-password", _staff_page("/staff/password")),
    PageState("staff-password-error", _staff_submit("/staff/password"), error_summary=True),
    PageState("staff-admin-staff", _staff_page("/staff/admin/staff")),
    PageState("staff-admin-staff-error", _staff_add_error, error_summary=True),
    PageState("staff-admin-staff-added", _staff_added),
    PageState("staff-admin-staff-detail", _own_staff_detail),
    PageState("staff-admin-staff-detail-error", _staff_detail_error, error_summary=True),
    PageState(
        "staff-admin-staff-disable-self",
        _staff_disable_self,
        error_summary=True,
        summary_links_to_fields=False,  # no field: the section says why
    ),
    PageState("staff-audit", _staff_page("/staff/admin/audit")),
    PageState(
        "staff-audit-error",
        _staff_page("/staff/admin/audit?date_from=not-a-day"),
        error_summary=True,
    ),
    PageState("staff-ops-jobs", _staff_page("/staff/ops/jobs")),
    PageState("staff-ops-jobs-ran", _staff_job_ran),
    PageState("staff-ops-jobs-failed-run", _staff_job_failed),
    PageState("staff-ops-feedback", _staff_page("/staff/ops/feedback")),
    PageState("staff-ops-feedback-test-accepted", _staff_feedback_test(refused=False)),
    PageState("staff-ops-feedback-test-refused", _staff_feedback_test(refused=True)),
    PageState("staff-admin-staff-detail-saved", _staff_detail(("compliance",))),
    PageState("staff-password-changed", _password_changed),
    PageState("staff-first-password", first_sign_in),
    PageState("staff-first-password-error", _first_password_kept, error_summary=True),
    PageState("staff-audit-command-line", audit_after_cli_publish),
    PageState("staff-admin-topic-retired", _topic_retired),
    PageState("staff-compliance-log-check-requested", _log_check_requested),
]

PAGES = [
    PageState("subscribe", _open("/")),
    PageState("subscribe-no-javascript", _without_javascript("/")),
    PageState("subscribe-denied", _subscribe_page_after("state-denied", answer="denied")),
    PageState("subscribe-dismissed", _subscribe_page_after("state-dismissed", answer="default")),
    PageState("subscribe-network-failure", _subscribe_page_after("state-failed", abort=True)),
    PageState("subscribe-success", _subscribe_page_after("state-success")),
    PageState("subscribe-already-subscribed", _already_subscribed),
    PageState("subscribe-unsubscribed", _unsubscribed),
    PageState("subscribe-unsubscribe-failed", _unsubscribe_failed),
    PageState(
        "subscribe-browser-error",
        _subscribe_page_after("state-browser-error", init=REFUSING_PUSH_SERVICE),
    ),
    PageState("subscribe-cancelled", _cancelled),
    PageState(
        "subscribe-stopped", _after_the_server_ended_it(_stop_behind_the_browser, "state-stopped")
    ),
    PageState(
        "subscribe-erased", _after_the_server_ended_it(erase_behind_the_browser, "state-erased")
    ),
    PageState(
        "subscribe-not-subscribed",
        _after_the_server_ended_it(_purge_behind_the_browser, "state-not-subscribed"),
    ),
    PageState(
        "subscribe-stopped-390",
        _after_the_server_ended_it(_stop_behind_the_browser, "state-stopped", viewport=PHONE),
    ),
    PageState("subscribe-check-failed", _check_failed),
    PageState(
        "subscribe-no-javascript-subscribed",
        _without_javascript("/", _subscribed_without_javascript),
    ),
    PageState(
        "subscribe-no-javascript-stopped", _without_javascript("/", _stopped_without_javascript)
    ),
    PageState(
        "subscribe-no-javascript-erased", _without_javascript("/", _erased_without_javascript)
    ),
    PageState(
        "preferences-this-device-no-javascript",
        _without_javascript("/preferences", _subscribed_without_javascript),
    ),
    PageState("subscribe-unsupported", _subscribe_page_with(NO_PUSH, "state-unsupported")),
    PageState(
        "subscribe-ios",
        _subscribe_page_with(
            "delete window.PushManager;",
            "state-ios",
            user_agent=IPHONE_UA,
            viewport={"width": 390, "height": 844},
        ),
    ),
    PageState("preferences-no-identity", _open("/preferences")),
    PageState("preferences", _preferences),
    PageState("preferences-saved", _preferences_saved),
    PageState("preferences-one-a-day", _preferences_one_a_day),
    PageState("preferences-how-often-refused", _preferences_how_often_refused, error_summary=True),
    PageState("preferences-quiet-hours-saved", _preferences_quiet_hours_saved),
    PageState(
        "preferences-quiet-hours-refused", _preferences_quiet_hours_refused, error_summary=True
    ),
    PageState("preferences-receipts-limited", _preferences_receipts_limited),
    PageState("preferences-saves-limited", _preferences_saves_limited),
    PageState("preferences-device-stopped", _preferences_device_stopped),  # no devices left
    PageState("preferences-stale-policy", _preferences_stale_policy, error_summary=True),
    PageState("preferences-notice-changed", _preferences_notice_changed),
    PageState(
        "preferences-unknown-device",
        _preferences_unknown_device,
        error_summary=True,
        summary_links_to_fields=False,  # the error is about this device: it leads to them
    ),
    PageState("preferences-database-down", _database_down),
    PageState("policy", _open("/policy/2026-01")),
    PageState("policy-digest-open", _policy_digest_open),
    PageState("link-error", _open("/preferences?token=not-a-valid-token")),
    PageState("account-link-confirm", _account_link()),
    PageState("account-link-confirm-390", _account_link(viewport=PHONE)),
    PageState("not-found", _open("/no/such/page")),
    PageState("method-not-allowed", _open("/preferences/stop-device")),
    PageState("erase-confirm", lambda new_context, server: _erase(new_context, False)),
    PageState(
        "erase-error", lambda new_context, server: _erase(new_context, True), error_summary=True
    ),
    PageState("erase-done", _erased),
    *STAFF_PAGES,
]


FOCUSABLE = (
    "a[href], button, input:not([type=hidden]), select, textarea, summary, "
    "[tabindex]:not([tabindex='-1'])"
)

MARK_AND_MEASURE = """(selector) => {
  const style = (el) => {
    const s = getComputedStyle(el);
    return [s.outlineStyle, s.outlineWidth, s.outlineColor, s.boxShadow].join('|');
  };
  let index = 0;
  const out = {};
  for (const el of document.querySelectorAll(selector)) {
    el.dataset.a11yIndex = String(index);
    out[index] = style(el);
    index += 1;
  }
  return out;
}"""

FOCUSED = """() => {
  const el = document.activeElement;
  if (!el || el === document.body || el.dataset.a11yIndex === undefined) return null;
  const s = getComputedStyle(el);
  return {
    index: el.dataset.a11yIndex,
    label: el.tagName + '#' + el.id + ' ' + (el.textContent || el.value || '').trim().slice(0, 40),
    style: [s.outlineStyle, s.outlineWidth, s.outlineColor, s.boxShadow].join('|'),
    outline: s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) >= 2,
    shadow: s.boxShadow !== 'none',
  };
}"""


def focus_problems(page: Page) -> list[str]:
    """Tab through the page: every element it reaches shows a focus indicator."""
    # Nothing focused while each element's resting style is read (an error summary's
    # link may just have moved focus to a field).
    page.evaluate("document.activeElement && document.activeElement.blur()")
    unfocused = page.evaluate(MARK_AND_MEASURE, FOCUSABLE)
    page.mouse.move(0, 0)
    seen: set[str] = set()
    problems = []
    for _ in range(len(unfocused) + 5):
        page.keyboard.press("Tab")
        focused = page.evaluate(FOCUSED)
        if focused is None:
            continue
        if focused["index"] in seen:
            break
        seen.add(focused["index"])
        if focused["style"] == unfocused[focused["index"]] or not (
            focused["outline"] or focused["shadow"]
        ):
            problems.append(focused["label"])
    if not seen:
        return ["Tab reached nothing"]
    return [f"no visible focus indicator on {label}" for label in problems]


TARGETS = """() => {
  const bad = [];
  const inText = (a) => {
    const block = a.closest('p, li, td, dd');
    return block !== null && block.textContent.trim() !== a.textContent.trim();
  };
  for (const el of document.querySelectorAll('a[href], button, input:not([type=hidden]), select, textarea')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;  // not rendered
    if (el.closest('.visually-hidden')) continue;
    if (el.tagName === 'A' && inText(el)) continue;  // WCAG 2.5.8 inline exception
    if (r.width < 24 || r.height < 24) {
      bad.push(`${el.tagName}#${el.id} "${(el.textContent || '').trim().slice(0, 30)}" ${r.width}x${r.height}`);
    }
  }
  return bad;
}"""


def target_problems(page: Page) -> list[str]:
    return [f"target smaller than 24x24 px: {target}" for target in page.evaluate(TARGETS)]


def error_summary_problems(page: Page, state: PageState) -> list[str]:
    """The summary has focus when the page opens; each link names a field (or the
    section, where ``summary_links_to_fields`` is False) and moves focus to it."""
    problems = []
    if not page.title().startswith("Error: "):
        problems.append(f"an error page's title does not start with 'Error: ': {page.title()}")
    if "error-summary" not in page.evaluate("document.activeElement.className"):
        problems.append("the error summary does not have focus when the page opens")
    links = page.locator(".error-summary a")
    if links.count() == 0:
        problems.append("the error summary links to nothing")
    for index in range(links.count()):
        target = links.nth(index).get_attribute("href") or ""
        if not target.startswith("#") or page.locator(target).count() != 1:
            problems.append(f"the error summary link {target!r} names no element")
            continue
        if state.summary_links_to_fields:
            tag = page.locator(target).evaluate("el => el.tagName")
            if tag not in ("INPUT", "SELECT", "TEXTAREA"):
                problems.append(f"the error summary link {target} leads to a {tag}, not a field")
        links.nth(index).click()
        if page.evaluate("document.activeElement.id") != target[1:]:
            problems.append(f"the error summary link {target} does not move focus there")
    return problems


TITLE_SUFFIX = " – Push consent portal"

DESCRIPTIONS = """() => {
  const problems = [];
  const ids = (el) => (el.getAttribute('aria-describedby') || '').split(/\\s+/).filter(Boolean);
  const name = (el) => el.tagName + (el.id ? '#' + el.id : '');
  for (const el of document.querySelectorAll('[aria-describedby]')) {
    for (const id of ids(el)) {
      if (!document.getElementById(id)) problems.push(`${name(el)} names missing #${id}`);
    }
  }
  // A fieldset's own hint and error (not an item's, inside a choice) are named by it.
  for (const fieldset of document.querySelectorAll('fieldset')) {
    const named = ids(fieldset);
    for (const text of fieldset.querySelectorAll('.hint, .field-error')) {
      if (text.closest('fieldset') !== fieldset) continue;
      if (text.closest('.choice, .radio, .checkbox')) continue;
      if (text.closest('.form-group') !== fieldset.closest('.form-group')) continue;
      if (!text.id || !named.includes(text.id)) {
        problems.push(`fieldset "${fieldset.querySelector('legend').textContent.trim()}" ` +
                      `does not name its ${text.className} "${text.textContent.trim().slice(0, 40)}"`);
      }
    }
  }
  // An invalid field names its error, itself or through its fieldset.
  for (const el of document.querySelectorAll('[aria-invalid=true]')) {
    const fieldset = el.closest('fieldset');
    const named = ids(el).concat(fieldset ? ids(fieldset) : []);
    const error = named.some((id) => {
      const target = document.getElementById(id);
      return target && target.classList.contains('field-error');
    });
    if (!error) problems.push(`${name(el)} is invalid but names no error message`);
  }
  // A date field shows the browser's own format (11/01/2026 here), so a hint that gives an
  // example in another (2026-01-01) contradicts the field it describes.
  for (const el of document.querySelectorAll('input[type=date]')) {
    for (const id of ids(el)) {
      const hint = document.getElementById(id);
      if (hint && hint.classList.contains('hint') &&
          /\\b\\d{4}-\\d{2}-\\d{2}\\b/.test(hint.textContent)) {
        problems.push(`${name(el)}'s hint gives a date as the field never shows one: ` +
                      `"${hint.textContent.trim().slice(0, 60)}"`);
      }
    }
  }
  return problems;
}"""


def title_and_description_problems(page: Page) -> list[str]:
    problems = []
    title = page.title()
    if not title.endswith(TITLE_SUFFIX) or "<" in title or len(title) <= len(TITLE_SUFFIX) + 3:
        problems.append(f"the title is not a plain name of the page: {title!r}")
    return problems + page.evaluate(DESCRIPTIONS)


# Elements wider than the page, and text set to break anywhere: both make a phone user
# scroll sideways or read half-words.
OVERFLOW = """() => {
  const width = document.documentElement.clientWidth;
  const wide = [];
  const broken = [];
  for (const el of document.body.querySelectorAll('*')) {
    const style = getComputedStyle(el);
    if (style.wordBreak === 'break-all') broken.push(el.tagName.toLowerCase());
    const r = el.getBoundingClientRect();
    if (r.width === 0 || style.position === 'fixed') continue;
    if (el.closest('.visually-hidden')) continue;
    if (r.right > width + 0.5) {  // (off to the left, as a skip link waits, scrolls nothing)
      wide.push(`${el.tagName.toLowerCase()}${el.id ? '#' + el.id : ''}` +
                `${el.className && typeof el.className === 'string' ? '.' + el.className.split(' ')[0] : ''}` +
                ` ${Math.round(r.left)}..${Math.round(r.right)}`);
    }
  }
  return {
    scroll: document.documentElement.scrollWidth - window.innerWidth,
    wide: wide.slice(0, 8),
    broken: broken.slice(0, 8),
  };
}"""

# The narrowest phones in use, and 1280 px zoomed to 400 % (WCAG 1.4.10 Reflow); then a
# common phone.
NARROW = [{"width": 320, "height": 640}, {"width": 390, "height": 844}]


def styled(page: Page) -> Page:
    """The page as its user sees it: a test that waited for an element can hold a document
    whose stylesheet is still on its way, and measured unstyled a skip link sits in the
    flow and the header's links are 17 px tall (axe-core's target-size failed so, once in
    a CI run). "load" fires once the stylesheets and deferred scripts (focus.js among
    them) are in."""
    page.wait_for_load_state("load")
    return page


# The words of the page's table cells that are split across two lines ("Curren/t"): a
# column is never narrower than its longest word. A hyphen is a place a line may end (the
# parts of a UUID are words of their own); codes (hashes, ids) may break anywhere.
BROKEN_WORDS = """() => {
  const found = [];
  for (const cell of document.querySelectorAll('main table td, main table th')) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT, {
      acceptNode: (node) => node.parentElement.closest('code')
        ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT,
    });
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const word of node.textContent.matchAll(/[^\\s-]+/g)) {
        const range = document.createRange();
        range.setStart(node, word.index);
        range.setEnd(node, word.index + word[0].length);
        const tops = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
        if (tops.size > 1) found.push(word[0]);
      }
    }
  }
  return found;
}"""


def page_overflow(page: Page) -> dict[str, Any]:
    """OVERFLOW measured on the styled page."""
    return styled(page).evaluate(OVERFLOW)


def axe_results(page: Page) -> AxeResults:
    """axe-core's findings on the styled page as it is now. Its 570 kB script is put into
    each document once (a page that navigates gets it again), not before every run: a
    state is checked at three widths, and the injection cost as much as the run."""
    styled(page)
    if not page.evaluate("typeof window.axe === 'object' && typeof window.axe.run === 'function'"):
        page.evaluate(_axe.axe_script)
    return AxeResults(page.evaluate("(options) => axe.run(document, options)", AXE_OPTIONS))


def axe_problems(page: Page) -> list[str]:
    results = axe_results(page)
    return [results.generate_report()] if results.violations_count else []


def narrow_screen_problems(page: Page) -> list[str]:
    """At each phone width: nothing scrolls sideways, no word is broken anywhere to fit,
    and axe-core still finds nothing (stacked tables keep their meaning)."""
    problems = []
    for viewport in NARROW:
        page.set_viewport_size(viewport)
        width = viewport["width"]
        if page.evaluate("window.innerWidth") != width:
            problems.append(f"the window did not become {width} px wide")
            continue
        found = page_overflow(page)
        if found["scroll"] > 0 or found["wide"]:
            problems.append(
                f"scrolls sideways by {found['scroll']} px at {width} px: {found['wide']}"
            )
        if found["broken"]:
            problems.append(f"breaks words anywhere at {width} px: {found['broken']}")
        problems += [f"at {width} px: {report}" for report in axe_problems(page)]
    return problems


@pytest.mark.parametrize("state", PAGES, ids=str)
def test_every_page_state_passes_every_check(
    state: PageState, new_context: Any, server: LiveServer, csp_violations: list[str]
) -> None:
    """Each state is reached once and given every check; the failure lists them all.

    The order keeps each check's premise: the page is as it opened (nothing scrolled,
    nothing focused by the test) for axe-core and the phone widths, which run before the
    state's own width is restored for the error summary's focus and the keyboard walk."""
    page = styled(state.reach(new_context, server))
    # Reaching the state ran the page's scripts and loaded its styles and images: none of
    # it may have broken the Content-Security-Policy.
    found: dict[str, list[str]] = {"content security policy": list(csp_violations)}
    found["axe-core"] = axe_problems(page)
    found["title and field descriptions"] = title_and_description_problems(page)
    found["target size"] = target_problems(page)
    own_size = page.viewport_size or DESKTOP
    found["phone widths"] = narrow_screen_problems(page)
    page.set_viewport_size(own_size)
    if state.error_summary:
        found["error summary"] = error_summary_problems(page, state)
    found["focus visible"] = focus_problems(page)
    if own_size["width"] >= DESKTOP["width"]:
        found["words split at desktop width"] = page.evaluate(BROKEN_WORDS)
    failed = {check: problems for check, problems in found.items() if problems}
    assert not failed, "\n".join(
        f"{state} fails {check}:\n  " + "\n  ".join(problems) for check, problems in failed.items()
    )


def test_the_checks_measure_the_page_once_its_stylesheet_is_in(new_context: Any) -> None:
    """A test may wait for an element and check the page at once; the stylesheet can still
    be on its way then. Held back here until the element shows, it is let go just before
    the checks: they must see the styled page (unstyled, the skip link sits in the flow and
    the header's links are 17 px tall, which axe-core's target-size refuses)."""
    context = new_context(viewport=DESKTOP)
    page = context.new_page()
    # Once let go, the stylesheet takes a slow network's time: longer than the checks'
    # own start (axe-core's script is put in first), so a check that does not wait for
    # it measures the unstyled page.
    network = context.new_cdp_session(page)
    network.send("Network.enable")
    network.send(
        "Network.emulateNetworkConditions",
        {"offline": False, "latency": 1000, "downloadThroughput": -1, "uploadThroughput": -1},
    )
    held: list[Route] = []
    # (A lambda: Playwright cannot wrap a built-in method such as held.append.)
    page.route("**/*.css*", lambda route: held.append(route))  # noqa: PLW0108
    page.goto("/", wait_until="commit")
    page.wait_for_selector(".brand")
    assert held, "the stylesheet was asked for"
    unstyled = "getComputedStyle(document.querySelector('.skip-link')).position"
    assert page.evaluate(unstyled) == "static"  # the premise: no stylesheet yet

    for route in held:
        route.continue_()
    assert axe_problems(page) == []
    assert page.evaluate(unstyled) == "absolute"
    assert page_overflow(page)["scroll"] <= 0
