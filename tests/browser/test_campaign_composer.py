"""The composer at 1280 and 390 px: a rich notification (image, buttons) previewed per
platform with each platform's cuts, saved as a draft, its edit page, a stale save refused,
and the list of drafts. axe-core finds nothing in any of these states, nothing scrolls
sideways, and every control is large enough.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import Page, expect

from portal.campaigns import media
from portal.delivery.models import Delivery, DeliveryReceipt
from tests.browser.conftest import DESKTOP, PHONE, SCREENSHOTS, LiveServer
from tests.browser.test_accessibility import TARGETS, _staff, axe_results, page_overflow
from tests.campaigns import test_picture_metadata as built

pytestmark = pytest.mark.browser

SHOTS = SCREENSHOTS / "composer"
WIDTHS = pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=lambda v: f"{v['width']}px")
LONG_TITLE = "Winter sale: everything in the shop is half price this week"  # 59 characters
LONG_BODY = (
    "From Monday to Sunday every coat, scarf and pair of boots is half price, in the shops "
    "and online, while stocks last. Members get free delivery too."
)


def sized(new_context: Callable[..., Any], viewport: dict[str, int] | None) -> Callable[..., Any]:
    def make(**options: Any) -> Any:
        if viewport:
            options["viewport"] = viewport
        return new_context(**options)

    return make


def fill_rich(page: Page) -> None:
    page.select_option("#topic", "weekly-digest")
    page.fill("#title", LONG_TITLE)
    page.fill("#body", LONG_BODY)
    page.fill("#url", "/news")
    page.fill("#icon", "/static/img/icon.svg")
    page.fill("#image", "/static/img/icon.svg")
    page.fill("#action1_title", "Shop the sale")
    page.fill("#action1_url", "/shop")
    page.fill("#action2_title", "Remind me tomorrow morning")
    page.fill("#action2_url", "/remind")


def rich_preview(viewport: dict[str, int] | None = None) -> Callable[..., Page]:
    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        page = _staff(sized(new_context, viewport), server, roles=("campaigns",))
        page.goto("/staff/campaigns/new")
        fill_rich(page)
        page.click("button[value=preview]")
        page.wait_for_selector("#platforms")
        return page

    return reach


def saved_draft(viewport: dict[str, int] | None = None) -> Callable[..., Page]:
    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        page = rich_preview(viewport)(new_context, server)
        page.click("button[value=save_draft]")
        page.wait_for_url("**/staff/campaigns/drafts/*")
        page.wait_for_selector("text=Draft saved", timeout=30_000)
        return page

    return reach


def stale_draft(viewport: dict[str, int] | None = None) -> Callable[..., Page]:
    """The draft's page after another tab saved it meanwhile: this save is refused."""

    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        page = saved_draft(viewport)(new_context, server)
        other = page.context.new_page()
        other.goto(page.url)
        other.fill("#title", "Changed in another tab")
        other.click("button[value=save_draft]")
        other.wait_for_selector("text=Draft saved", timeout=30_000)
        other.close()
        page.fill("#body", "My own change")
        page.click("button[value=save_draft]")
        page.wait_for_selector("text=Not saved", timeout=30_000)
        return page

    return reach


def drafts_listed(viewport: dict[str, int] | None = None) -> Callable[..., Page]:
    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        page = saved_draft(viewport)(new_context, server)
        page.goto("/staff/campaigns")
        page.wait_for_selector("table.drafts")
        return page

    return reach


def rich_review(viewport: dict[str, int] | None = None) -> Callable[..., Page]:
    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        page = rich_preview(viewport)(new_context, server)
        page.click("button[value=review]")
        page.wait_for_selector("text=Check your campaign")
        return page

    return reach


def _checked(page: Page, name: str, viewport: dict[str, int], part: str | None = None) -> None:
    results = axe_results(page)
    assert results.violations_count == 0, results.generate_report()
    found = page_overflow(page)
    assert found["scroll"] <= 0 and not found["wide"], found
    assert page.evaluate(TARGETS) == []
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SHOTS / f"{name}-{viewport['width']}.png", full_page=True)
    if part:
        page.locator(part).screenshot(path=SHOTS / f"{name}-{viewport['width']}-part.png")


# An image is drawn once the browser has decoded it, with a width: decode() waits for a
# load still under way (reading `complete` at once raced it under load) and rejects for a
# broken image.
DRAWN = "i => i.decode().then(() => i.naturalWidth > 0, () => false)"


