"""The delivery funnel on the campaign page, at 1280 and 390 px: the counts, their shares
and both click-through rates; the chart over time, its line names and time labels apart
from one another, and its table; "no receipts yet" before any browser reports, and the
figures following the receipts while the campaign sends. axe-core finds nothing in either
state at either width, and nothing scrolls sideways (test_accessibility.py walks both
states at 320 and 390 px too)."""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import Page, expect

from portal.db import db
from portal.delivery.models import Delivery, DeliveryReceipt
from portal.seams import current_portal
from tests.browser.conftest import DESKTOP, PHONE, SCREENSHOTS, LiveServer
from tests.browser.test_accessibility import TARGETS, axe_results, page_overflow
from tests.browser.test_campaign_outcome import _open
from tests.factories import FunnelFactory

pytestmark = pytest.mark.browser

SHOTS = SCREENSHOTS / "funnel"
WIDTHS = pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=lambda v: f"{v['width']}px")
S = dt.timedelta(seconds=1)


def seen_campaign(server: LiveServer) -> uuid.UUID:
    """Finished 30 minutes ago: 20 deliveries accepted, 8 shown, 2 of them clicked (one
    with no shown receipt), 1 failed (test_accessibility.py checks this state too)."""
    now = current_portal(server.app).clock.now().replace(second=0, microsecond=0)
    with db.begin(server.app) as session:  # sent on the minute: 21 one-minute periods
        factory = FunnelFactory(session, sent_at=now - dt.timedelta(minutes=30))
        factory.many(12, after=5 * S)
        factory.many(6, after=5 * S, shown=40 * S)
        factory.delivery(after=5 * S, shown=3 * 60 * S, clicked=8 * 60 * S)
        factory.delivery(after=6 * S, clicked=20 * 60 * S)
        factory.delivery("failed")
        return factory.campaign.id


def buttons_campaign(server: LiveServer) -> uuid.UUID:
    """Finished 30 minutes ago with two buttons: 10 accepted, 9 shown, 5 clicked — 2 on
    the notification, 3 on "Shop now", 1 on "Read later" (one delivery in two places)."""
    now = current_portal(server.app).clock.now().replace(second=0, microsecond=0)
    with db.begin(server.app) as session:
        factory = FunnelFactory(session, sent_at=now - dt.timedelta(minutes=30))
        factory.campaign.actions = [
            {"title": "Shop now", "url": "/shop"},
            {"title": "Read later", "url": "/later"},
        ]
        factory.many(4, after=5 * S, shown=40 * S)
        factory.delivery(after=5 * S, shown=50 * S, clicked=2 * 60 * S)
        factory.delivery(after=5 * S, shown=50 * S, clicked=2 * 60 * S, button_2=9 * 60 * S)
        factory.many(3, after=5 * S, shown=50 * S, button_1=5 * 60 * S)
        factory.delivery(after=5 * S)
        return factory.campaign.id


def unseen_campaign(server: LiveServer) -> uuid.UUID:
    """Sending: 5 deliveries accepted a few seconds ago, no browser has reported yet."""
    now = current_portal(server.app).clock.now()
    with db.begin(server.app) as session:
        factory = FunnelFactory(session, sent_at=now - 10 * S)
        factory.campaign.status = "sending"
        factory.campaign.finished_at = None
        factory.many(5, after=2 * S)
        factory.many(2, "queued")
        return factory.campaign.id


def _checked(page: Page, name: str, viewport: dict[str, int]) -> None:
    """axe-core finds nothing, nothing scrolls sideways, targets are large enough; a
    full-page screenshot kept."""
    results = axe_results(page)
    assert results.violations_count == 0, results.generate_report()
    found = page_overflow(page)
    assert found["scroll"] <= 0 and not found["wide"], found
    assert page.evaluate(TARGETS) == []  # every control at least 24 × 24 px
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SHOTS / f"{name}-{viewport['width']}.png", full_page=True)
    page.locator("#funnel").screenshot(path=SHOTS / f"{name}-section-{viewport['width']}.png")


BOXES = """(selector) => [...document.querySelectorAll(selector)].map(t => {
  const r = t.getBoundingClientRect();
  return {text: t.textContent, left: r.left, right: r.right, top: r.top, bottom: r.bottom};
})"""


def _apart(boxes: list[dict[str, Any]], across: bool) -> None:
    for a, b in itertools.pairwise(boxes):
        if across:
            assert b["left"] - a["right"] >= 2, boxes
        else:
            assert b["top"] - a["bottom"] >= 0, boxes


def _stages(page: Page) -> list[str]:
    return [
        " ".join(row.split()) for row in page.locator("#funnel-counts tbody tr").all_inner_texts()
    ]


