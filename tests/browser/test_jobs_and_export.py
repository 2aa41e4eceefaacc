"""The jobs page with a run history, and the export form, in Chromium at 1280 and 390 px.

The jobs page must agree with its run history (dispatch's recorded runs are its last run,
not "never") and say what each job does; the export form must start with the whole
history and say so, hint no way of writing a date other than the browser's own, and
download CSV and NDJSON under names that carry the period and the format. axe-core finds
nothing at either width. Screenshots land in artifacts/screenshots/ for people to look at.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import Page

from portal import jobs
from portal.compliance.verify import verify_bundle
from portal.consent import log
from portal.consent.models import EventKind, Source
from portal.db import db
from portal.operations.scheduler import run_recorded
from tests.browser.conftest import DESKTOP, PHONE, SCREENSHOTS, LiveServer, subscribe_through_api
from tests.browser.test_accessibility import _staff, axe_results, styled
from tests.factories import SubscriptionFactory

pytestmark = pytest.mark.browser

WIDTHS = [DESKTOP, PHONE]


def _sized(new_context: Callable[..., Any], viewport: dict[str, int]) -> Callable[..., Any]:
    def make(**options: Any) -> Any:
        options["viewport"] = viewport
        return new_context(**options)

    return make


def _no_violations(page: Page) -> None:
    results = axe_results(page)
    assert results.violations_count == 0, results.generate_report()


def _fits(page: Page) -> None:
    assert styled(page).evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0


def _shoot(page: Page, name: str, viewport: dict[str, int]) -> None:
    """The whole page, and the page in screen-high parts (a tall phone page is easier to
    look at a part at a time)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    width = viewport["width"]
    page.screenshot(path=SCREENSHOTS / f"{name}-{width}.png", full_page=True)
    height = page.evaluate("document.documentElement.scrollHeight")
    step = viewport["height"] * 2
    for part, top in enumerate(range(0, height, step), start=1):
        clip = {"x": 0, "y": top, "width": width, "height": min(step, height - top)}
        page.screenshot(
            path=SCREENSHOTS / f"{name}-{width}-part{part}.png", clip=clip, full_page=True
        )


def _job_row(page: Page, name: str) -> dict[str, str]:
    """The jobs table's row for ``name``, cells by column name (the header's, so it reads
    the same at any width)."""
    table = page.locator("table").first
    headers = table.locator("thead th").all_inner_texts()
    row = table.locator(f"tbody tr:has(th:text-is('{name}'))")
    cells = row.locator("th, td").all_inner_texts()
    # (At 390 px each cell's column name is CSS generated content: not in its text.)
    return dict(zip(headers, (cell.strip() for cell in cells), strict=True))


@pytest.mark.parametrize("viewport", WIDTHS, ids=lambda v: f"{v['width']}px")
def test_the_jobs_page_agrees_with_its_run_history(
    viewport: dict[str, int], new_context: Any, server: LiveServer
) -> None:
    app = server.app
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    # Sixteen dispatch runs that sent something, a minute apart, the newest a minute ago
    # (as the scheduler records them: a job_run row and no job_state row).
    with server.session() as session, session.begin():
        for minutes in range(16, 0, -1):
            session.execute(
                sa.text(
                    "INSERT INTO job_run (name, trigger, host, started_at, seconds, processed, "
                    "changed) VALUES ('dispatch', 'scheduler', 'web-1:4242', :t, 0.25, 4, 4)"
                ),
                {"t": now - dt.timedelta(minutes=minutes)},
            )
    newest = now - dt.timedelta(minutes=1)
    run_recorded(app, "sweep", trigger="command")

    page = _staff(_sized(new_context, viewport), server)
    page.goto("/staff/ops/jobs")
    styled(page)

    dispatch = _job_row(page, "dispatch")
    assert "never" not in " ".join(dispatch.values()), dispatch
    assert dispatch["Last run"] == f"{newest:%Y-%m-%d %H:%M:%S} UTC, took 0.25 s", dispatch
    assert dispatch["What it does"] == jobs.find("dispatch").description
    assert dispatch["Runs"].startswith("every 5 seconds, in every process")
    # Its next run is its last plus its tick: long past here, so due now; the test server
    # runs no scheduler, and the page says so.
    assert dispatch["Next run"] == "due now (scheduler off here)"
    assert page.locator("#scheduler-off").is_visible()

    sweep = _job_row(page, "sweep")
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, took \d+\.\d\d s", sweep["Last run"])
    assert sweep["Next run"].endswith("UTC (scheduler off here)")
    assert _job_row(page, "purge")["Last run"] == "never"
    assert _job_row(page, "backfill-hash")["Next run"] == "not scheduled: run by hand only"
    runs = page.locator("table:has(caption:text('Newest first')) tbody tr")
    assert runs.count() == 17

    _fits(page)
    # Nor does the jobs table scroll inside its region: every column is in view.
    region = page.locator("[aria-labelledby=jobs-heading]")
    assert region.evaluate("el => el.scrollWidth - el.clientWidth") <= 0
    _no_violations(page)
    _shoot(page, "staff-jobs-history", viewport)


