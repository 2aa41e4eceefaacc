"""A campaign's times on its page and in the list: in the zone they were chosen in, with
the zone's offset at that moment, and in UTC, in a ``<time datetime="…Z">``."""

from __future__ import annotations

import html as htmllib
import re

import sqlalchemy as sa

from portal.db import db
from tests.campaigns.test_pages import launch_via_form

PARIS = (
    '<time datetime="2026-12-08T08:00:00Z">'
    "Tue 8 Dec 2026, 09:00 Europe/Paris (UTC+01:00) — 08:00 UTC</time>"
)


def row(html: str, term: str) -> str:
    match = re.search(rf"<dt>{term}</dt><dd[^>]*>(.*?)</dd>", html, re.S)
    assert match, f"no {term} row"
    return htmllib.unescape(match.group(1))


def test_a_scheduled_campaign_shows_its_time_as_chosen_and_in_utc(campaigner, catalogue_ready):
    campaign_id, _ = launch_via_form(
        campaigner,
        schedule="later",
        send_at="2026-12-08T09:00",
        timezone="Europe/Paris",
        deliver_until="2026-12-09T00:30",
    )
    page = campaigner.get(f"/staff/campaigns/{campaign_id}").text
    assert row(page, "Sends") == PARIS
    # The other day in UTC is named: 00:30 in Paris on the 9th is 23:30 UTC on the 8th.
    assert row(page, "Don't deliver after") == (
        '<time datetime="2026-12-08T23:30:00Z">Wed 9 Dec 2026, 00:30 Europe/Paris (UTC+01:00)'
        " — Tue 8 Dec 2026, 23:30 UTC</time>"
    )
    assert "Campaign launched: it sends on Tue 8 Dec 2026, 09:00 Europe/Paris" in (
        htmllib.unescape(page)  # the flash, once
    )
    listed = htmllib.unescape(campaigner.get("/staff/campaigns").text)
    assert '<th scope="col">Send time</th>' in listed
    assert f'<td data-label="Send time" class="campaign-sends">{PARIS}</td>' in listed


def test_just_after_the_clocks_go_forward_the_summer_offset_is_shown(campaigner, catalogue_ready):
    campaign_id, _ = launch_via_form(
        campaigner, schedule="later", send_at="2026-03-29T03:00", timezone="Europe/Paris"
    )
    page = campaigner.get(f"/staff/campaigns/{campaign_id}").text
    assert row(page, "Sends") == (
        '<time datetime="2026-03-29T01:00:00Z">'
        "Sun 29 Mar 2026, 03:00 Europe/Paris (UTC+02:00) — 01:00 UTC</time>"
    )


def test_a_finished_campaign_shows_when_it_was_scheduled(campaigner, catalogue_ready):
    campaign_id, _ = launch_via_form(
        campaigner, schedule="later", send_at="2026-12-08T09:00", timezone="Europe/Paris"
    )
    with db.begin(catalogue_ready) as session:
        session.execute(sa.text("UPDATE campaign SET status = 'completed', finished_at = send_at"))
    page = campaigner.get(f"/staff/campaigns/{campaign_id}").text
    assert row(page, "Scheduled for") == PARIS
    assert "<dt>Sends</dt>" not in page
    listed = htmllib.unescape(campaigner.get("/staff/campaigns").text)
    assert PARIS in listed


def test_a_campaign_launched_before_zones_were_kept_reads_in_utc_and_says_so(
    campaigner, catalogue_ready
):
    campaign_id, _ = launch_via_form(
        campaigner, schedule="later", send_at="2026-12-08T09:00", timezone="Europe/Paris"
    )
    with db.begin(catalogue_ready) as session:
        session.execute(sa.text("UPDATE campaign SET time_zone = NULL"))
    campaigner.get(f"/staff/campaigns/{campaign_id}")  # the launch's flash, which names it
    page = campaigner.get(f"/staff/campaigns/{campaign_id}").text
    sends = row(page, "Sends")
    assert sends.startswith(
        '<time datetime="2026-12-08T08:00:00Z">Tue 8 Dec 2026, 08:00 UTC</time>'
    )
    assert "Launched before the zone it was chosen in was kept: shown in UTC." in sends
    assert "Europe/Paris" not in page
    listed = htmllib.unescape(campaigner.get("/staff/campaigns").text)
    assert '<time datetime="2026-12-08T08:00:00Z">Tue 8 Dec 2026, 08:00 UTC</time>' in listed
