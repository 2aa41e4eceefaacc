"""The Content-Security-Policy is enforced in the browser, and its violations are seen.

Every browser test fails on a violation (``new_context`` checks when the test ends);
this shows that the check is not blind: an inline script and an inline style are refused
and reported.
"""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import Page

pytestmark = pytest.mark.browser


def _wait_for(page: Page, violations: list[str], count: int) -> None:
    # Console events arrive while Playwright waits, not while Python sleeps.
    deadline = time.monotonic() + 5
    while len(violations) < count and time.monotonic() < deadline:
        page.wait_for_timeout(50)


def test_inline_script_and_style_are_refused_and_reported(page: Page, csp_violations):
    page.goto("/")
    page.wait_for_load_state("load")
    assert csp_violations == []
    ran = page.evaluate(
        """() => {
          window.__inlineRan = false;
          const script = document.createElement('script');
          script.textContent = 'window.__inlineRan = true;';
          document.head.appendChild(script);
          document.body.setAttribute('style', 'background-color: rgb(255, 0, 0)');
          return window.__inlineRan;
        }"""
    )
    _wait_for(page, csp_violations, 2)
    assert ran is False
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") != "rgb(255, 0, 0)"
    assert any("script-src" in text for text in csp_violations), csp_violations
    assert any("style-src" in text for text in csp_violations), csp_violations
    csp_violations.clear()  # seen on purpose: the fixture's own check must not fail


def test_the_page_cannot_be_framed(page: Page, server, csp_violations):
    response = page.goto("/")
    assert response is not None
    headers = response.headers
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY"
