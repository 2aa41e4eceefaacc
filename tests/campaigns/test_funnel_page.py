"""The delivery funnel on the campaign page and in its progress JSON: the counts with their
shares, both click-through rates labelled, "no receipts yet" when there are none, no rate
from a zero denominator, and the chart as an accessible SVG with the same figures as a
table. Staff without the campaigns role see none of it."""

from __future__ import annotations

import datetime as dt
import itertools
import re

from portal.campaigns import funnel_chart
from portal.campaigns.funnel import Bucket, Funnel
from portal.db import db
from portal.staff.models import Role
from tests.factories import FunnelFactory

S = dt.timedelta(seconds=1)


def _campaign(app, clock, build) -> str:
    with db.begin(app) as session:
        factory = FunnelFactory(session, sent_at=clock.now() - dt.timedelta(minutes=30))
        build(factory)
        return str(factory.campaign.id)


def _sent_and_seen(factory: FunnelFactory) -> None:
    """20 accepted, 8 shown, 2 of them clicked (one with no shown receipt), 1 failed."""
    factory.many(12, after=5 * S)
    factory.many(6, after=5 * S, shown=40 * S)
    factory.delivery(after=5 * S, shown=50 * S, clicked=8 * 60 * S)
    factory.delivery(after=6 * S, clicked=20 * 60 * S)
    factory.delivery("failed")


def _section(page: str) -> str:
    start = page.index('<section aria-labelledby="funnel-heading"')
    return page[start : page.index("</section>", start)]


def test_the_page_gives_counts_shares_and_both_click_through_rates(
    campaigner, catalogue_ready, clock
):
    campaign_id = _campaign(catalogue_ready, clock, _sent_and_seen)
    page = campaigner.get(f"/staff/campaigns/{campaign_id}")
    assert page.status_code == 200
    funnel = _section(page.text)
    cells = re.findall(
        r'<tr><th scope="row">([^<]+)</th><td class="numeric" data-funnel="\w+">([\d,]+)</td>'
        r'<td class="numeric">([^<]+)</td></tr>',
        funnel,
    )
    assert cells == [
        ("Accepted by a push service", "20", "100.0%"),
        ("Shown on screen", "8", "40.0%"),
        ("Clicked", "2", "10.0%"),
    ]
    assert '<dt>Clicked ÷ shown</dt><dd id="funnel-ctr-shown">25.0% (2 of 8 shown)</dd>' in funnel
    assert (
        '<dt>Clicked ÷ accepted</dt><dd id="funnel-ctr-accepted">10.0% (2 of 20 accepted)</dd>'
        in funnel
    )
    assert "“Shown” includes 1 delivery reported clicked whose display was never reported" in (
        funnel
    )
    assert "No receipts yet" not in funnel


def test_the_chart_is_an_accessible_svg_with_its_figures_as_a_table(
    campaigner, catalogue_ready, clock
):
    campaign_id = _campaign(catalogue_ready, clock, _sent_and_seen)
    funnel = _section(campaigner.get(f"/staff/campaigns/{campaign_id}").text)
    svg = funnel[funnel.index("<svg") : funnel.index("</svg>")]
    assert 'role="img"' in svg and 'aria-labelledby="funnel-title funnel-desc"' in svg
    assert '<title id="funnel-title">Accepted, shown and clicked over time</title>' in svg
    desc = re.search(r'<desc id="funnel-desc">([^<]+)</desc>', svg).group(1)
    # Sent 23:30 on 31 December; the last click 20 minutes later: 1-minute periods.
    assert desc == (
        "Running totals in 1-minute periods from 23:30 to 23:51 UTC on 31 December 2025: "
        "by the end, 20 accepted, 8 shown and 2 clicked."
    )
    assert svg.count("<polyline") == 3
    for name in ("Accepted 20", "Shown 8", "Clicked 2"):
        assert f">{name}</text>" in svg
    assert 'style="' not in svg
    table = funnel[funnel.index("<details") : funnel.index("</details>")]
    assert (
        "<caption>Running totals at the end of each 1-minute period on 31 December 2025 (UTC)"
        "</caption>" in table
    )
    rows = re.findall(
        r'<time datetime="[^"]+">([^<]+)</time></th><td class="numeric">(\d+)</td>'
        r'<td class="numeric">(\d+)</td><td class="numeric">(\d+)</td>',
        table,
    )
    assert len(rows) == 21
    assert rows[0] == ("23:30 to 23:31", "20", "7", "0")
    assert rows[1] == ("23:31 to 23:32", "20", "7", "0")
    assert rows[8] == ("23:38 to 23:39", "20", "7", "1")
    assert rows[-1] == ("23:50 to 23:51", "20", "8", "2")


