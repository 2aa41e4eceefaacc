"""``flask --app app portal campaign create …`` and ``portal campaign list``."""

from __future__ import annotations

import datetime as dt
import sys
import uuid
import zoneinfo
from pathlib import Path

import click
from flask.cli import AppGroup

from portal.campaigns import drafts, media, outcome, services
from portal.campaigns.actions import CLONED, DRAFT_SAVED, LAUNCHED, PICTURE_UPLOADED
from portal.campaigns.forms import (
    HOURS_UNREAD,
    SHARE_UNREAD,
    LocalTimeError,
    local_to_utc,
    whole_number,
)
from portal.campaigns.local_time import parse_local_time
from portal.campaigns.presentation import local_schedule, zoned_time
from portal.campaigns.services import CampaignDraft
from portal.campaigns.zones import UTC_ZONE, zone_names
from portal.consent.catalogue import topic_by_slug
from portal.consent.recipients import audience_breakdown
from portal.db import db
from portal.errors import ApiError, ValidationError
from portal.origins import campaign_link_origins
from portal.seams import current_portal
from portal.staff import audit

campaign_cli = AppGroup("campaign", help="Campaigns: create and launch, drafts, clone, list.")
CREATED_BY = "command line"


def _now() -> dt.datetime:
    return current_portal().clock.now()


_OPTIONS = {  # a draft's field → the option that sets it
    "timezone": "zone",
    "local_time": "local-time",
    "test_share": "test-share",
    "winner_after_hours": "winner-after",
    **{
        f"variant_{letter}_{part}": "variant"
        for letter in "bc"
        for part in ("title", "body", "image")
    },
    "fallback_zone": "fallback-zone",
    "action1_title": "action",
    "action1_url": "action",
    "action2_title": "action",
    "action2_url": "action",
}


def _fail(problems: list[ApiError]) -> None:
    for problem in problems:
        field = _OPTIONS.get(problem.field or "", problem.field or "campaign")
        click.echo(f"error: {field}: {problem.message}", err=True)
    sys.exit(1)


def _whole_option(
    given: str | None, expected: str, field: str, problems: list[ApiError]
) -> int | None:
    """An option's whole number read as the campaign form reads it (ASCII digits only)."""
    if given is None:
        return None
    number = whole_number(given.strip())
    if number is None:
        problems.append(ValidationError("invalid_value", expected, field))
    return number


def _unread_aside(read: list[ApiError], checked: list[ValidationError]) -> list[ValidationError]:
    """The rules' problems with the options that could not be read left out: an option
    says one thing, as the form's field does (its first error)."""
    unread = {problem.field for problem in read}
    return [problem for problem in checked if problem.field not in unread]


