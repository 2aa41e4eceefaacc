"""The Chromium the browser tests drive: launched with Playwright's own switches intact,
and without the per-window address-bar popups (tests/browser/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser

from tests.browser.conftest import OMNIBOX_POPUPS, PLAYWRIGHT_DISABLED_FEATURES

pytestmark = pytest.mark.browser


def _browser_command_lines() -> list[list[str]]:
    """The command lines of the Chromium browser processes running now (not renderers)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue  # gone meanwhile
        if any(w == "--remote-debugging-pipe" for w in words) and not any(
            w.startswith("--type=") for w in words
        ):
            found.append(words)
    return found


def test_playwrights_disabled_features_are_all_still_disabled(browser: Browser) -> None:
    lines = _browser_command_lines()
    assert lines, "no Chromium browser process found"
    for words in lines:
        switches = [w for w in words if w.startswith("--disable-features=")]
        if len(switches) < 2:
            continue  # another Chromium (not launched by this conftest)
        playwrights, ours = (set(s.split("=", 1)[1].split(",")) for s in switches[-2:])
        # The last one is the one Chromium keeps: it must hold every one of Playwright's.
        assert playwrights <= ours, f"Playwright now also disables {playwrights - ours}"
        assert set(PLAYWRIGHT_DISABLED_FEATURES) <= ours
        assert set(OMNIBOX_POPUPS) <= ours
        return
    pytest.fail(f"no browser process with two --disable-features switches: {lines}")


def test_a_context_starts_no_address_bar_renderers(new_context: Any, browser: Browser) -> None:
    page = new_context().new_page()
    page.goto("/")
    session = browser.new_browser_cdp_session()
    targets = session.send("Target.getTargets")["targetInfos"]
    session.detach()
    assert [t["url"] for t in targets if "omnibox" in t["url"]] == []
    assert any(t["type"] == "page" for t in targets)
