"""The campaign page in the two states the usability study got wrong, at 1280 and 390 px.

A campaign whose deliveries all failed is named a failure (red "Failed", "Finished: 0 of
19 delivered, 19 failed", the reasons), not a green "Completed" with a full bar; one whose
deliveries are being retried says so, and when, and its page (the headline, the counts,
the outcome by push service) follows the deliveries as they change, without a reload.
axe-core finds nothing in either state at either width, and nothing scrolls sideways.
"""

from __future__ import annotations

import datetime as dt
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import Page, Route, expect

from portal.campaigns import services
from portal.campaigns.models import Campaign
from portal.db import db
from portal.delivery.models import Delivery
from portal.seams import current_portal
from tests.browser.conftest import DESKTOP, PHONE, SCREENSHOTS, LiveServer
from tests.browser.test_accessibility import TARGETS, _staff, axe_results, page_overflow
from tests.campaigns.test_readings import costly_readings

pytestmark = pytest.mark.browser

SHOTS = SCREENSHOTS / "outcome"
WIDTHS = pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=lambda v: f"{v['width']}px")


def _campaign(server: LiveServer, **deliveries: Any) -> uuid.UUID:
    """A campaign of 19 deliveries with ``deliveries``' columns, in the state given by
    ``status``; sent 20 seconds ago."""
    app = server.app
    now = current_portal(app).clock.now()
    status = deliveries.pop("campaign_status")
    rows = deliveries.pop("rows")
    with db.begin(app) as session:
        draft = services.CampaignDraft(
            topic="security-alerts", title="New sign-in", body="A new device signed in."
        )
        campaign = services.create_campaign(
            session, draft, created_by="staff", now=now - dt.timedelta(seconds=20)
        )
        campaign.status = status
        campaign.materialised_at = now - dt.timedelta(seconds=19)
        if status == "completed":
            campaign.finished_at = now
        for columns in rows:
            session.add(
                Delivery(
                    campaign_id=campaign.id,
                    subscription_id=uuid.uuid4(),
                    push_service="fcm",
                    consent_reason="transactional_grant",
                    updated_at=now - dt.timedelta(seconds=10),
                    **columns,
                )
            )
        return campaign.id


def _open(
    new_context: Callable[..., Any], server: LiveServer, viewport: dict[str, int], path: str
) -> Page:
    def sized(**options: Any) -> Any:
        options["viewport"] = viewport
        return new_context(**options)

    page = _staff(sized, server, roles=("campaigns",))
    page.goto(path)
    page.wait_for_load_state("load")
    return page


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


def failed_campaign(server: LiveServer) -> uuid.UUID:
    """Finished: 15 deliveries gave up after 5 attempts with no answer, 4 had an invalid
    endpoint (test_accessibility.py checks this state too)."""
    now = current_portal(server.app).clock.now()
    gave_up = {"status": "failed", "reason": "max_attempts", "attempts": 5}
    rows = [{**gave_up, "next_attempt_at": now}] * 15 + [
        {"status": "failed", "reason": "invalid_endpoint", "attempts": 1, "next_attempt_at": now}
    ] * 4
    return _campaign(server, campaign_status="completed", rows=rows)


RETRY_IN = dt.timedelta(minutes=10)


def retrying_campaign(server: LiveServer) -> uuid.UUID:
    """Sending: all 19 deliveries answered 503 twice and wait for their third attempt."""
    retry_at = current_portal(server.app).clock.now() + RETRY_IN
    rows = [
        {
            "status": "queued",
            "reason": "server_error",
            "last_status_code": 503,
            "attempts": 2,
            "next_attempt_at": retry_at,
        }
    ] * 19
    return _campaign(server, campaign_status="sending", rows=rows)


