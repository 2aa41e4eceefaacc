"""Browser tests: the real portal on a free port, Debian's Chromium driven by Playwright.

Each test gets a fresh, migrated database with the demo catalogue, the app served by a
Werkzeug server in a thread on 127.0.0.1 (a secure context, so service workers run over
plain HTTP) and a new browser context. Headless Chromium cannot reach a push service, so
``push_stub.js`` stands in for ``pushManager.subscribe()`` with a subscription whose keys
the test holds; everything after that is real.

Without Chromium the tests are skipped locally and fail under CI (``CI`` set).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from playwright.sync_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    Page,
    Playwright,
    sync_playwright,
)
from sqlalchemy.orm import Session
from werkzeug.serving import BaseWSGIServer, make_server

from portal import create_app
from portal.clock import SystemClock
from portal.config import RateLimitSettings
from portal.consent.demo import seed
from portal.staff.passwords import Passwords
from tests.conftest import make_settings
from tests.factories import BrowserSubscription, SubscriptionFactory
from tests.staff.conftest import FAST_HASHER

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
# Chromium keeps only the last --disable-features it is given, so ours restates
# Playwright's own list (tests/browser/test_browser_setup.py fails when it grows) and adds
# the address bar's suggestion popups: each browser window (a context) otherwise starts two
# WebUI renderers for an address bar no test has, about 70 ms and 100 MB a context.
PLAYWRIGHT_DISABLED_FEATURES = (
    "AvoidUnnecessaryBeforeUnloadCheckSync",
    "DestroyProfileOnBrowserClose",
    "HttpsUpgrades",
    "HttpsFirstBalancedModeAutoEnable",
    "LensOverlay",
    "MediaRouter",
    "PaintHolding",
    "ThirdPartyStoragePartitioning",
    "AvoidCorsURLLoaderRestartOnRedirect",
    "TcpPortRandomizationWin",
    "OptimizationHints",
    "NetworkTimeServiceQuerying",
    "AimEnabled",
    "PreconnectToSearch",
    "msForceBrowserSignIn",
    "msEdgeUpdateLaunchServicesPreferredVersion",
)
OMNIBOX_POPUPS = ("WebUIOmniboxPopup", "WebUIOmniboxAimPopup", "WebUIOmniboxFullPopup")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-features=" + ",".join(PLAYWRIGHT_DISABLED_FEATURES + OMNIBOX_POPUPS),
]
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}


def chromium_path() -> str | None:
    configured = os.environ.get("PORTAL_TEST_CHROMIUM")
    for candidate in (configured, "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


@pytest.fixture(scope="session")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="session")
def browser(playwright: Playwright) -> Iterator[Browser]:
    path = chromium_path()
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing (/usr/bin/chromium): CI must run the browser tests")
        pytest.skip("no Chromium at /usr/bin/chromium: apt-get install chromium to run these")
    chromium = playwright.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)
    yield chromium
    chromium.close()


@dataclass
class LiveServer:
    url: str
    app: Flask

    def session(self) -> Session:
        return Session(self.app.extensions["portal.db"].engine)

    def scalar(self, sql: str, **params: Any) -> Any:
        with self.session() as session:
            return session.execute(sa.text(sql), params).scalar()

    def rows(self, sql: str, **params: Any) -> list[sa.Row[Any]]:
        with self.session() as session:
            return list(session.execute(sa.text(sql), params).all())


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[LiveServer]:
    # A real clock: the browser's own timers and the server's must agree. The API's
    # default rate limits apply: a real browser must never reach them. Staff passwords
    # are hashed with cheap parameters: the browser tests sign in often, and the real
    # parameters are tested in tests/staff/test_passwords.py.
    settings = make_settings(
        database_url, str(tmp_path / "instance"), rate_limit=RateLimitSettings()
    )
    app = create_app(settings, clock=SystemClock(), passwords=Passwords(FAST_HASHER))
    seed(app)  # the demo topics and policy "2026-01", as a fresh development start has
    httpd: BaseWSGIServer = make_server("127.0.0.1", 0, app, threaded=True)
    # A short poll: shutdown() waits for the loop to look up, half a second by default,
    # and every browser test ends with it.
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="live-server", daemon=True
    )
    thread.start()
    try:
        yield LiveServer(f"http://127.0.0.1:{httpd.server_port}", app)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)
        app.extensions["portal.db"].engine.dispose()


@pytest.fixture
def browser_subscription() -> BrowserSubscription:
    return SubscriptionFactory()("fcm")


def push_stub_script(subscription: BrowserSubscription) -> str:
    source = (HERE / "push_stub.js").read_text()
    return source.replace("__SUBSCRIPTION__", json.dumps(subscription.to_json()))


# Every page reports Content-Security-Policy violations to the console, where the
# context's listener collects them (Chromium also logs its own "Refused to …" lines).
REPORT_CSP_VIOLATIONS = """
document.addEventListener('securitypolicyviolation', (event) => {
  console.error('CSP violation: ' + event.violatedDirective + ' blocked ' +
    (event.blockedURI || 'inline') + ' at ' + event.sourceFile + ':' + event.lineNumber);
});
"""


def is_csp_violation(text: str) -> bool:
    return text.startswith("CSP violation") or "Content Security Policy" in text


@pytest.fixture
def csp_violations() -> list[str]:
    """Console messages about Content-Security-Policy violations, from every context."""
    return []


@pytest.fixture
def new_context(
    browser: Browser,
    server: LiveServer,
    browser_subscription: BrowserSubscription,
    csp_violations: list[str],
) -> Iterator[Callable[..., BrowserContext]]:
    """Make a browser context on the live server: ``permission`` grants notifications,
    ``stub`` installs the push-service double; other keywords go to Playwright.

    No context may see a Content-Security-Policy violation: checked when the test ends.
    """
    made: list[BrowserContext] = []

    def collect(message: ConsoleMessage) -> None:
        if is_csp_violation(message.text):
            csp_violations.append(f"{message.page.url if message.page else ''}: {message.text}")

    def make(*, permission: bool = True, stub: bool = True, **options: Any) -> BrowserContext:
        options.setdefault("viewport", DESKTOP)
        context = browser.new_context(base_url=server.url, **options)
        context.set_default_timeout(10_000)
        if permission:
            context.grant_permissions(["notifications"], origin=server.url)
        context.add_init_script(REPORT_CSP_VIOLATIONS)
        context.on("console", collect)
        if stub:
            context.add_init_script(push_stub_script(browser_subscription))
        made.append(context)
        return context

    yield make
    for context in made:
        context.close()
    assert csp_violations == [], "Content-Security-Policy violations"


@pytest.fixture
def context(new_context: Callable[..., BrowserContext]) -> BrowserContext:
    return new_context()


@pytest.fixture
def page(context: BrowserContext) -> Page:
    return context.new_page()


def stub_log(page: Page) -> list[dict[str, Any]]:
    return page.evaluate("JSON.parse(localStorage.getItem('__pushStub.log') || '[]')")


def calls(page: Page, name: str) -> list[dict[str, Any]]:
    return [entry for entry in stub_log(page) if entry["call"] == name]


def active_element_id(page: Page) -> str:
    return page.evaluate("document.activeElement ? document.activeElement.id : ''")


def subscribe_through_page(page: Page, topics: tuple[str, ...] = ()) -> None:
    """The person's way in: open the page, tick topics, press the button, see success."""
    page.goto("/")
    for slug in topics:
        page.check(f"#topic-{slug}")
    page.click("#subscribe-button")
    page.wait_for_selector("#state-success:not([hidden])")


def subscribe_through_api(context: BrowserContext, subscription: BrowserSubscription) -> None:
    """A subscribed browser without the page: the cookies land in the context."""
    response = context.request.post(
        "/api/push/subscribe", data={"subscription": subscription.to_json()}
    )
    assert response.status == 201, response.text()


# The development server's threads can drop a static file's response unread when the
# browser abandons a request (a cached icon, a page left mid-load); Python then reports
# the file closed by the garbage collector, in whichever test is running. That is the
# test server's behaviour, not the portal's, and only that one report is let through.
_STATIC_FILE_COLLECTED = pytest.mark.filterwarnings(
    r"ignore:Exception ignored in. <_io.FileIO name='[^']*/static/"
    ":pytest.PytestUnraisableExceptionWarning"
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(_STATIC_FILE_COLLECTED)