@WIDTHS
def test_the_preview_per_platform_draws_and_cuts(viewport, new_context, server):
    page = rich_preview(viewport)(new_context, server)
    platforms = page.locator(".platform")
    expect(platforms).to_have_count(4)
    names = page.locator(".platform__name").all_inner_texts()
    assert names == [
        "Chrome on Windows",
        "Chrome on macOS",
        "Chrome on Android",
        "Firefox on Windows",
    ]
    # Each preview is a labelled list item; the icon and (where shown) the image are drawn.
    for index in range(4):
        item = platforms.nth(index)
        labelled = item.get_attribute("aria-labelledby")
        assert labelled and page.locator(f"#{labelled}").is_visible()
        icon = item.locator(".platform__icon")
        assert icon.evaluate(DRAWN)
    assert page.locator(".platform--chrome-windows .platform__image").evaluate(DRAWN)
    expect(page.locator(".platform--chrome-macos .platform__image")).to_have_count(0)
    # macOS cuts the 59-character title at 43, Windows shows it whole; said in words.
    mac = page.locator(".platform--chrome-macos")
    expect(mac.locator(".platform__title")).to_contain_text("…")
    expect(mac.locator(".platform__facts")).to_contain_text("cut to 43 of its 59 characters")
    expect(page.locator(".platform--chrome-windows .platform__title")).to_have_text(LONG_TITLE)
    expect(page.locator(".platform--chrome-windows .platform__actions li")).to_have_count(2)
    expect(page.locator(".platform--firefox .platform__actions")).to_have_count(0)
    # Side by side at 1280 (one row), one under another at 390.
    tops = {round(platforms.nth(i).bounding_box()["y"]) for i in range(4)}
    assert len(tops) == (1 if viewport is DESKTOP else 4)
    _checked(page, "preview", viewport, part="#platforms")


@WIDTHS
def test_the_composer_with_buttons_and_image(viewport, new_context, server):
    page = _staff(sized(new_context, viewport), server, roles=("campaigns",))
    page.goto("/staff/campaigns/new")
    fill_rich(page)
    # Typing marks the per-platform previews out of date until Preview is pressed.
    expect(page.locator("#platforms-stale")).to_be_visible()
    _checked(page, "composer", viewport, part="#campaign-form")


@WIDTHS
def test_a_draft_saved_then_refused_when_stale_and_listed(viewport, new_context, server):
    page = saved_draft(viewport)(new_context, server)
    expect(page.locator("h1")).to_have_text(f"Draft: {LONG_TITLE}")
    expect(page.locator("#action2_title")).to_have_value("Remind me tomorrow morning")
    _checked(page, "draft", viewport)
    stale = stale_draft(viewport)(new_context, server)
    expect(stale.locator(".banner, [role=alert]").first).to_contain_text("saved this draft after")
    expect(stale.locator("#body")).to_have_value("My own change")
    _checked(stale, "draft-stale", viewport)
    listed = drafts_listed(viewport)(new_context, server)
    expect(listed.locator("table.drafts")).to_contain_text(LONG_TITLE)
    _checked(listed, "drafts-listed", viewport)


@WIDTHS
def test_the_review_of_a_rich_campaign(viewport, new_context, server):
    page = rich_review(viewport)(new_context, server)
    expect(page.locator("#settings-heading + .summary-list")).to_contain_text(
        "Shop the sale → /shop"
    )
    _checked(page, "review", viewport, part="#platforms")


# -- uploaded pictures -----------------------------------------------------------------

PICTURES = Path(__file__).parents[1] / "campaigns" / "pictures"


def _upload(
    viewport: dict[str, int] | None, file: Any, use: str, shown: str
) -> Callable[..., Page]:
    """The composer with a title, a picture chosen from the computer for ``use``, and
    Preview pressed; returns once ``shown`` is on the page."""

    def reach(new_context: Callable[..., Any], server: LiveServer) -> Page:
        page = _staff(sized(new_context, viewport), server, roles=("campaigns",))
        page.goto("/staff/campaigns/new")
        page.select_option("#topic", "weekly-digest")
        page.fill("#title", "Winter sale")
        page.fill("#body", "Everything is half price this week.")
        page.set_input_files("#upload", files=file)
        page.check(f"#upload_as-{use}" if use != "image" else "#upload_as")
        page.click("button[value=preview]")
        page.wait_for_selector(shown)
        return page

    return reach


