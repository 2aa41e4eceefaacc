"""The staff console's consent log page at 1280 and 390 px: the log key as the API serves
it and the latest signed tree head; axe-core finds nothing, nothing scrolls sideways."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import expect

from portal.consent.jobs import sequence_once
from tests.browser.conftest import DESKTOP, PHONE, SCREENSHOTS, LiveServer, subscribe_through_api
from tests.browser.test_accessibility import TARGETS, _staff, axe_results, page_overflow
from tests.factories import SubscriptionFactory

pytestmark = pytest.mark.browser

SHOTS = SCREENSHOTS / "merkle"
WIDTHS = pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=lambda v: f"{v['width']}px")


def _sized(new_context: Callable[..., Any], viewport: dict[str, int]) -> Callable[..., Any]:
    def make(**options: Any) -> Any:
        options["viewport"] = viewport
        return new_context(**options)

    return make


@WIDTHS
def test_the_console_shows_the_log_key_the_api_serves_and_the_latest_head(
    viewport, new_context, server: LiveServer
):
    subscribe_through_api(_sized(new_context, viewport)(), SubscriptionFactory()())
    with server.app.app_context():
        sequence_once(server.app)
    officer = _staff(_sized(new_context, viewport), server, roles=("compliance",))
    key = officer.request.get(f"{server.url}/api/consent-log/key").json()["key"]
    head = officer.request.get(f"{server.url}/api/consent-log/tree-head").json()
    officer.goto("/staff/compliance/consent-log")
    main = officer.locator("main")
    expect(main).to_contain_text(f"Public key (base64){key}")
    expect(main).to_contain_text(f"Events in the tree{head['tree_size']}")
    expect(main).to_contain_text(head["sha256_root_hash"])
    results = axe_results(officer)
    assert results.violations_count == 0, results.generate_report()
    found = page_overflow(officer)
    assert found["scroll"] <= 0 and not found["wide"], found
    assert officer.evaluate(TARGETS) == []
    SHOTS.mkdir(parents=True, exist_ok=True)
    officer.screenshot(path=SHOTS / f"consent-log-{viewport['width']}.png", full_page=True)
