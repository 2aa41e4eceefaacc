"""Screenshots of the subscribe page and the preference centre, for people to look at.

Written to artifacts/screenshots/ (git-ignored): each page at desktop width (1280) and at
390 px, in its success and error states. The test checks only that the page does not
scroll sideways; the pictures are for eyes.
"""

from __future__ import annotations

import pytest

from tests.browser.conftest import DESKTOP, PHONE, SCREENSHOTS
from tests.browser.test_accessibility import PAGES, styled

pytestmark = pytest.mark.browser

SHOTS = {
    "subscribe": "subscribe",
    "subscribe-success": "subscribe-success",
    "subscribe-denied": "subscribe-error",
    "subscribe-network-failure": "subscribe-network-error",
    "subscribe-already-subscribed": "subscribe-subscribed",
    "preferences": "preferences",
    "preferences-saved": "preferences-success",
    "preferences-stale-policy": "preferences-error",
    "preferences-receipts-limited": "preferences-receipt-limited",
    "preferences-one-a-day": "preferences-how-often-success",
    "preferences-how-often-refused": "preferences-how-often-error",
    "preferences-quiet-hours-saved": "preferences-quiet-hours-success",
    "preferences-quiet-hours-refused": "preferences-quiet-hours-error",
    "account-link-confirm": "account-link",
}
STATES = {state.name: state for state in PAGES}


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=lambda v: str(v["width"]))
@pytest.mark.parametrize("state", list(SHOTS))
def test_screenshot(state, viewport, new_context, server):
    def sized(**options):
        options["viewport"] = viewport
        return new_context(**options)

    page = styled(STATES[state].reach(sized, server))
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / f"{SHOTS[state]}-{viewport['width']}.png", full_page=True)
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"{state} scrolls sideways by {overflow}px at {viewport['width']}"


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=lambda v: str(v["width"]))
def test_screenshot_without_javascript(viewport, new_context):
    page = new_context(viewport=viewport, java_script_enabled=False, stub=False).new_page()
    page.goto("/")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(
        path=SCREENSHOTS / f"subscribe-no-javascript-{viewport['width']}.png", full_page=True
    )
