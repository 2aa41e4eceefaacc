"""``portal campaign create`` and ``portal campaign list``."""

from __future__ import annotations

import datetime as dt
import re
import uuid

import sqlalchemy as sa

from portal.campaigns.models import Campaign
from portal.db import db
from portal.delivery.models import Delivery
from portal.seams import current_portal
from portal.staff.models import StaffAudit


def run(app, *args):
    return app.test_cli_runner().invoke(args=["portal", "campaign", *args])


def campaigns(app):
    with db.begin(app) as session:
        found = session.scalars(sa.select(Campaign).order_by(Campaign.created_at)).all()
        session.expunge_all()
        return found


def test_create_prints_the_id_of_a_launched_campaign(catalogue_ready, clock):
    app = catalogue_ready
    result = run(
        app,
        "create",
        "--topic",
        "weekly-digest",
        "--title",
        "Monday digest",
        "--body",
        "Five things",
        "--url",
        "/news",
        "--ttl",
        "600",
        "--urgency",
        "high",
        "--collapse-key",
        "digest",
        "--send-at",
        "2026-01-02T10:00:00+01:00",
    )
    assert result.exit_code == 0, result.output
    printed = uuid.UUID(result.stdout.strip())  # only the id on standard output
    (campaign,) = campaigns(app)
    assert campaign.id == printed
    assert (campaign.title, campaign.body, campaign.url) == (
        "Monday digest",
        "Five things",
        "/news",
    )
    assert (campaign.ttl, campaign.urgency, campaign.collapse_key) == (600, "high", "digest")
    assert campaign.send_at == dt.datetime(2026, 1, 2, 9, 0, tzinfo=dt.UTC)
    assert (campaign.status, campaign.created_by) == ("scheduled", "command line")
    assert "launched: 0 subscriptions allowed now; sends on Fri 2 Jan 2026, 09:00 UTC" in (
        result.stderr
    )
    assert campaign.time_zone == "UTC"  # no --zone: chosen with an offset, shown in UTC
    with db.begin(app) as session:
        (row,) = session.scalars(
            sa.select(StaffAudit).where(StaffAudit.action == "campaign.launched")
        ).all()
        assert row.actor_id is None
        assert row.target == f"campaign:{printed}"
        assert row.detail["via"] == "cli"


def test_create_defaults_to_now_and_one_day(catalogue_ready, clock):
    result = run(catalogue_ready, "create", "--topic", "offers", "--title", "T", "--body", "B")
    assert result.exit_code == 0, result.output
    (campaign,) = campaigns(catalogue_ready)
    assert (campaign.ttl, campaign.urgency, campaign.send_at) == (86400, "normal", clock.now())
    assert "sends now" in result.stderr


def test_bad_input_prints_each_field_and_exits_1(catalogue_ready):
    result = run(
        catalogue_ready,
        "create",
        "--topic",
        "no-such-topic",
        "--title",
        "T",
        "--body",
        "x" * 4000,
        "--url",
        "javascript:alert(1)",
        "--ttl",
        "a day",
        "--urgency",
        "asap",
        "--collapse-key",
        "not valid",
    )
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert "error: ttl: a whole number of seconds" in lines
    assert "error: topic: Choose an active topic" in lines
    assert "error: url: a link is an https:// URL or a path on this site" in lines
    assert "error: urgency: Choose an urgency" in lines
    assert (
        "error: collapse_key: The collapse key is at most 32 letters, digits, '-' or '_'" in lines
    )
    assert any(
        re.fullmatch(r"error: body: The message is \d+ bytes; it must be at most 3993 .*", line)
        for line in lines
    )
    assert campaigns(catalogue_ready) == []


def test_a_send_time_needs_a_zone(catalogue_ready):
    for value, message in (
        ("2026-01-02T10:00", "give a time zone"),
        ("tomorrow", "not an ISO 8601 time"),
    ):
        result = run(
            catalogue_ready,
            "create",
            "--topic",
            "offers",
            "--title",
            "T",
            "--body",
            "B",
            "--send-at",
            value,
        )
        assert result.exit_code == 1
        assert f"error: send_at: {message}" in result.stderr
    assert campaigns(catalogue_ready) == []


def test_deliver_until_before_the_send_time_is_refused(catalogue_ready):
    result = run(
        catalogue_ready,
        *("create", "--topic", "offers", "--title", "T", "--body", "B"),
        *("--send-at", "2026-01-02T10:00Z", "--deliver-until", "2026-01-02T09:00Z"),
    )
    assert result.exit_code == 1
    assert "error: deliver_until: “Don't deliver after” must be later" in result.stderr


def test_list_shows_campaigns_newest_first(catalogue_ready, clock):
    assert run(catalogue_ready, "list").stdout == "no campaigns\n"
    for title in ("First", "Second"):
        run(catalogue_ready, "create", "--topic", "offers", "--title", title, "--body", "B")
        clock.advance(minutes=1)
    lines = run(catalogue_ready, "list").stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("Second")
    assert "  starting  " in lines[0]  # due: the dispatcher has not run yet
    assert "offers  0/0 done" in lines[1]