@WIDTHS
def test_a_campaign_with_receipts_shows_its_funnel_and_chart(
    viewport: dict[str, int], new_context: Callable[..., Any], server: LiveServer
) -> None:
    campaign_id = seen_campaign(server)
    page = _open(new_context, server, viewport, f"/staff/campaigns/{campaign_id}")

    expect(page.locator("#funnel-heading")).to_have_text("Delivery funnel")
    assert page.locator("#funnel-empty").count() == 0
    assert _stages(page) == [
        "Accepted by a push service 20 100.0%",
        "Shown on screen 8 40.0%",
        "Clicked 2 10.0%",
    ]
    expect(page.locator("#funnel-ctr-shown")).to_have_text("25.0% (2 of 8 shown)")
    expect(page.locator("#funnel-ctr-accepted")).to_have_text("10.0% (2 of 20 accepted)")
    expect(page.locator("#funnel-notes")).to_contain_text(
        "“Shown” includes 1 delivery reported clicked whose display was never reported"
    )

    chart = page.locator("svg.funnel-chart")
    expect(chart).to_be_visible()
    expect(chart).to_have_attribute("role", "img")
    expect(page.locator("#funnel-desc")).to_contain_text("Running totals in 1-minute periods from")
    expect(page.locator("#funnel-desc")).to_contain_text(
        "by the end, 20 accepted, 8 shown and 2 clicked."
    )
    names = page.evaluate(BOXES, "svg.funnel-chart .funnel-chart__name")
    assert [n["text"] for n in names] == ["Accepted 20", "Shown 8", "Clicked 2"]
    _apart(names, across=False)
    times = page.evaluate(BOXES, "svg.funnel-chart .funnel-chart__time")
    assert len(times) >= 3
    _apart(times, across=True)
    box = chart.bounding_box()
    assert box is not None and box["x"] + box["width"] <= viewport["width"]
    # Text stays readable at a phone's width: the chart is not shrunk below its set size much.
    size = page.evaluate(
        "() => document.querySelector('.funnel-chart__name').getBoundingClientRect().height"
    )
    assert size >= 9, size

    # The same figures as a table, behind a disclosure.
    table = page.locator("#funnel-periods")
    expect(table).to_be_hidden()
    page.locator(".funnel summary").click()
    expect(table).to_be_visible()
    rows = table.locator("tbody tr")
    expect(rows).to_have_count(21)
    first = " ".join(rows.nth(0).inner_text().split())
    assert first.endswith(" 20 6 0"), first
    last = " ".join(rows.nth(20).inner_text().split())
    assert last.endswith(" 20 8 2"), last
    _checked(page, "funnel", viewport)
    # The narrowest phones: names and time labels still apart, text still legible.
    page.set_viewport_size({"width": 320, "height": 640})
    _apart(page.evaluate(BOXES, "svg.funnel-chart .funnel-chart__name"), across=False)
    _apart(page.evaluate(BOXES, "svg.funnel-chart .funnel-chart__time"), across=True)
    assert page_overflow(page)["scroll"] <= 0


@WIDTHS
def test_clicks_on_the_buttons_are_clicks_counted_by_where(
    viewport: dict[str, int], new_context: Callable[..., Any], server: LiveServer
) -> None:
    campaign_id = buttons_campaign(server)
    page = _open(new_context, server, viewport, f"/staff/campaigns/{campaign_id}")
    assert _stages(page) == [
        "Accepted by a push service 10 100.0%",
        "Shown on screen 9 90.0%",
        "Clicked 5 50.0%",
        "Clicked outside the buttons 2 20.0%",
        "Clicked on button 1, “Shop now” 3 30.0%",
        "Clicked on button 2, “Read later” 1 10.0%",
    ]
    expect(page.locator("#funnel-ctr-shown")).to_have_text("55.6% (5 of 9 shown)")
    expect(page.locator("#funnel-notes")).to_contain_text(
        "the rows by where it was clicked add up to 1 more"
    )
    names = page.evaluate(BOXES, "svg.funnel-chart .funnel-chart__name")
    assert [n["text"] for n in names] == ["Accepted 10", "Shown 9", "Clicked 5"]
    _checked(page, "funnel-buttons", viewport)


@WIDTHS
def test_before_any_receipt_it_says_so_then_follows_the_receipts(
    viewport: dict[str, int], new_context: Callable[..., Any], server: LiveServer
) -> None:
    campaign_id = unseen_campaign(server)
    page = _open(new_context, server, viewport, f"/staff/campaigns/{campaign_id}")

    expect(page.locator("#funnel-empty")).to_have_text(
        "No receipts yet: no browser has reported showing or clicking this notification."
    )
    assert _stages(page) == [
        "Accepted by a push service 5 100.0%",
        "Shown on screen 0 0.0%",
        "Clicked 0 0.0%",
    ]
    expect(page.locator("#funnel-ctr-shown")).to_have_text(
        "No rate yet: nothing has been reported shown."
    )
    expect(page.locator("#funnel-ctr-accepted")).to_have_text("0.0% (0 of 5 accepted)")
    expect(page.locator("svg.funnel-chart")).to_be_visible()
    _checked(page, "funnel-no-receipts", viewport)

    # Two browsers report showing it, one person clicks: the page follows, no reload.
    now = current_portal(server.app).clock.now()
    with server.session() as session, session.begin():
        ids = session.scalars(
            sa.select(Delivery.id)
            .where(Delivery.campaign_id == campaign_id, Delivery.status == "accepted")
            .order_by(Delivery.id)
            .limit(2)
        ).all()
        for delivery_id in ids:
            session.add(DeliveryReceipt(delivery_id=str(delivery_id), event="shown", at=now))
        session.add(DeliveryReceipt(delivery_id=str(ids[0]), event="clicked", at=now))
    expect(page.locator("#funnel-ctr-shown")).to_have_text("50.0% (1 of 2 shown)", timeout=12_000)
    assert page.locator("#funnel-empty").count() == 0
    assert _stages(page)[1:] == ["Shown on screen 2 40.0%", "Clicked 1 20.0%"]