def _instant(
    text: str | None, field: str, problems: list[ApiError], zone: str | None
) -> dt.datetime | None:
    """An ISO 8601 time with an offset; without one, a local time in ``zone`` (``--zone``,
    when given)."""
    if not text:
        return None
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        problems.append(
            ValidationError("invalid_value", "not an ISO 8601 time, like 2026-03-27T09:30Z", field)
        )
        return None
    if value.tzinfo is None and zone is not None:
        if zone not in zone_names():
            return None  # not read in a zone refused: the zone's problem is the one to say
        try:
            return local_to_utc(text, zone)
        except LocalTimeError as problem:
            problems.append(ValidationError("invalid_value", str(problem), field))
            return None
    if value.tzinfo is None:
        problems.append(
            ValidationError(
                "invalid_value",
                "give a time zone, like 2026-03-27T09:30:00+01:00 or 2026-03-27T08:30Z, or --zone",
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
@click.option(
    "--send-at", help="ISO 8601 with an offset, or a local time in --zone (default: now)."
)
@click.option("--deliver-until", help="Like --send-at: drop what is undelivered then.")
@click.option(
    "--zone",
    help="The IANA zone the times are chosen in, like Europe/Paris (canonical names only): "
    "the campaign pages show them in it, and in UTC. Default: UTC, and the times need an "
    "offset.",
)
@click.option(
    "--local-time",
    metavar="HH:MM",
    help="Send to each person at this time in their own time zone: the first time their "
    "clocks show it at or after the send time, so within about a day.",
)
@click.option(
    "--fallback-zone",
    metavar="ZONE",
    help="With --local-time: the zone for people whose browser did not report one "
    "(default: --zone, or UTC).",
)
@click.option(
    "--image", help="A large image: the --icon rule (a path here, or CAMPAIGN_LINK_ORIGINS)."
)
@click.option("--badge", help="A small one-colour image for Android's status bar: the --icon rule.")
@click.option(
    "--action",
    "actions",
    multiple=True,
    metavar="LABEL=URL",
    help="A button: its label, '=', and the link it opens (the --url rule). At most two.",
)
@click.option(
    "--variant",
    "variant_texts",
    multiple=True,
    metavar="TITLE|BODY",
    help="An A/B test: another version of the title and message, split at the first '|' "
    "(--title and --body are variant A). At most two: B and C.",
)
@click.option(
    "--test-share",
    metavar="PERCENT",
    help="With --variant: test on this share of the audience first; the rest get the winner.",
)
@click.option(
    "--winner-after",
    metavar="HOURS",
    help="With --test-share: send the variant with the best click-through rate to the rest "
    "this many hours after the send time.",
)
@click.option("--require-interaction", is_flag=True, help="Keep it on screen until acted on.")
@click.option("--silent", is_flag=True, help="No sound or vibration.")
@click.option(
    "--draft",
    is_flag=True,
    help="Save it as a draft instead of launching: nothing is sent; the campaign pages "
    "open it to change, review and launch. Prints the draft's id.",
)
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
    zone: str | None,
    local_time: str | None,
    fallback_zone: str | None,
    image: str | None,
    badge: str | None,
    actions: tuple[str, ...],
    variant_texts: tuple[str, ...],
    test_share: str | None,
    winner_after: str | None,
    require_interaction: bool,
    silent: bool,
    draft: bool,
) -> None:
    """Create and launch a campaign (or save a draft, --draft); prints its id. Every
    problem is printed, exit 1."""
    problems: list[ApiError] = []
    buttons: list[tuple[str, str]] = []
    for given in actions:
        label, equals, link = given.partition("=")
        if not equals:
            problems.append(
                ValidationError("invalid_value", f"{given!r} is not LABEL=URL", "action1_title")
            )
        buttons.append((label.strip(), link.strip()))
    others: list[tuple[str, str, str | None]] = []
    for given in variant_texts:
        text, bar, message = given.partition("|")
        if not bar:
            problems.append(
                ValidationError("invalid_value", f"{given!r} is not TITLE|BODY", "variant_b_title")
            )
        others.append((text.strip(), message.strip(), None))
    seconds = whole_number(ttl.strip())
    if seconds is None:
        problems.append(ValidationError("invalid_value", "a whole number of seconds", "ttl"))
    # The form's reading of whole numbers; validate_draft checks their ranges for both.
    share = _whole_option(test_share, SHARE_UNREAD, "test_share", problems)
    hours = _whole_option(winner_after, HOURS_UNREAD, "winner_after_hours", problems)
    at = parse_local_time(local_time) if local_time else None
    if local_time and at is None:
        problems.append(
            ValidationError("invalid_value", "the time as HH:MM, like 09:00", "local_time")
        )
    candidate = CampaignDraft(
        topic=topic,
        title=title,
        body=body,
        url=url or None,
        icon=icon or None,
        urgency=urgency,
        ttl=seconds if seconds is not None else 86400,
        collapse_key=collapse_key or None,
        send_at=_instant(send_at, "send_at", problems, zone),
        deliver_until=_instant(deliver_until, "deliver_until", problems, zone),
        time_zone=UTC_ZONE if zone is None else zone,  # validate_draft checks it, as the form's
        image=image or None,
        badge=badge or None,
        actions=tuple(buttons),
        require_interaction=require_interaction,
        silent=silent,
        local_time=at,
        fallback_zone=fallback_zone or None,
        variants=tuple(others),
        test_share=share,
        winner_after_hours=hours,
    )
    now = _now()
    if draft:
        _save_draft(candidate, problems, now=now, ttl=ttl)
        return
    with db.begin() as session:
        links = campaign_link_origins()  # the form's rule: one function for both doors
        problems += _unread_aside(
            problems, services.validate_draft(session, candidate, now=now, link_origins=links)
        )
        if problems:
            _fail(problems)
        audience = audience_breakdown(session, topic_by_slug(session, topic).id)
        campaign = services.create_campaign(
            session, candidate, created_by=CREATED_BY, now=now, link_origins=links
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
        campaign_id, when = campaign.id, zoned_time(campaign.send_at, campaign.time_zone)
        sends_now = campaign.send_at <= now
        local = local_schedule(campaign.local_time, campaign.fallback_zone)
    click.echo(str(campaign_id))
    sends = "now" if sends_now else f"on {when.text}"
    if local:
        sends = f"{local[:1].lower()}{local[1:]}, from {'now' if sends_now else when.text}"
    click.echo(
        f"launched: {sum(audience.values())} subscriptions allowed now; sends {sends}", err=True
    )


def _local(at: dt.datetime | None, zone: str) -> str:
    """A UTC time as the form's field shows it: local, in ``zone``, to the minute."""
    if at is None:
        return ""
    return at.astimezone(zoneinfo.ZoneInfo(zone)).strftime("%Y-%m-%dT%H:%M")


def _save_draft(
    candidate: CampaignDraft, problems: list[ApiError], *, now: dt.datetime, ttl: str
) -> None:
    """``create --draft``: the campaign's rules except the ones a draft may break until
    it is launched (a send time that passes meanwhile is checked at launch)."""
    with db.begin() as session:
        links = campaign_link_origins()
        problems += [
            p
            for p in _unread_aside(
                problems, services.validate_draft(session, candidate, now=now, link_origins=links)
            )
            if p.code != "in_the_past"
        ]
        if problems:
            _fail(problems)
        zone = candidate.time_zone
        pairs = list(candidate.actions) + [("", "")] * (2 - len(candidate.actions))
        fields: dict[str, str | None] = {
            "topic": candidate.topic,
            "title": candidate.title,
            "body": candidate.body,
            "url": candidate.url,
            "icon": candidate.icon,
            "image": candidate.image,
            "badge": candidate.badge,
            "action1_title": pairs[0][0],
            "action1_url": pairs[0][1],
            "action2_title": pairs[1][0],
            "action2_url": pairs[1][1],
            "require_interaction": "y" if candidate.require_interaction else "",
            "silent": "y" if candidate.silent else "",
            **drafts.variant_fields(services.variants_of(candidate)),
            "test_share": str(candidate.test_share or ""),
            "winner_after_hours": str(candidate.winner_after_hours or ""),
            "urgency": candidate.urgency,
            "ttl": ttl.strip(),
            "collapse_key": candidate.collapse_key,
            "schedule": "later" if candidate.send_at else "now",
            "send_at": _local(candidate.send_at, zone),
            "timezone": zone,
            "local_time": candidate.local_time.strftime("%H:%M") if candidate.local_time else "",
            "fallback_zone": candidate.fallback_zone or "",
            "deliver_until": _local(candidate.deliver_until, zone),
        }
        saved = drafts.create(session, fields, by=CREATED_BY, now=now)
        audit.record(
            session,
            audit.command_line_actor(),
            DRAFT_SAVED,
            f"draft:{saved.id}",
            {"via": "cli", "title": saved.title, "topic": candidate.topic, "version": 1},
        )
        draft_id = saved.id
    click.echo(str(draft_id))
    click.echo("saved as a draft: nothing is sent until it is reviewed and launched", err=True)


@campaign_cli.command("clone")
@click.argument("campaign_id", type=click.UUID)
def campaign_clone(campaign_id: uuid.UUID) -> None:
    """A new draft with a campaign's content (any campaign); prints the draft's id."""
    now = _now()
    with db.begin() as session:
        try:
            saved = drafts.clone(session, campaign_id, by=CREATED_BY, now=now)
        except ApiError as problem:
            _fail([problem])
        audit.record(
            session,
            audit.command_line_actor(),
            CLONED,
            f"draft:{saved.id}",
            {"via": "cli", "from": f"campaign:{campaign_id}", "title": saved.title},
        )
        draft_id = saved.id
    click.echo(str(draft_id))
    click.echo(f"cloned {campaign_id} into a draft: nothing is sent until it is launched", err=True)


@campaign_cli.command("upload-picture")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, readable=True))
def campaign_upload_picture(path: str) -> None:
    """Keep a picture on this site (PNG, JPEG, GIF or WebP) for a campaign's --icon,
    --image or --badge; prints its address, a path on this site."""
    with db.begin() as session:
        try:
            media.check_size(Path(path).stat().st_size)  # before reading a file of any size
            picture = media.store(session, Path(path).read_bytes(), uploaded_by=None, now=_now())
        except ApiError as problem:
            click.echo(f"error: {path}: {problem.message}", err=True)
            sys.exit(1)
        address = media.path_of(picture)
        audit.record(
            session,
            audit.command_line_actor(),
            PICTURE_UPLOADED,
            f"picture:{picture.sha256}",
            media.audit_detail(picture, via="cli"),
        )
        width, height = picture.width, picture.height
    click.echo(address)
    click.echo(f"kept: {width} × {height} pixels; give it as --image, --icon or --badge", err=True)


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