def test_list_names_a_campaign_whose_deliveries_failed_a_failure(catalogue_ready, clock):
    run(catalogue_ready, "create", "--topic", "offers", "--title", "Gone", "--body", "B")
    with db.begin(catalogue_ready) as session:
        campaign = session.scalars(sa.select(Campaign)).one()
        campaign.status, campaign.materialised_at = "completed", clock.now()
        for _ in range(2):
            session.add(
                Delivery(
                    campaign_id=campaign.id,
                    subscription_id=uuid.uuid4(),
                    push_service="fcm",
                    status="failed",
                    reason="max_attempts",
                    next_attempt_at=clock.now(),
                    consent_reason="explicit_opt_in",
                    updated_at=clock.now(),
                )
            )
    (line,) = run(catalogue_ready, "list").stdout.splitlines()
    assert "  failed  " in line
    assert "completed" not in line
    assert "2/2 done (accepted 0, failed 2)" in line


def _allow(app, *origins: str, public_url: str | None = None) -> None:
    changed = current_portal(app).settings.with_overrides(
        campaign_link_origins=origins, public_url=public_url
    )
    current_portal(app).settings = changed


def _create(app, url: str, *more: str):
    return run(
        app, "create", "--topic", "offers", "--title", "T", "--body", "B", "--url", url, *more
    )


def test_create_refuses_a_link_to_another_site_as_the_form_does(catalogue_ready):
    for url in ("https://elsewhere.example/offer", "http://localhost/news"):
        result = _create(catalogue_ready, url)
        assert result.exit_code == 1, url
        assert "error: url: Links may lead only to this site" in result.stderr.splitlines()
    icon = _create(catalogue_ready, "/news", "--icon", "https://cdn.example/i.png")
    assert icon.exit_code == 1
    assert "error: icon: Links may lead only to this site" in icon.stderr.splitlines()
    assert campaigns(catalogue_ready) == []


def test_create_accepts_this_site_and_the_sites_allowed_for_campaigns(catalogue_ready):
    app = catalogue_ready
    # Outside a request, "this site" is PUBLIC_URL (the development server's address
    # without it).
    assert _create(app, "http://127.0.0.1:5000/news").exit_code == 0
    _allow(app, "https://shop.example", public_url="https://portal.example")
    for url in ("https://portal.example/news", "https://shop.example/sale"):
        result = _create(app, url)
        assert result.exit_code == 0, result.output
    refused = _create(app, "http://127.0.0.1:5000/news")
    assert refused.exit_code == 1
    assert (
        "error: url: Links may lead only to this site or to https://shop.example"
        in refused.stderr.splitlines()
    )
    assert [c.url for c in campaigns(app)] == [
        "http://127.0.0.1:5000/news",
        "https://portal.example/news",
        "https://shop.example/sale",
    ]


def _create_zoned(app, *extra):
    return run(app, "create", "--topic", "offers", "--title", "T", "--body", "B", *extra)


def test_zone_gives_the_local_times_their_zone_and_is_kept(catalogue_ready):
    # 8 December 2026, 09:00 in Paris is 08:00 UTC; the zone is kept to show it as chosen.
    result = _create_zoned(
        catalogue_ready,
        "--zone",
        "Europe/Paris",
        "--send-at",
        "2026-12-08T09:00",
        "--deliver-until",
        "2026-12-08T18:00",
    )
    assert result.exit_code == 0, result.output
    (campaign,) = campaigns(catalogue_ready)
    assert campaign.send_at == dt.datetime(2026, 12, 8, 8, 0, tzinfo=dt.UTC)
    assert campaign.deliver_until == dt.datetime(2026, 12, 8, 17, 0, tzinfo=dt.UTC)
    assert campaign.time_zone == "Europe/Paris"
    assert "sends on Tue 8 Dec 2026, 09:00 Europe/Paris (UTC+01:00) — 08:00 UTC" in (result.stderr)
    # A time with an offset is taken as given, and shown in the zone named.
    result = _create_zoned(
        catalogue_ready, "--zone", "America/New_York", "--send-at", "2026-07-01T13:00Z"
    )
    assert result.exit_code == 0, result.output
    assert "sends on Wed 1 Jul 2026, 09:00 America/New_York (UTC-04:00) — 13:00 UTC" in (
        result.stderr
    )


def test_an_alias_or_unknown_zone_is_refused_as_the_form_refuses_it(catalogue_ready):
    for zone, message in (
        (
            "US/Eastern",
            "US/Eastern is an alias: choose America/New_York instead "
            "(US/Eastern → America/New_York)",
        ),
        (
            "Etc/GMT+5",
            "Etc/GMT+5 is not the time zone of a place: choose the place's own zone, "
            "like Europe/Paris, or UTC",
        ),
        ("Mars/Base", "There is no time zone Mars/Base: choose one from the list"),
    ):
        result = _create_zoned(catalogue_ready, "--zone", zone, "--send-at", "2026-12-08T09:00")
        assert result.exit_code == 1
        assert f"error: zone: {message}" in result.stderr
        # The local time is not read in a zone that was refused: one problem, the zone's.
        assert result.stderr.count("error:") == 1, result.stderr
    assert campaigns(catalogue_ready) == []
