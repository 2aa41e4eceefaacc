"""The campaign form: what it offers, every refusal in the error-summary pattern, preview."""

from __future__ import annotations

import datetime as dt
import html as htmllib
import re

import pytest
import sqlalchemy as sa

from portal.campaigns.forms import LocalTimeError, local_to_utc
from portal.campaigns.models import Campaign
from portal.campaigns.services import MAX_PLAINTEXT
from portal.seams import current_portal
from tests.campaigns.conftest import form_data


def review(person, **fields):
    return person.post("/staff/campaigns/new", {**form_data(**fields), "action": "review"})


def summary_links(html: str) -> list[tuple[str, str]]:
    block = html[
        html.index('class="error-summary"') : html.index("</div>", html.index("error-summary"))
    ]
    return [
        (anchor, htmllib.unescape(text))
        for anchor, text in re.findall(r'<a href="#([\w-]+)">([^<]+)</a>', block)
    ]


def field_error(html: str, field: str) -> str:
    match = re.search(
        rf'<p class="field-error" id="{field}-error">.*?</span> ([^<]+)</p>', html, re.S
    )
    assert match, f"no error shown at {field}"
    return htmllib.unescape(match.group(1).strip())


def campaigns(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT count(*) FROM campaign")).scalar_one()


def test_the_form_offers_active_topics_with_their_class_and_defaults(campaigner, catalogue_ready):
    page = campaigner.get("/staff/campaigns/new")
    assert page.status_code == 200
    html = page.text
    assert "<title>New campaign – Staff console" in html
    assert '<option value="weekly-digest">Weekly Digest (marketing, News)</option>' in html
    assert (
        '<option value="security-alerts">Security Alerts (transactional, Your account)</option>'
        in html
    )
    assert '<input id="send_at" name="send_at" type="datetime-local"' in html
    # The zone: a text input, UTC by default, suggesting the canonical zones only.
    assert (
        '<input id="timezone" name="timezone" type="text" value="UTC" autocomplete="off" '
        'list="timezone-zones"'
    ) in html
    assert '<option value="UTC" label="Coordinated Universal Time">' in html
    assert '<option value="Europe/Paris" label="Paris (also Monaco) — France, Monaco">' in html
    assert 'label="Brussels (also Amsterdam, Luxembourg) — Belgium' in html
    assert 'value="US/Eastern"' not in html and 'value="Europe/Amsterdam"' not in html
    assert 'value="Etc/GMT+5"' not in html and 'value="GB"' not in html
    assert 'name="ttl" type="text" value="86400" inputmode="numeric"' in html
    assert "That is 1 day." in html
    for value in ("very-low", "low", "normal", "high"):
        assert f'name="urgency" value="{value}"' in html
    assert 'id="urgency" name="urgency" value="very-low"' in html  # the summary's anchor
    assert 'value="normal" checked' in html
    # Scripts and styles come from files only: a strict CSP can forbid inline ones.
    assert re.findall(r"<script(?![^>]*\bsrc=)", html) == []
    assert " style=" not in html
    assert "js/campaign-preview.js" in html


def test_a_retired_topic_is_not_offered(campaigner, catalogue_ready, clock):
    from portal.consent import catalogue
    from portal.db import db

    with db.begin(catalogue_ready) as session:
        catalogue.retire_topic(session, "offers", now=clock.now())
    assert 'value="offers"' not in campaigner.get("/staff/campaigns/new").text
    response = review(campaigner, topic="offers")
    assert response.status_code == 422
    assert field_error(response.text, "topic") == "Choose an active topic"


def test_an_empty_form_names_every_problem_in_page_order(campaigner, engine):
    response = review(campaigner, topic="", title="", body="", ttl="one day", schedule="")
    assert response.status_code == 422
    html = response.text
    assert "<title>Error: New campaign – Staff console" in html
    assert "data-focus-on-load" in html[html.index("error-summary") - 200 :]
    assert summary_links(html) == [
        ("topic", "Choose an active topic"),
        ("title", "Enter a title"),
        ("body", "Enter the message"),
        ("ttl", "Enter the time to live as a whole number of seconds, like 86400"),
        ("schedule", "Choose when to send"),
    ]
    assert 'aria-describedby="title-hint title-error" aria-invalid="true"' in html
    assert 'aria-describedby="body-hint body-error" aria-invalid="true"' in html
    assert 'aria-describedby="ttl-hint ttl-error" aria-invalid="true"' in html
    assert re.search(
        r'<select id="topic" name="topic"\s+aria-describedby="topic-hint topic-error" aria-invalid="true"',
        html,
    )
    # What was typed comes back.
    assert 'value="one day"' in html
    assert campaigns(engine) == 0


def test_a_payload_too_large_is_refused_with_its_size(campaigner, engine):
    body = "é" * 2000  # two bytes each in UTF-8
    response = review(campaigner, body=body)
    assert response.status_code == 422
    message = field_error(response.text, "body")
    size = int(re.search(r"The message is (\d+) bytes", message).group(1))
    assert size > MAX_PLAINTEXT
    assert f"at most {MAX_PLAINTEXT} bytes" in message
    assert f"shorten it by {size - MAX_PLAINTEXT} bytes" in message
    assert ("body", message) in summary_links(response.text)
    # The preview beside the form shows the same count against the limit.
    assert f"{size} of {MAX_PLAINTEXT} bytes" in response.text
    assert f"— too large by {size - MAX_PLAINTEXT} bytes" in response.text
    assert campaigns(engine) == 0


def test_a_payload_right_at_the_limit_passes(campaigner):
    response = review(campaigner, body="x" * 10)
    used = int(re.search(r"(\d+) of 3993 bytes", response.text).group(1))
    room = MAX_PLAINTEXT - used
    assert review(campaigner, body="x" * (10 + room)).status_code == 200
    assert review(campaigner, body="x" * (11 + room)).status_code == 422


def allow_link_origins(app, *origins: str, public_url: str | None = None) -> None:
    changed = current_portal(app).settings.with_overrides(
        campaign_link_origins=origins, public_url=public_url
    )
    current_portal(app).settings = changed


@pytest.mark.parametrize(
    "link",
    [
        "javascript:alert(1)",
        "//evil.example/path",
        "/\\evil.example",
        "news",
        "https://user@example.com/",
    ],
)
def test_a_bad_link_is_refused(campaigner, link):
    response = review(campaigner, url=link)
    assert response.status_code == 422
    assert field_error(response.text, "url") == "A link is an https:// URL or a path on this site"


@pytest.mark.parametrize("link", ["/news?id=1#top", "http://localhost/news"])
def test_good_links_pass(campaigner, link):
    # A path, or this site's own address (in development, the address the form is on).
    assert review(campaigner, url=link, icon=link).status_code == 200


@pytest.mark.parametrize(
    "link",
    [
        "https://example.com/a?b=c",
        "http://example.com/news",
        "https://localhost.evil.example/",
        "https://localhost:8443/news",
    ],
)
def test_a_link_to_another_site_is_refused_in_the_form(campaigner, engine, link):
    for field in ("url", "icon"):
        response = review(campaigner, **{field: link})
        assert response.status_code == 422
        assert field_error(response.text, field) == "Links may lead only to this site"
    launched = campaigner.post("/staff/campaigns/new", {**form_data(url=link), "action": "launch"})
    assert launched.status_code == 422
    assert campaigns(engine) == 0


def test_sites_allowed_for_campaigns_may_be_linked(campaigner, catalogue_ready):
    allow_link_origins(
        catalogue_ready, "https://shop.example", "https://cdn.example", public_url=None
    )
    fine = review(
        campaigner, url="https://shop.example/sale?id=1", icon="https://CDN.example/i.png"
    )
    assert fine.status_code == 200
    refused = review(campaigner, url="https://elsewhere.example/")
    assert field_error(refused.text, "url") == (
        "Links may lead only to this site or to https://cdn.example, https://shop.example"
    )


def test_this_site_is_the_public_url_not_the_address_typed(campaigner, catalogue_ready):
    allow_link_origins(catalogue_ready, public_url="https://portal.example")
    assert review(campaigner, url="https://portal.example/news").status_code == 200
    # The form is reached at http://localhost here, which is not the public address.
    refused = review(campaigner, url="http://localhost/news")
    assert field_error(refused.text, "url") == "Links may lead only to this site"


def test_a_bad_icon_is_refused(campaigner):
    response = review(campaigner, icon="data:image/png;base64,AAAA")
    assert field_error(response.text, "icon") == "A link is an https:// URL or a path on this site"


@pytest.mark.parametrize("key", ["has space", "x" * 33, "dots.not.allowed", "ü"])
def test_a_bad_collapse_key_is_refused(campaigner, key):
    response = review(campaigner, collapse_key=key)
    assert response.status_code == 422
    assert (
        field_error(response.text, "collapse_key")
        == "The collapse key is at most 32 letters, digits, '-' or '_'"
    )


def test_a_good_collapse_key_and_urgency_pass(campaigner):
    response = review(campaigner, collapse_key="A" * 30 + "-_", urgency="very-low")
    assert response.status_code == 200
    assert (
        "<dd>Very low — delivered only when the device is on power and Wi-Fi</dd>" in response.text
    )


def test_an_unknown_urgency_and_a_ttl_out_of_range_are_refused(campaigner):
    response = review(campaigner, urgency="asap", ttl="2419201")
    assert response.status_code == 422
    assert field_error(response.text, "urgency") == "Choose an urgency"
    assert field_error(response.text, "ttl") == "Time to live is 0 to 2419200 seconds"


def test_the_ttl_is_shown_in_plain_words(campaigner):
    response = campaigner.post(
        "/staff/campaigns/new", {**form_data(ttl="5400"), "action": "preview"}
    )
    assert "That is 1 hour and 30 minutes." in response.text
    response = review(campaigner, ttl="0")
    assert "0 seconds (0 seconds: delivered only if the browser can be reached at once)" in (
        response.text
    )


def test_a_send_time_in_another_zone_is_converted_to_utc(campaigner, catalogue_ready, clock):
    # 27 March 2026 is before the EU's change to summer time: Paris is UTC+1.
    response = review(
        campaigner, schedule="later", send_at="2026-03-27T09:30", timezone="Europe/Paris"
    )
    assert response.status_code == 200
    assert (
        '<time datetime="2026-03-27T08:30:00Z">'
        "Fri 27 Mar 2026, 09:30 Europe/Paris (UTC+01:00) — 08:30 UTC</time>"
    ) in response.text
    launched = campaigner.post(
        "/staff/campaigns/new",
        {
            **form_data(schedule="later", send_at="2026-03-27T09:30", timezone="Europe/Paris"),
            "action": "launch",
        },
    )
    assert launched.status_code == 303
    from portal.db import db

    with db.begin(catalogue_ready) as session:
        (campaign,) = session.scalars(sa.select(Campaign)).all()
        assert campaign.send_at == dt.datetime(2026, 3, 27, 8, 30, tzinfo=dt.UTC)
        assert campaign.time_zone == "Europe/Paris"  # kept, to show the time as chosen
        assert campaign.status == "scheduled"


def test_local_times_convert_across_summer_time():
    assert local_to_utc("2026-07-01T09:00", "America/New_York") == dt.datetime(
        2026, 7, 1, 13, 0, tzinfo=dt.UTC
    )
    assert local_to_utc("2026-01-15T09:00", "America/New_York") == dt.datetime(
        2026, 1, 15, 14, 0, tzinfo=dt.UTC
    )
    assert local_to_utc("2026-06-01T12:00:30", "UTC") == dt.datetime(
        2026, 6, 1, 12, 0, 30, tzinfo=dt.UTC
    )
    # Clocks go back: 01:30 happens twice in London on 25 October 2026; the first counts.
    assert local_to_utc("2026-10-25T01:30", "Europe/London") == dt.datetime(
        2026, 10, 25, 0, 30, tzinfo=dt.UTC
    )
    with pytest.raises(LocalTimeError, match="does not exist in Europe/London"):
        local_to_utc("2026-03-29T01:30", "Europe/London")
    with pytest.raises(LocalTimeError, match="like 2026-03-27 09:30"):
        local_to_utc("next tuesday", "UTC")
    with pytest.raises(LocalTimeError, match="without a zone"):
        local_to_utc("2026-03-27T09:30+02:00", "UTC")


def test_a_time_the_clocks_skip_is_refused(campaigner):
    response = review(
        campaigner, schedule="later", send_at="2026-03-29T01:30", timezone="Europe/London"
    )
    assert response.status_code == 422
    assert field_error(response.text, "send_at") == (
        "2026-03-29 01:30 does not exist in Europe/London: the clocks go forward then"
    )


def test_sending_later_needs_a_time_in_the_future(campaigner):
    response = review(campaigner, schedule="later", send_at="")
    assert field_error(response.text, "send_at") == "Enter the date and time to send"
    response = review(campaigner, schedule="later", send_at="2025-12-31T23:00")
    assert field_error(response.text, "send_at") == (
        "The send time has passed: choose a later time, or send now"
    )


def test_an_unknown_time_zone_is_refused(campaigner):
    response = review(
        campaigner, schedule="later", send_at="2026-03-27T09:30", timezone="Mars/Base"
    )
    assert response.status_code == 422
    assert field_error(response.text, "timezone") == (
        "There is no time zone Mars/Base: choose one from the list, like Europe/Paris, or UTC"
    )


@pytest.mark.parametrize(
    ("typed", "message"),
    [
        (
            "US/Eastern",
            "US/Eastern is an alias: choose America/New_York instead "
            "(US/Eastern → America/New_York)",
        ),
        ("GB", "GB is an alias: choose Europe/London instead (GB → Europe/London)"),
        (
            "Europe/Amsterdam",
            "Europe/Amsterdam is an alias: choose Europe/Brussels instead "
            "(Europe/Amsterdam → Europe/Brussels)",
        ),
        (
            "Etc/GMT+5",
            "Etc/GMT+5 is not the time zone of a place: choose the place's own zone, "
            "like Europe/Paris, or UTC",
        ),
        ("paris", "There is no time zone paris: did you mean Europe/Paris?"),
    ],
)
def test_an_alias_or_a_name_that_is_no_zone_is_refused_with_the_canonical_name(
    campaigner, engine, typed, message
):
    for action in ("review", "launch"):
        response = campaigner.post(
            "/staff/campaigns/new",
            {
                **form_data(schedule="later", send_at="2026-03-27T09:30", timezone=typed),
                "action": action,
            },
        )
        assert response.status_code == 422
        assert field_error(response.text, "timezone") == message
        assert ("timezone", message) in summary_links(response.text)
        # What was typed stays in the field, to correct.
        assert f'name="timezone" type="text" value="{typed}"' in response.text
    assert campaigns(engine) == 0


def test_deliver_until_must_come_after_the_send_time(campaigner):
    response = review(
        campaigner,
        schedule="later",
        send_at="2026-03-27T09:30",
        timezone="Europe/Paris",
        deliver_until="2026-03-27T09:00",
    )
    assert response.status_code == 422
    assert ("deliver_until", "“Don't deliver after” must be later than the send time") in (
        summary_links(response.text)
    )
    # Sending now: it must be in the future.
    response = review(campaigner, deliver_until="2025-12-31T00:00")
    assert field_error(response.text, "deliver_until").startswith("“Don't deliver after”")
    assert review(campaigner, deliver_until="2026-01-02T00:00").status_code == 200


def test_preview_renders_what_was_typed_without_judging_it(campaigner, engine):
    response = campaigner.post(
        "/staff/campaigns/new",
        {
            **form_data(topic="", title="Flash sale", body="Line one\r\nLine two", url="/sale"),
            "action": "preview",
        },
    )
    assert response.status_code == 200
    html = response.text
    assert "error-summary" not in html
    assert '<p class="notification__title" id="preview-title">Flash sale</p>' in html
    assert '<p class="notification__body" id="preview-body">Line one\nLine two</p>' in html
    assert '<dd id="preview-link">/sale</dd>' in html
    assert re.search(r"\d+ of 3993 bytes", html)
    assert 'value="Flash sale"' in html  # the form keeps its values
    assert campaigns(engine) == 0


def test_the_preview_draws_an_allowed_icon_and_names_a_refused_one(campaigner, catalogue_ready):
    html = campaigner.post(
        "/staff/campaigns/new", {**form_data(icon="/static/icon.png"), "action": "preview"}
    ).text
    assert '<img src="/static/icon.png" alt="" width="48" height="48">' in html
    allow_link_origins(catalogue_ready, "https://cdn.example.com")
    answer = campaigner.post(
        "/staff/campaigns/new",
        {**form_data(icon="https://cdn.example.com/i.png"), "action": "preview"},
    )
    # Drawn from where the notification loads it, which the page's policy allows.
    assert '<img src="https://cdn.example.com/i.png" alt="" width="48" height="48">' in answer.text
    assert "img-src 'self' https://cdn.example.com;" in answer.headers["Content-Security-Policy"]
    refused = campaigner.post(
        "/staff/campaigns/new",
        {**form_data(icon="https://elsewhere.example/i.png"), "action": "preview"},
    )
    assert 'src="https://elsewhere.example' not in refused.text
    assert "icon from elsewhere.example" in refused.text


def test_change_on_the_review_page_brings_the_form_back_filled(campaigner):
    response = campaigner.post(
        "/staff/campaigns/new", {**form_data(title="Keep me", collapse_key="k1"), "action": "edit"}
    )
    assert response.status_code == 200
    assert "<h1>New campaign</h1>" in response.text
    assert 'value="Keep me"' in response.text
    assert 'value="k1"' in response.text