def test_without_receipts_it_says_so_and_gives_no_rate_of_nothing_shown(
    campaigner, catalogue_ready, clock
):
    campaign_id = _campaign(catalogue_ready, clock, lambda f: f.many(5, after=5 * S))
    funnel = _section(campaigner.get(f"/staff/campaigns/{campaign_id}").text)
    assert (
        '<p id="funnel-empty">No receipts yet: no browser has reported showing or clicking '
        "this notification.</p>" in funnel
    )
    assert "No rate yet: nothing has been reported shown." in funnel
    assert "0.0% (0 of 5 accepted)" in funnel
    assert "%" not in funnel.split('id="funnel-ctr-shown">')[1].split("</dd>")[0]


def test_a_campaign_with_nothing_accepted_shows_no_table_no_rate_and_no_chart(
    campaigner, catalogue_ready, clock
):
    campaign_id = _campaign(catalogue_ready, clock, lambda f: f.many(3, "failed"))
    funnel = _section(campaigner.get(f"/staff/campaigns/{campaign_id}").text)
    assert "No receipts yet: no push service has accepted a delivery of this campaign." in funnel
    assert "%" not in funnel
    assert "<svg" not in funnel and "<table" not in funnel


def test_progress_json_carries_the_funnel_and_its_fragment(campaigner, catalogue_ready, clock):
    campaign_id = _campaign(catalogue_ready, clock, _sent_and_seen)
    data = campaigner.get(f"/staff/campaigns/{campaign_id}/progress.json").get_json()
    assert data["funnel"] == {
        "accepted": 20,
        "shown": 8,
        "clicked": 2,
        "clickedOutsideButtons": 2,
        "clickedOnButtons": [0, 0],
        "clickedWithoutShown": 1,
        "receiptsNotAccepted": 0,
        "clickedOfShown": 25.0,
        "clickedOfAccepted": 10.0,
    }
    assert 'id="funnel-counts"' in data["html"]["funnel"]
    empty = _campaign(catalogue_ready, clock, lambda f: None)
    data = campaigner.get(f"/staff/campaigns/{empty}/progress.json").get_json()
    assert data["funnel"]["clickedOfShown"] is None
    assert data["funnel"]["clickedOfAccepted"] is None


def test_staff_without_the_campaigns_role_see_no_funnel(sign_in, catalogue_ready, clock):
    campaign_id = _campaign(catalogue_ready, clock, _sent_and_seen)
    officer = sign_in(catalogue_ready, "officer@example.test", Role.COMPLIANCE)
    for path in (
        f"/staff/campaigns/{campaign_id}",
        f"/staff/campaigns/{campaign_id}/progress.json",
    ):
        answer = officer.get(path)
        assert answer.status_code == 403, path
        assert "funnel" not in answer.text


# -- the chart's layout ---------------------------------------------------------------------


def _funnel(values: list[tuple[int, int, int]], width: int = 60) -> Funnel:
    start = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)
    step = dt.timedelta(seconds=width)
    buckets = [
        Bucket(start + i * step, start + (i + 1) * step, 0, 0, 0, a, s, c)
        for i, (a, s, c) in enumerate(values)
    ]
    a, s, c = values[-1]
    return Funnel(a, s, c, 0, 0, start + len(values) * step, width, buckets)


def test_the_names_at_the_line_ends_never_overlap_even_when_the_figures_are_equal():
    for values in ([(5, 5, 5)], [(100, 0, 0)], [(100, 99, 98)], [(3, 1, 0)] * 24):
        chart = funnel_chart.funnel_chart(_funnel(values))
        assert chart is not None
        ys = [line.label_y for line in chart.lines]
        assert all(b - a >= funnel_chart.LINE_LABEL_GAP - 0.1 for a, b in itertools.pairwise(ys)), (
            ys
        )
        assert all(0 < y <= chart.baseline for y in ys), ys


def test_the_time_labels_are_spaced_to_fit():
    for n in (1, 2, 5, 12, 24):
        chart = funnel_chart.funnel_chart(_funnel([(1, 0, 0)] * n))
        xs = [label.x for label in chart.labels]
        assert len(xs) >= 2
        assert all(
            b - a >= funnel_chart.TIME_LABEL_SPACE - 0.2 for a, b in itertools.pairwise(xs)
        ), xs
        assert chart.labels[0].text == "12:00"