@WIDTHS
def test_a_campaign_whose_deliveries_all_failed_is_named_a_failure(viewport, new_context, server):
    campaign_id = failed_campaign(server)
    page = _open(new_context, server, viewport, f"/staff/campaigns/{campaign_id}")

    tag = page.locator("#campaign-status")
    expect(tag).to_have_text("Failed")
    expect(tag).to_have_class("tag tag--error")
    expect(page.locator("#progress-summary")).to_have_text(
        "Finished: 0 of 19 delivered, 19 failed."
    )
    assert page.locator("#progress-bar").count() == 0  # no full bar for a failure
    reasons = page.locator("#failures tbody tr")
    expect(reasons).to_have_count(2)
    expect(reasons.nth(0)).to_contain_text(
        "Gave up after 5 attempts: the last was no answer (network error or time-out)15"
    )
    expect(reasons.nth(1)).to_contain_text(
        "Invalid endpoint: the stored address is no push endpoint4"
    )
    expect(page.locator("#circuits")).to_have_text(
        "fcm: 15 deliveries needed more than one attempt"
    )
    page_text = page.locator("main").inner_text()
    assert "Completed" not in page_text
    assert "every push service is taking messages" not in page_text
    expect(page.locator(".outcome__table")).to_contain_text("Failed: gave up, no answer")
    # The list agrees with the page.
    page.goto("/staff/campaigns")
    expect(page.locator(".campaigns .tag")).to_have_text("Failed")
    box = page.locator(".campaigns .tag").bounding_box()
    assert box is not None and box["height"] < 40, box  # one line: no word broken in two
    expect(page.locator(".campaigns")).to_contain_text("Finished: 0 of 19 delivered, 19 failed.")
    _checked(page, "list-finished-all-failed", viewport)
    page.goto(f"/staff/campaigns/{campaign_id}")
    _checked(page, "finished-all-failed", viewport)


def said(page: Page) -> str:
    """The page's words, its reading times left out."""
    return re.sub(r"\b\d\d:\d\d:\d\d UTC\b", "(time)", page.locator("main").inner_text())


def cancelling_campaign(server: LiveServer) -> uuid.UUID:
    """Sending: 12 delivered, 4 waiting for their turn, 3 for a retry after a 503."""
    now = current_portal(server.app).clock.now()
    rows = (
        [{"status": "accepted", "last_status_code": 201, "attempts": 1, "next_attempt_at": now}]
        * 12
        + [{"status": "queued", "attempts": 0, "next_attempt_at": now}] * 4
        + [
            {
                "status": "queued",
                "reason": "server_error",
                "last_status_code": 503,
                "attempts": 1,
                "next_attempt_at": now + RETRY_IN,
            }
        ]
        * 3
    )
    return _campaign(server, campaign_status="sending", rows=rows)


@WIDTHS
def test_a_cancelled_campaign_says_skipped_before_and_after_its_queue_is_marked(
    viewport, new_context, server
):
    """Cancelled from its page, the campaign is counted as it will stay at once: the
    dispatcher marks what it left queued later (portal/campaigns/unsent.py), and the
    page and the list read the same before that and after."""
    from portal.delivery.engine import Dispatcher

    campaign_id = cancelling_campaign(server)
    url = f"/staff/campaigns/{campaign_id}"
    page = _open(new_context, server, viewport, url)
    page.check("#confirm")
    page.click("text=Cancel campaign")
    expect(page.locator("#campaign-status")).to_have_text("Cancelled")
    headline = "Cancelled: 12 of 19 delivered, 7 skipped."
    expect(page.locator("#progress-summary")).to_have_text(headline)
    expect(page.locator("#failures tbody tr")).to_have_text(
        [
            "Not sent: the campaign was cancelled first4",
            "Not sent again: the campaign was cancelled before its next attempt (the last "
            "answer was 503 Service Unavailable)3",
        ]
    )
    # Answered "try again later" once and then cancelled: not "no push service was
    # slowed down and every delivery took one attempt", as the page had said.
    expect(page.locator("#circuits")).to_have_text(
        "fcm: 3 deliveries answered 503 Service Unavailable (try again later) and not tried again"
    )
    outcome = page.locator(".outcome__table").inner_text()
    assert "Queued" not in outcome and "queued" not in outcome, outcome
    with server.session() as session:
        left = session.scalar(
            sa.select(sa.func.count()).where(
                Delivery.campaign_id == campaign_id, Delivery.status == "queued"
            )
        )
    assert left == 7  # not marked yet: the pages count them as they will be
    _checked(page, "cancelled-queue-left", viewport)
    # What the page says, but the banner the cancel left (shown once) and the time its
    # figures were read ("… as of 20:12:25 UTC").
    before = said(page).removeprefix("Campaign cancelled.").strip()
    page.goto("/staff/campaigns")
    expect(page.locator(".campaigns")).to_contain_text(headline)
    listed = page.locator(".campaigns").inner_text()

    assert Dispatcher(server.app, transport=None).skip_unsent() == 7  # type: ignore[arg-type]
    page.reload()
    assert page.locator(".campaigns").inner_text() == listed
    page.goto(url)
    expect(page.locator("#progress-summary")).to_have_text(headline)
    assert said(page).strip() == before
    _checked(page, "cancelled-queue-marked", viewport)