def picture_uploaded(viewport: dict[str, int] | None = None) -> Callable[..., Page]:
    """A JPEG chosen from the computer and previewed: kept, and drawn as the image."""
    return _upload(viewport, str(PICTURES / "sale-72x36.jpg"), "image", "#upload-done")


def picture_refused(viewport: dict[str, int] | None = None) -> Callable[..., Page]:
    """An SVG chosen as the icon: refused at the field, nothing kept."""
    svg = b"<svg xmlns='http://www.w3.org/2000/svg'><script>1</script></svg>"
    file = [{"name": "logo.svg", "mimeType": "image/svg+xml", "buffer": svg}]
    return _upload(viewport, file, "icon", ".error-summary")


@WIDTHS
def test_an_uploaded_picture_is_kept_and_drawn_in_the_preview(
    new_context: Callable[..., Any], server: LiveServer, viewport: dict[str, int]
) -> None:
    page = picture_uploaded(viewport)(new_context, server)
    path = page.input_value("#image")
    assert re.fullmatch(r"/media/[0-9a-f]{64}\.jpg", path), path
    expect(page.locator("#upload-done")).to_contain_text(
        f"Uploaded: 72 × 36 pixels, kept at {path}, and now the image of this campaign."
    )
    drawn = page.locator(f"img.notification__image[src='{path}']")
    expect(drawn).to_be_visible()
    assert drawn.evaluate("img => img.complete && img.naturalWidth") == 72
    # The address serves the picture to anyone: a browser with no staff session.
    anyone = new_context(viewport=viewport).new_page()
    response = anyone.goto(path)
    assert response is not None and response.status == 200
    assert response.headers["content-type"] == "image/jpeg"
    assert response.body() == (PICTURES / "sale-72x36.jpg").read_bytes()
    _checked(page, "picture-uploaded", viewport, part=".compose__preview")


@WIDTHS
def test_a_refused_picture_is_named_in_the_error_summary_and_nothing_is_kept(
    new_context: Callable[..., Any], server: LiveServer, viewport: dict[str, int]
) -> None:
    page = picture_refused(viewport)(new_context, server)
    link = page.locator(".error-summary a[href='#upload']")
    expect(link).to_contain_text("SVG is not accepted (it can carry scripts)")
    assert page.input_value("#icon") == ""
    assert page.locator("#upload_as-icon").is_checked()  # the choice stays as made
    _checked(page, "picture-refused", viewport)
    link.click()
    expect(page.locator("#upload")).to_be_focused()


def test_chromium_decodes_every_sample_at_the_size_the_reader_says(
    new_context: Callable[..., Any],
) -> None:
    page = new_context().new_page()
    page.goto("about:blank")
    for path in sorted(PICTURES.iterdir()):
        shape = media.read_shape(path.read_bytes())
        decoded = page.evaluate(
            """async ([bytes, type]) => {
                 const bitmap = await createImageBitmap(new Blob([new Uint8Array(bytes)], {type}));
                 return [bitmap.width, bitmap.height];
               }""",
            [list(path.read_bytes()), shape.content_type],
        )
        assert decoded == [shape.width, shape.height], path.name


# -- A/B tests ---------------------------------------------------------------------------


def _answered(server: LiveServer, campaign_id: str, shown: int, clicked: dict[int, int]) -> None:
    """``shown`` deliveries of each variant accepted and shown, ``clicked[v]`` of them
    clicked: what browsers would have reported."""
    now = dt.datetime.now(dt.UTC)
    with server.session() as session, session.begin():
        for variant, clicks in clicked.items():
            for n in range(shown):
                delivery = Delivery(
                    campaign_id=uuid.UUID(campaign_id),
                    subscription_id=uuid.uuid4(),
                    push_service="fcm",
                    status="accepted",
                    attempts=1,
                    next_attempt_at=now,
                    consent_reason="explicit_opt_in",
                    variant=variant,
                    updated_at=now,
                )
                session.add(delivery)
                session.flush()
                session.add(DeliveryReceipt(delivery_id=str(delivery.id), event="shown", at=now))
                if n < clicks:
                    session.add(
                        DeliveryReceipt(delivery_id=str(delivery.id), event="clicked", at=now)
                    )
        session.execute(
            sa.text("UPDATE campaign SET status = 'completed', finished_at = :n"), {"n": now}
        )