def test_day_periods_are_labelled_with_dates():
    chart = funnel_chart.funnel_chart(_funnel([(1, 1, 0)] * 4, width=86400))
    assert [label.text for label in chart.labels] == [
        "01 Jan",
        "02 Jan",
        "03 Jan",
        "04 Jan",
        "05 Jan",
    ]
    rows = funnel_chart.periods(_funnel([(1, 1, 0)] * 2, width=2 * 86400))
    assert [row.text for row in rows] == [
        "01 Jan 2026 to 02 Jan 2026",
        "03 Jan 2026 to 04 Jan 2026",
    ]
    assert funnel_chart.period_words(2 * 86400) == "2-day"
    assert funnel_chart.period_words(15 * 60) == "15-minute"
    assert funnel_chart.period_words(7 * 86400) == "1-week"


def test_periods_across_midnight_name_their_day():
    late = _funnel([(1, 0, 0)] * 3, width=3600)
    assert funnel_chart.one_day(late) == dt.date(2026, 1, 1)
    start = dt.datetime(2026, 1, 1, 23, tzinfo=dt.UTC)
    hour = dt.timedelta(hours=1)
    buckets = [Bucket(start + i * hour, start + (i + 1) * hour, 1, 0, 0, 1, 0, 0) for i in range(2)]
    across = Funnel(1, 0, 0, 0, 0, start, 3600, buckets)
    assert funnel_chart.one_day(across) is None
    assert [p.text for p in funnel_chart.periods(across)] == [
        "01 Jan 23:00 to 00:00",
        "02 Jan 00:00 to 01:00",
    ]
    # One ending at midnight is still on its day.
    ending = Funnel(1, 0, 0, 0, 0, start, 3600, buckets[:1])
    assert funnel_chart.one_day(ending) == dt.date(2026, 1, 1)
    assert funnel_chart.periods(ending)[0].text == "23:00 to 00:00"


def test_names_pushed_off_the_bottom_move_up_only_as_far_as_they_must():
    from portal.charts import spread

    assert spread([50, 200, 200], gap=15, low=16, high=200) == [50, 185, 200]
    assert spread([190, 195, 200], gap=15, low=16, high=200) == [170, 185, 200]
    assert spread([0, 0, 0], gap=15, low=16, high=200) == [16, 31, 46]


def _with_buttons(factory: FunnelFactory) -> None:
    """Two buttons; 10 accepted: 2 clicked on the notification, 3 on "Shop now", 1 on
    "Later", one of those also on the notification."""
    factory.campaign.actions = [
        {"title": "Shop now", "url": "/shop"},
        {"title": "Later", "url": "/later"},
    ]
    factory.many(4, after=5 * S, shown=40 * S)
    factory.delivery(after=5 * S, shown=50 * S, clicked=60 * S)
    factory.delivery(after=5 * S, shown=50 * S, clicked=60 * S, button_2=90 * S)
    factory.many(3, after=5 * S, shown=50 * S, button_1=70 * S)
    factory.delivery(after=5 * S)


def test_the_page_counts_clicks_by_where_with_each_buttons_label(
    campaigner, catalogue_ready, clock
):
    campaign_id = _campaign(catalogue_ready, clock, _with_buttons)
    funnel = _section(campaigner.get(f"/staff/campaigns/{campaign_id}").text)
    cells = re.findall(
        r'<tr(?: class="funnel__where")?><th scope="row">([^<]+)</th>'
        r'<td class="numeric" data-funnel="[\w-]+">([\d,]+)</td><td class="numeric">([^<]+)</td>',
        funnel,
    )
    assert cells == [
        ("Accepted by a push service", "10", "100.0%"),
        ("Shown on screen", "9", "90.0%"),
        ("Clicked", "5", "50.0%"),
        ("Clicked outside the buttons", "2", "20.0%"),
        ("Clicked on button 1, “Shop now”", "3", "30.0%"),
        ("Clicked on button 2, “Later”", "1", "10.0%"),
    ]
    assert "the rows by where it was clicked add up to 1 more" in funnel
    data = campaigner.get(f"/staff/campaigns/{campaign_id}/progress.json").get_json()
    assert (data["funnel"]["clickedOutsideButtons"], data["funnel"]["clickedOnButtons"]) == (
        2,
        [3, 1],
    )


def test_without_buttons_there_are_no_rows_by_where(campaigner, catalogue_ready, clock):
    campaign_id = _campaign(catalogue_ready, clock, _sent_and_seen)
    funnel = _section(campaigner.get(f"/staff/campaigns/{campaign_id}").text)
    assert "funnel__where" not in funnel and "more than one place" not in funnel