def _an_old_event(server: LiveServer, days_ago: int) -> dt.date:
    """A consent event recorded ``days_ago`` days back, in the log like any other."""
    from portal.subscriptions.models import PushSubscription

    with server.app.app_context(), db.begin() as session:
        subscriber_id = session.scalars(sa.select(PushSubscription.subscriber_id)).first()
        assert subscriber_id is not None
        log.lock_subscriber(session, subscriber_id)
        when = dt.datetime.now(dt.UTC) - dt.timedelta(days=days_ago)
        log.append(
            session,
            kind=EventKind.ACCOUNT_LINKED,
            subscriber_id=subscriber_id,
            source=Source.API,
            actor="system",
            recorded_at=when,
        )
    return when.date()


@pytest.mark.parametrize("viewport", WIDTHS, ids=lambda v: f"{v['width']}px")
def test_the_export_form_covers_the_whole_history_and_names_each_download(
    viewport: dict[str, int], new_context: Any, server: LiveServer, tmp_path: Path
) -> None:
    subscriber = new_context(stub=False)
    subscribe_through_api(subscriber, SubscriptionFactory()("fcm"))
    first = _an_old_event(server, days_ago=60)  # older than the 30 days it once started with
    today = dt.datetime.now(dt.UTC).date()

    page = _staff(_sized(new_context, viewport), server)
    page.goto("/staff/compliance/export")
    styled(page)

    assert page.input_value("#date_from") == first.isoformat()
    assert page.input_value("#date_to") == today.isoformat()
    covered = page.inner_text("#period-covered")
    assert "whole history" in covered
    assert f"{first:%d %B %Y}, the day of the first recorded event" in covered
    assert f"to today, {today:%d %B %Y}" in covered
    # The browser writes the date fields its own way (11/01/2026 here): no hint may show
    # another way of writing them.
    hints = page.locator("fieldset:has(#date_from) .hint").all_inner_texts()
    assert hints and not any(re.search(r"\d{4}-\d\d-\d\d|\d\d?/\d\d?/\d{4}", h) for h in hints)
    _fits(page)
    _no_violations(page)
    _shoot(page, "staff-compliance-export", viewport)

    names = {}
    for data_format in ("csv", "ndjson"):
        page.check(f"input[name=data_format][value={data_format}]")
        with page.expect_download() as started:
            page.click("button:text('Download the export')")
        download = started.value
        names[data_format] = download.suggested_filename
        path = tmp_path / download.suggested_filename
        download.save_as(path)
        report = verify_bundle(path)
        assert report.ok, report.problems
        assert report.rows == server.scalar("SELECT count(*) FROM consent_event")
    period = f"{first.isoformat()}_{today.isoformat()}"
    assert names == {
        "csv": f"consent-export-{period}-csv.zip",
        "ndjson": f"consent-export-{period}-ndjson.zip",
    }