@WIDTHS
def test_a_campaign_being_retried_says_so_and_follows_its_deliveries(viewport, new_context, server):
    campaign_id = retrying_campaign(server)
    with server.session() as session:
        (retry_at,) = session.scalars(sa.select(Delivery.next_attempt_at).distinct()).all()
    page = _open(new_context, server, viewport, f"/staff/campaigns/{campaign_id}")

    expect(page.locator("#campaign-status")).to_have_text("Sending")
    expect(page.locator("#progress-summary")).to_have_text("Sending: 0 of 19 done; 19 to go.")
    expect(page.locator("#progress-activity")).to_have_text(
        "Retrying 19 deliveries (19 after 503 Service Unavailable); next attempt at "
        f"{retry_at:%H:%M:%S} UTC, attempt 3 of at most 5."
    )
    expect(page.locator("#circuits")).to_have_text(
        "fcm: 19 deliveries needed more than one attempt, 19 waiting for the next"
    )
    expect(page.locator(".outcome__table")).to_contain_text("503 Service Unavailable")
    _checked(page, "sending-with-retries", viewport)

    # Ten are accepted at their next attempt: the page follows, outcome included.
    with server.session() as session, session.begin():
        ids = session.scalars(
            sa.select(Delivery.id).where(Delivery.campaign_id == campaign_id).limit(10)
        ).all()
        session.execute(
            sa.update(Delivery)
            .where(Delivery.id.in_(ids))
            .values(
                status="accepted",
                reason=None,
                last_status_code=201,
                attempts=3,
                updated_at=current_portal(server.app).clock.now(),
            )
        )
    summary = page.locator("#progress-summary")
    expect(summary).to_have_text("Sending: 10 of 19 done — 10 delivered; 9 to go.", timeout=12_000)
    expect(page.locator(".outcome__table")).to_contain_text("201 Created")
    expect(page.locator("#progress-activity")).to_contain_text("Retrying 9 deliveries")
    expect(page.locator("#progress-bar")).to_have_attribute("value", "10")

    # The other nine give up: the campaign ends, and the page says how, in red.
    with server.session() as session, session.begin():
        session.execute(
            sa.update(Delivery)
            .where(Delivery.campaign_id == campaign_id, Delivery.status == "queued")
            .values(status="failed", reason="max_attempts", attempts=5)
        )
        session.execute(
            sa.update(Campaign)
            .where(Campaign.id == campaign_id)
            .values(status="completed", finished_at=current_portal(server.app).clock.now())
        )
    expect(summary).to_have_text("Finished: 10 of 19 delivered, 9 failed.", timeout=12_000)
    expect(page.locator("#campaign-status")).to_have_text("Partly delivered")
    expect(page.locator("#campaign-status")).to_have_class("tag tag--warning")
    expect(page.locator("#failures")).to_contain_text(
        "Gave up after 5 attempts: the last was 503 Service Unavailable"
    )
    expect(page.locator("section.controls")).to_be_hidden()
    expect(page.locator("#progress-updated")).to_contain_text("Finished: no more updates.")
    _checked(page, "sending-then-partly-delivered", viewport)