@WIDTHS
def test_an_ab_test_is_composed_reviewed_and_its_results_compared(viewport, new_context, server):
    page = _staff(sized(new_context, viewport), server, roles=("campaigns",))
    page.goto("/staff/campaigns/new")
    page.select_option("#topic", "weekly-digest")
    page.fill("#title", "Winter sale")
    page.fill("#body", "Everything is half price this week.")
    page.fill("#variant_b_title", "Last days of the sale")
    page.fill("#variant_b_body", "Half price ends on Sunday.")
    page.fill("#test_share", "20")
    page.fill("#winner_after_hours", "4")
    expect(page.locator("#variants-hint")).to_contain_text("are variant A")
    page.click("button[value=review]")
    variants_row = page.locator("#review-variants")
    expect(variants_row).to_contain_text(
        "2 variants, each to about 50% of the first 20% of the audience; 4 hours after the "
        "send time the one with the best click-through rate goes to the other 80%"
    )
    expect(variants_row.locator("li")).to_have_count(2)
    _checked(page, "review-ab", viewport, part="#review-variants")
    page.click("button[value=launch]")
    page.wait_for_selector(".banner")
    campaign_id = str(uuid.UUID(str(server.scalar("SELECT id FROM campaign"))))
    # Before anything is shown: no rate, and no leader; the winner's time is named.
    expect(page.locator("#variant-verdict")).to_contain_text("No variant leads yet")
    expect(page.locator("#variant-winner")).to_contain_text("Tested on 20% of the audience.")
    _checked(page, "campaign-ab-empty", viewport, part="section.variants")

    _answered(server, campaign_id, shown=400, clicked={0: 20, 1: 60})
    page.reload()
    rows = page.locator("#variant-results tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("5.0%")
    expect(rows.nth(1)).to_contain_text("15.0%")
    expect(page.locator("#variant-verdict")).to_contain_text("Variant B leads:")
    _checked(page, "campaign-ab-results", viewport, part="section.variants")


@WIDTHS
def test_an_incomplete_variant_is_named_in_the_error_summary(viewport, new_context, server):
    page = _staff(sized(new_context, viewport), server, roles=("campaigns",))
    page.goto("/staff/campaigns/new")
    page.select_option("#topic", "weekly-digest")
    page.fill("#title", "Winter sale")
    page.fill("#body", "Everything is half price this week.")
    page.fill("#variant_b_title", "Last days of the sale")
    with page.expect_response("**/staff/campaigns/new") as answered:
        page.click("button[value=review]")
    assert answered.value.status == 422
    summary = page.locator(".error-summary")
    expect(summary).to_be_focused()
    link = summary.locator("a[href='#variant_b_body']")
    expect(link).to_have_text("Enter variant B's message")
    _checked(page, "form-ab-error", viewport, part=".error-summary")
    link.click()
    expect(page.locator("#variant_b_body")).to_be_focused()
    assert server.scalar("SELECT count(*) FROM campaign") == 0


def test_chromium_decodes_pictures_stripped_of_metadata_and_turns_by_the_kept_orientation(
    new_context: Callable[..., Any],
) -> None:
    """The metadata taken out (portal/campaigns/picture_metadata.py), each format still
    decodes at its size, and a JPEG's kept orientation 6 (a quarter turn) is applied."""
    page = new_context().new_page()
    page.goto("about:blank")
    cases = [
        (built.jpeg_with_metadata(6), "image/jpeg", [36, 72]),  # turned: 72 × 36 on its side
        (built.jpeg_with_metadata(None), "image/jpeg", [72, 36]),
        (built.png_with_metadata(), "image/png", [64, 64]),
        (built.webp_with_metadata(), "image/webp", [48, 48]),
        (built.gif_with_metadata(), "image/gif", [3, 2]),
    ]
    for data, content_type, size in cases:
        stripped = media.picture_metadata.strip(data, content_type)
        decoded = page.evaluate(
            """async ([bytes, type]) => {
                 const bitmap = await createImageBitmap(new Blob([new Uint8Array(bytes)], {type}));
                 return [bitmap.width, bitmap.height];
               }""",
            [list(stripped), content_type],
        )
        assert decoded == size, content_type
