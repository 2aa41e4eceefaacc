"""A topic retired by another process while the preference centre is open: the save
records nothing for it, says so, and the next page no longer offers it."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from portal.consent import catalogue
from portal.db import create_engine
from tests.browser.conftest import DESKTOP, PHONE, SCREENSHOTS, LiveServer, subscribe_through_api
from tests.browser.test_accessibility import axe_results
from tests.browser.test_preference_centre import preferences, submit

pytestmark = pytest.mark.browser

SHOTS = SCREENSHOTS / "catalogue"


def retire_behind_the_page(server: LiveServer, slug: str) -> None:
    """The retire as another process makes it: a connection of its own, so this process's
    copy of the catalogue hears nothing of it (no session of ours commits it)."""
    engine = create_engine(
        server.app.extensions["portal.db"].engine.url.render_as_string(hide_password=False),
        poolclass=sa.pool.NullPool,
    )
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE topic SET retired_at = CURRENT_TIMESTAMP WHERE slug = :s"),
                {"s": slug},
            )
    finally:
        engine.dispose()


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=lambda v: str(v["width"]))
def test_a_topic_retired_elsewhere_is_not_saved_and_the_page_says_so(
    new_context, server: LiveServer, browser_subscription, monkeypatch, viewport
):
    # However long the page stays open, the process's copy is the one read before.
    monkeypatch.setattr(catalogue, "CATALOGUE_TTL_SECONDS", 3600.0)
    context = new_context(viewport=viewport)
    subscribe_through_api(context, browser_subscription)
    page = context.new_page()
    page.goto("/preferences")
    page.check("#topic-offers")
    page.check("#topic-weekly-digest")
    retire_behind_the_page(server, "offers")

    submit(page, lambda: page.click("text=Save my choices"))
    banner = page.inner_text(".banner--success")
    assert "Your choices are saved." in banner
    assert "Offers and discounts is no longer offered, so nothing was saved for it." in banner
    assert preferences(server) == {"weekly-digest": "opt_in"}
    assert (
        server.scalar(
            "SELECT count(*) FROM consent_event e JOIN topic t ON t.id = e.topic_id"
            " WHERE t.slug = 'offers'"
        )
        == 0
    )
    # The page after the save shows the catalogue as it is now.
    assert page.locator("#topic-offers").count() == 0
    assert page.is_checked("#topic-weekly-digest")
    results = axe_results(page)
    assert results.violations_count == 0, results.generate_report()
    if SHOTS.parent.is_dir():
        SHOTS.mkdir(exist_ok=True)
        page.screenshot(path=SHOTS / f"centre-retired-elsewhere-{viewport['width']}.png")