def test_the_page_asks_again_when_the_answer_says_and_never_while_it_waits(new_context, server):
    """The script asks for the progress once an answer is in, after the wait the answer
    gave (``refreshAfter``: a campaign of millions answers the same costly reading for a
    while), and never asks twice at once: an answer that takes longer than the wait does
    not have a second question asked beside it. The page's timers run on Playwright's
    clock, moved by hand."""
    campaign_id = retrying_campaign(server)
    page = _staff(new_context, server, roles=("campaigns",))
    asked: list[Route] = []
    # Held until the test answers. (A lambda: Playwright cannot wrap a built-in method.)
    page.route("**/progress.json", lambda route: asked.append(route))  # noqa: PLW0108
    page.clock.install()
    page.goto(f"/staff/campaigns/{campaign_id}")
    page.wait_for_load_state("load")

    def questions_after(milliseconds: int) -> int:
        page.clock.run_for(milliseconds)
        page.wait_for_timeout(200)  # the browser's own work, on the real clock
        return len(asked)

    assert questions_after(4_000) == 0
    assert questions_after(1_500) == 1  # the first, 5 s after the page opened
    assert questions_after(60_000) == 1  # unanswered: nothing asked beside it
    real = asked[0].fetch()
    assert real.status == 200
    asked[0].fulfill(response=real, json={**real.json(), "refreshAfter": 30})
    expect(page.locator("#progress-updated")).to_contain_text("Next update in 30 seconds.")
    assert questions_after(29_000) == 1
    assert questions_after(1_500) == 2  # 30 s after the answer
    asked[1].fulfill(response=(second := asked[1].fetch()), json=second.json())
    expect(page.locator("#progress-updated")).to_contain_text("Next update in 5 seconds.")
    assert questions_after(5_500) == 3
    # Paused and resumed while the third is awaited: resuming asks nothing beside it.
    pause = page.locator("#progress-pause")
    pause.click()
    expect(pause).to_have_text("Resume updates")
    pause.click()
    expect(pause).to_have_text("Pause updates")
    assert questions_after(0) == 3
    asked[2].fulfill(response=(third := asked[2].fetch()), json=third.json())
    expect(page.locator("#progress-updated")).to_contain_text("Next update in 5 seconds.")
    assert questions_after(5_500) == 4


@WIDTHS
def test_a_page_opened_on_a_kept_reading_says_when_newer_numbers_come_and_asks_then(
    viewport, new_context, server, monkeypatch
):
    """A campaign that takes 3 s to count (a monotonic clock moved by each reading): its
    page is rendered from a reading kept for 30 s, says so, and its script's first
    question waits those 30 s instead of asking for the same numbers after 5."""
    monotonic, _ = costly_readings(monkeypatch, 3.0)
    campaign_id = retrying_campaign(server)
    page = _staff(lambda **o: new_context(**o, viewport=viewport), server, roles=("campaigns",))
    asked: list[Route] = []
    page.route("**/progress.json", lambda route: asked.append(route))  # noqa: PLW0108
    page.clock.install()
    page.goto(f"/staff/campaigns/{campaign_id}")
    loaded = time.monotonic()
    page.wait_for_load_state("load")
    expect(page.locator("#progress-updated")).to_contain_text(
        "This campaign takes a while to count: newer numbers in 30 seconds."
    )

    def questions_after(milliseconds: int) -> int:
        page.clock.run_for(milliseconds)
        page.wait_for_timeout(200)  # the browser's own work, on the real clock
        return len(asked)

    # The installed clock also runs on with the real one: the time since the page loaded
    # counts toward its 30 s (axe-core and a screenshot, first, took over 2 s on CI).
    waited = int((time.monotonic() - loaded) * 1000)
    assert questions_after(28_000 - waited) == 0
    _checked(page, "sending-kept-reading", viewport)  # the question may go meanwhile
    assert questions_after(3_000) == 1
    monotonic.now += 30.0
    answer = asked[0].fetch()
    asked[0].fulfill(response=answer)
    expect(page.locator("#progress-updated")).to_contain_text("Next update in 30 seconds.")
