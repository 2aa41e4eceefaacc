"""A campaign scheduled in a time zone, at 1280 and 390 px: the zone is chosen by typing
part of it, and the campaign page and the list show the send time in that zone, with its
offset then, and in UTC; an alias (US/Eastern) is refused with the canonical name and
nothing is made. Without JavaScript the field keeps its list of canonical zones and works.
axe-core finds nothing in any of these states, and nothing scrolls sideways.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from portal.campaigns import services as campaigns
from portal.campaigns.services import CampaignDraft
from portal.delivery.models import Delivery
from tests.browser.conftest import DESKTOP, PHONE, SCREENSHOTS, LiveServer
from tests.browser.test_accessibility import TARGETS, _staff, axe_results, page_overflow
from tests.factories import SubscriptionFactory

pytestmark = pytest.mark.browser

SHOTS = SCREENSHOTS / "zones"
WIDTHS = pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=lambda v: f"{v['width']}px")
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def send_day() -> dt.date:
    """8 December next year: Paris is on UTC+01:00 all December, whatever the year."""
    return dt.date(dt.datetime.now(dt.UTC).year + 1, 12, 8)


def paris_text(day: dt.date) -> str:
    return f"{_DAYS[day.weekday()]} 8 Dec {day.year}, 09:00 Europe/Paris (UTC+01:00) — 08:00 UTC"


def _open(new_context: Callable[..., Any], server: LiveServer, viewport: dict[str, int]) -> Page:
    def sized(**options: Any) -> Any:
        options["viewport"] = viewport
        return new_context(**options)

    page = _staff(sized, server, roles=("campaigns",))
    page.goto("/staff/campaigns/new")
    page.wait_for_load_state("load")
    return page


def _checked(page: Page, name: str, viewport: dict[str, int], part: str | None = None) -> None:
    """axe-core finds nothing, nothing scrolls sideways, targets are large enough; a
    full-page screenshot kept, and one of ``part`` of the page to read at full size."""
    results = axe_results(page)
    assert results.violations_count == 0, results.generate_report()
    found = page_overflow(page)
    assert found["scroll"] <= 0 and not found["wide"], found
    assert page.evaluate(TARGETS) == []  # every control at least 24 × 24 px
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SHOTS / f"{name}-{viewport['width']}.png", full_page=True)
    if part:
        page.locator(part).screenshot(path=SHOTS / f"{name}-{viewport['width']}-part.png")


def fill_campaign(page: Page, when: str) -> None:
    page.select_option("#topic", "weekly-digest")
    page.fill("#title", "Winter sale")
    page.fill("#body", "Starts at nine, Paris time.")
    page.check("#schedule-later")
    page.fill("#send_at", when)


def type_zone(page: Page, typed: str) -> None:
    zone = page.locator("#timezone")
    zone.fill("")
    zone.press_sequentially(typed)


@WIDTHS
def test_a_zone_chosen_by_typing_shows_on_the_campaign_page_and_list(viewport, new_context, server):
    day = send_day()
    page = _open(new_context, server, viewport)
    fill_campaign(page, f"{day.isoformat()}T09:00")

    type_zone(page, "paris")
    zone = page.locator("#timezone")
    options = page.locator("#timezone-listbox [role=option]")
    expect(zone).to_have_attribute("aria-expanded", "true")
    expect(options).to_have_count(1)
    expect(options.first).to_contain_text("Europe/Paris")
    expect(options.first).to_contain_text("France")
    zone.press("ArrowDown")
    expect(options.first).to_have_attribute("aria-selected", "true")
    _checked(page, "form-zone-matches", viewport, part=".form-group:has(#timezone)")
    zone.press("Enter")  # chooses; does not submit
    expect(zone).to_have_value("Europe/Paris")
    expect(zone).to_have_attribute("aria-expanded", "false")
    assert page.url.endswith("/staff/campaigns/new")

    # Typing a country finds its zones too, and a click chooses.
    type_zone(page, "netherlands")
    expect(options.first).to_contain_text("Europe/Brussels")
    type_zone(page, "paris")
    options.first.click()
    expect(zone).to_have_value("Europe/Paris")

    page.click("button[value=review]")
    expected = paris_text(day)
    expect(page.locator("main")).to_contain_text(expected)
    page.click("button[value=launch]")
    page.wait_for_selector(".banner")
    expect(page.locator(".banner")).to_contain_text(f"Campaign launched: it sends on {expected}.")

    sends = page.locator("#campaign-sends time")
    expect(sends).to_have_text(expected)
    expect(sends).to_have_attribute("datetime", f"{day.isoformat()}T08:00:00Z")
    _checked(page, "campaign-scheduled-in-paris", viewport, part=".summary-list >> nth=0")

    page.goto("/staff/campaigns")
    listed = page.locator(".campaign-sends time").first
    expect(listed).to_have_text(expected)
    expect(listed).to_have_attribute("datetime", f"{day.isoformat()}T08:00:00Z")
    _checked(page, "list-scheduled-in-paris", viewport, part="main")

    assert server.scalar("SELECT time_zone FROM campaign") == "Europe/Paris"


ALIAS_ERROR = (
    "US/Eastern is an alias: choose America/New_York instead (US/Eastern → America/New_York)"
)


@WIDTHS
def test_an_alias_is_refused_with_the_canonical_name_and_nothing_is_made(
    viewport, new_context, server
):
    page = _open(new_context, server, viewport)
    fill_campaign(page, f"{send_day().isoformat()}T09:00")
    type_zone(page, "US/Eastern")
    # No canonical zone is called that, so none is offered.
    expect(page.locator("#timezone")).to_have_attribute("aria-expanded", "false")
    with page.expect_response("**/staff/campaigns/new") as answered:
        page.click("button[value=review]")
    assert answered.value.status == 422
    summary = page.locator(".error-summary")
    expect(summary).to_be_focused()
    expect(summary.locator("a[href='#timezone']")).to_have_text(ALIAS_ERROR)
    expect(page.locator("#timezone-error")).to_contain_text(ALIAS_ERROR)
    expect(page.locator("#timezone")).to_have_value("US/Eastern")
    expect(page.locator("#timezone")).to_have_attribute("aria-invalid", "true")
    _checked(page, "form-zone-alias-error", viewport, part=".error-summary")
    assert server.scalar("SELECT count(*) FROM campaign") == 0

    # The summary's link leads to the field; the canonical zone put in, it goes through.
    summary.locator("a[href='#timezone']").click()
    expect(page.locator("#timezone")).to_be_focused()
    type_zone(page, "new york")
    page.locator("#timezone-listbox [role=option]").first.click()
    expect(page.locator("#timezone")).to_have_value("America/New_York")
    page.click("button[value=review]")
    expect(page.locator("main")).to_contain_text("America/New_York (UTC-05:00) — 14:00 UTC")


def test_without_javascript_the_field_lists_the_canonical_zones_and_works(new_context, server):
    page = _staff(lambda **o: new_context(java_script_enabled=False, **o), server)
    page.goto("/staff/campaigns/new")
    zone = page.locator("#timezone")
    expect(zone).to_have_attribute("list", "timezone-zones")  # the browser's own suggestions
    values = page.locator("#timezone-zones option").evaluate_all(
        "options => options.map(o => o.value)"
    )
    assert values[0] == "UTC" and "Europe/Paris" in values and len(values) > 300
    assert not {"US/Eastern", "GB", "Etc/GMT+5", "Europe/Amsterdam"} & set(values)
    day = send_day()
    fill_campaign(page, f"{day.isoformat()}T09:00")
    zone.fill("Europe/Paris")
    page.click("button[value=review]")
    page.click("button[value=launch]")
    page.wait_for_selector(".banner")
    expect(page.locator("#campaign-sends time")).to_have_text(paris_text(day))


def _subscribe(server: LiveServer, zone: str | None) -> None:
    """A person opted in to the weekly digest whose browser reported ``zone``."""
    body: dict[str, Any] = {
        "subscription": SubscriptionFactory()("fcm").to_json(),
        "topics": ["weekly-digest"],
        "policyVersion": "2026-01",
    }
    if zone is not None:
        body["timeZone"] = zone
    answer = server.app.test_client().post("/api/push/subscribe", json=body)
    assert answer.status_code == 201, answer.json


@WIDTHS
def test_a_local_time_campaign_shows_its_hours_before_launch_and_who_waits_after(
    viewport, new_context, server
):
    for zone in ("Asia/Tokyo", "America/New_York", None):
        _subscribe(server, zone)
    day = send_day()
    page = _open(new_context, server, viewport)
    fill_campaign(page, f"{day.isoformat()}T09:00")
    type_zone(page, "paris")
    page.locator("#timezone-listbox [role=option]").first.click()
    page.fill("#local_time", "09:00")
    # The fallback zone has the same picker as the campaign's zone.
    fallback = page.locator("#fallback_zone")
    fallback.press_sequentially("london")
    options = page.locator("#fallback_zone-listbox [role=option]")
    expect(options.first).to_contain_text("Europe/London")
    fallback.press("ArrowDown")
    fallback.press("Enter")
    expect(fallback).to_have_value("Europe/London")

    page.click("button[value=review]")
    hours = page.locator("table.per-hour tbody tr")
    # 08:00 UTC on the 8th: London's 09:00 an hour later, New York's at 14:00 UTC,
    # Tokyo's (passed that day) on the 9th at 00:00 UTC; each one person.
    expect(hours).to_have_count(3)
    assert hours.locator("time").evaluate_all("ts => ts.map(t => t.dateTime)") == [
        f"{day.isoformat()}T09:00:00Z",
        f"{day.isoformat()}T14:00:00Z",
        f"{(day + dt.timedelta(days=1)).isoformat()}T00:00:00Z",
    ]
    expect(hours.locator("td")).to_have_text(["1", "1", "1"])
    expect(page.locator("main")).to_contain_text(
        "1 of them has no known time zone (their browser did not say when they subscribed) "
        "and gets it at 09:00 in Europe/London."
    )
    _checked(page, "review-local-time", viewport, part="section:has(#hours-heading)")

    page.click("button[value=launch]")
    page.wait_for_selector(".banner")
    expect(page.locator("#campaign-local-time")).to_contain_text(
        "At 09:00 in each person's time zone (Europe/London for people whose zone is not known)"
    )
    _checked(page, "campaign-local-time", viewport, part=".summary-list >> nth=0")
    assert server.rows("SELECT local_time, fallback_zone FROM campaign")[0][1] == "Europe/London"


@WIDTHS
def test_an_unknown_fallback_zone_is_refused_in_the_error_summary(viewport, new_context, server):
    page = _open(new_context, server, viewport)
    fill_campaign(page, f"{send_day().isoformat()}T09:00")
    page.fill("#local_time", "09:00")
    page.locator("#fallback_zone").fill("Mars/Olympus")
    with page.expect_response("**/staff/campaigns/new") as answered:
        page.click("button[value=review]")
    assert answered.value.status == 422
    summary = page.locator(".error-summary")
    expect(summary).to_be_focused()
    link = summary.locator("a[href='#fallback_zone']")
    expect(link).to_contain_text("There is no time zone Mars/Olympus")
    expect(page.locator("#fallback_zone")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#local_time")).to_have_value("09:00")
    _checked(page, "form-fallback-zone-error", viewport, part=".error-summary")
    link.click()
    expect(page.locator("#fallback_zone")).to_be_focused()
    assert server.scalar("SELECT count(*) FROM campaign") == 0


@WIDTHS
def test_the_campaign_page_says_who_waits_for_their_hour_and_for_quiet_hours_to_end(
    viewport, new_context, server
):
    """A local-time campaign part sent: some deliveries wait for 09:00 where the person
    is, some for quiet hours to end; the page says both, apart from retries."""
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    with server.session() as session, session.begin():
        campaign = campaigns.create_campaign(
            session,
            CampaignDraft(
                topic="weekly-digest",
                title="Good morning",
                body="Today's digest",
                time_zone="Europe/Paris",
                local_time=dt.time(9),
                fallback_zone="Europe/Paris",
            ),
            created_by="officer@example.test",
            now=now,
        )
        campaign.status, campaign.materialised_at = "sending", now
        rows = [("accepted", None, now)] + [("queued", None, now + dt.timedelta(hours=5))] * 2
        rows += [("queued", "quiet_hours", now + dt.timedelta(hours=7))] * 3
        for status, reason, due in rows:
            session.add(
                Delivery(
                    campaign_id=campaign.id,
                    subscription_id=uuid.uuid4(),
                    push_service="fcm",
                    status=status,
                    attempts=1 if status == "accepted" else 0,
                    next_attempt_at=due,
                    reason=reason,
                    consent_reason="explicit_opt_in",
                    updated_at=now,
                )
            )
        campaign_id = campaign.id
    page = _open(new_context, server, viewport)
    page.goto(f"/staff/campaigns/{campaign_id}")
    main = page.locator("main")
    expect(main).to_contain_text("2 deliveries waiting for 09:00 in the person's time zone")
    expect(main).to_contain_text("3 deliveries waiting for quiet hours to end where the person is")
    expect(main).not_to_contain_text("Retrying")
    expect(page.locator("#campaign-local-time")).to_contain_text("At 09:00 in each person's")
    _checked(page, "campaign-waiting", viewport, part="main")
