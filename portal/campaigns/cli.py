"""``flask --app app portal campaign create …`` and ``portal campaign list``."""

from __future__ import annotations

import datetime as dt
import sys

import click
from flask.cli import AppGroup

from portal.campaigns import outcome, services
from portal.campaigns.actions import LAUNCHED
from portal.campaigns.services import CampaignDraft
from portal.consent.catalogue import topic_by_slug
from portal.consent.recipients import audience_breakdown
from portal.db import db
from portal.errors import ApiError, ValidationError
from portal.origins import campaign_link_origins
from portal.seams import current_portal
from portal.staff import audit

campaign_cli = AppGroup("campaign", help="Campaigns: create and launch, list.")
CREATED_BY = "command line"


def _now() -> dt.datetime:
    return current_portal().clock.now()


def _fail(problems: list[ApiError]) -> None:
    for problem in problems:
        click.echo(f"error: {problem.field or 'campaign'}: {problem.message}", err=True)
    sys.exit(1)


def _instant(text: str | None, field: str, problems: list[ApiError]) -> dt.datetime | None:
    if not text:
        return None
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        problems.append(
            ValidationError("invalid_value", "not an ISO 8601 time, like 2026-03-27T09:30Z", field)
        )
        return None
    if value.tzinfo is None:
        problems.append(
            ValidationError(
                "invalid_value",
                "give a time zone, like 2026-03-27T09:30:00+01:00 or 2026-03-27T08:30Z",
                field,
            )
        )
        return None
    try:
        return value.astimezone(dt.UTC)
    except OverflowError:  # 9999-12-31T23:00-05:00 is in the year 10000 in UTC
        problems.append(
            ValidationError("invalid_value", "the time is outside the calendar in UTC", field)
        )
        return None


@campaign_cli.command("create")
@click.option("--topic", required=True, help="The topic's slug.")
@click.option("--title", required=True)
@click.option("--body", required=True)
@click.option(
    "--url", help="Opened on click: a path or address on this site, or on CAMPAIGN_LINK_ORIGINS."
)
@click.option("--icon", help="An image: a path on this site, or on CAMPAIGN_LINK_ORIGINS.")
@click.option("--ttl", default="86400", show_default=True, help="Time to live, in seconds.")
@click.option(
    "--urgency", default="normal", show_default=True, help="very-low, low, normal or high."
)
@click.option("--collapse-key", help="Replaces an undelivered message with the same key.")
@click.option("--send-at", help="ISO 8601 with a zone (default: now).")
@click.option("--deliver-until", help="ISO 8601 with a zone: drop what is undelivered then.")
def campaign_create(
    topic: str,
    title: str,
    body: str,
    url: str | None,
    icon: str | None,
    ttl: str,
    urgency: str,
    collapse_key: str | None,
    send_at: str | None,
    deliver_until: str | None,
) -> None:
    """Create and launch a campaign; prints its id. Every problem is printed, exit 1."""
    problems: list[ApiError] = []
    seconds = int(ttl) if ttl.strip().isdigit() else None
    if seconds is None:
        problems.append(ValidationError("invalid_value", "a whole number of seconds", "ttl"))
    draft = CampaignDraft(
        topic=topic,
        title=title,
        body=body,
        url=url or None,
        icon=icon or None,
        urgency=urgency,
        ttl=seconds if seconds is not None else 86400,
        collapse_key=collapse_key or None,
        send_at=_instant(send_at, "send_at", problems),
        deliver_until=_instant(deliver_until, "deliver_until", problems),
    )
    now = _now()
    with db.begin() as session:
        links = campaign_link_origins()  # the form's rule: one function for both doors
        problems += services.validate_draft(session, draft, now=now, link_origins=links)
        if problems:
            _fail(problems)
        audience = audience_breakdown(session, topic_by_slug(session, topic).id)
        campaign = services.create_campaign(
            session, draft, created_by=CREATED_BY, now=now, link_origins=links
        )
        audit.record(
            session,
            audit.command_line_actor(),
            LAUNCHED,
            f"campaign:{campaign.id}",
            {
                "via": "cli",
                "topic": topic,
                "title": campaign.title,
                "sendAt": campaign.send_at.isoformat(),
                "audience": sum(audience.values()),
                "byReason": audience,
            },
        )
        campaign_id, when = campaign.id, campaign.send_at
    click.echo(str(campaign_id))
    click.echo(
        f"launched: {sum(audience.values())} subscriptions allowed now; "
        f"sends {'now' if when <= now else f'at {when:%Y-%m-%d %H:%M} UTC'}",
        err=True,
    )


@campaign_cli.command("list")
@click.option("--tests", is_flag=True, help="Include test sends.")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 1000))
def campaign_list(tests: bool, limit: int) -> None:
    """Campaigns, newest first: id, status, send time, deliveries done of total, title."""
    now = _now()
    every = current_portal().settings.schedule.dispatch
    with db.begin() as session:
        page = services.list_campaigns(session, include_tests=tests, limit=limit)
        if not page.rows:
            click.echo("no campaigns")
            return
        for row in page.rows:
            c = row.campaign
            done = row.total - row.counts["queued"] - row.counts["sending"]
            test = " [test]" if c.is_test else ""
            # The status the campaign pages give it (a failed campaign is no "completed").
            said = outcome.from_counts(c, row.counts, now=now, dispatch_every=every)
            click.echo(
                f"{c.id}  {said.label.lower():17}  {c.send_at:%Y-%m-%d %H:%M}Z  "
                f"{row.topic.slug}  {done}/{row.total} done "
                f"(accepted {row.counts['accepted']}, failed {row.counts['failed']})  "
                f"{c.title}{test}"
            )


def register(portal_cli: AppGroup) -> None:
    portal_cli.add_command(campaign_cli)
