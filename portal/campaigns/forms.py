"""The campaign form: shape checks here, campaign rules in the services.

The form checks what only a form has — whole seconds, a local date and time that exists
in the chosen zone — and turns it into a :class:`CampaignDraft`; the
rules every campaign obeys (topic, link, payload size, collapse key, a canonical time
zone from :func:`portal.campaigns.zones.check_zone` …) come from
:func:`portal.campaigns.services.validate_draft`, so the form and the command line
refuse the same things with the same words.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
import zoneinfo
from typing import Any

from sqlalchemy.orm import Session
from wtforms import BooleanField, Field, FileField, HiddenField, StringField, TextAreaField

from portal.campaigns import local_time, services
from portal.campaigns.drafts import FIELDS as DRAFT_FIELDS
from portal.campaigns.presentation import URGENCIES
from portal.campaigns.services import CampaignDraft
from portal.campaigns.zones import UTC_ZONE, check_zone
from portal.consent.catalogue import active_topics
from portal.errors import ValidationError
from portal.inputs import CheckedForm
from portal.origins import campaign_link_origins

_SECONDS = re.compile(r"[0-9]{1,9}")


def whole_number(text: str) -> int | None:
    """A whole number as the campaign form and the command line read one (a time to live,
    hours, a share): ASCII digits only ("²".isdigit() is true and int("²") fails;
    "٣٠٠" would be read as 300), at most nine; None otherwise."""
    return int(text) if _SECONDS.fullmatch(text) else None


# What the form and the command line say of a test share or hours that are not a number.
SHARE_UNREAD = "Enter the test share as a whole percentage, like 20"
HOURS_UNREAD = "Enter whole hours, like 4"
SCHEDULE_CHOICES = [("now", "Send now"), ("later", "At a date and time")]
URGENCY_CHOICES = [(value, label) for value, (label, _) in URGENCIES.items()]
# The order fields appear in on the page, which is the order of the error summary: the
# upload sits after the badge, the last of the fields it can fill.
_BEFORE_UPLOAD = DRAFT_FIELDS[: DRAFT_FIELDS.index("badge") + 1]
FIELD_ORDER = (
    *_BEFORE_UPLOAD,
    "upload",
    "upload_as",
    *DRAFT_FIELDS[len(_BEFORE_UPLOAD) :],
    "subscription",
)
# What an uploaded picture can be: the fields its address fills.
UPLOAD_CHOICES = [
    ("image", "The image"),
    ("icon", "The icon"),
    ("badge", "The badge"),
]


class LocalTimeError(ValueError):
    pass


def local_to_utc(text: str, zone: str) -> dt.datetime:
    """``2026-03-27T09:30`` in ``zone`` → an aware UTC datetime.

    A time the clocks skip (spring forward) is refused; a time that happens twice (fall
    back) is taken as the first one, and the review page shows the UTC result.
    """
    try:
        naive = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise LocalTimeError("Enter a date and time, like 2026-03-27 09:30") from None
    if naive.tzinfo is not None:
        raise LocalTimeError("Enter the date and time without a zone; choose the zone below")
    try:
        tz = zoneinfo.ZoneInfo(zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise LocalTimeError("Choose a time zone from the list") from None
    local = naive.replace(tzinfo=tz, fold=0)
    try:
        utc = local.astimezone(dt.UTC)
        back = utc.astimezone(tz).replace(tzinfo=None)
    except OverflowError:  # 9999-12-31 23:00 in New York is in the year 10000 in UTC
        raise LocalTimeError(
            f"{naive.isoformat(' ', 'minutes')} in {zone} is outside the calendar once "
            "converted to UTC: choose an earlier or later time"
        ) from None
    if back != naive:
        raise LocalTimeError(
            f"{naive:%Y-%m-%d %H:%M} does not exist in {zone}: the clocks go forward then"
        )
    return utc


def _strip(value: Any) -> Any:
    return value.strip() if isinstance(value, str) else value


def _text(value: Any) -> Any:
    # Browsers send a textarea's line breaks as CRLF; the notification needs one byte.
    return value.replace("\r\n", "\n").strip() if isinstance(value, str) else value


class CampaignForm(CheckedForm):
    """Every field is a string as typed, so a page re-renders exactly what was sent."""

    topic = StringField("Topic", filters=[_strip])
    title = StringField("Title", filters=[_strip])
    body = TextAreaField("Message", filters=[_text])
    url = StringField("Link (optional)", filters=[_strip])
    icon = StringField("Icon (optional)", filters=[_strip])
    image = StringField("Image (optional)", filters=[_strip])
    badge = StringField("Badge (optional)", filters=[_strip])
    # A picture to keep on this site; its address fills the field upload_as names.
    upload = FileField("Upload a picture (optional)")
    upload_as = StringField("Use the uploaded picture as", default="image", filters=[_strip])
    # What the page says of a picture this request kept (set by the view).
    uploaded: str | None = None
    action1_title = StringField("First button: label (optional)", filters=[_strip])
    action1_url = StringField("First button: link", filters=[_strip])
    action2_title = StringField("Second button: label (optional)", filters=[_strip])
    action2_url = StringField("Second button: link", filters=[_strip])
    # Checkboxes, kept as the string a browser sends ("y") so a page re-renders as sent.
    require_interaction = StringField("Keep it on screen until the person acts", filters=[_strip])
    silent = StringField("Silent: no sound or vibration", filters=[_strip])
    # A/B test: variants B and C (A is the title, message and image above).
    variant_b_title = StringField("Variant B: title", filters=[_strip])
    variant_b_body = TextAreaField("Variant B: message", filters=[_text])
    variant_b_image = StringField("Variant B: image (optional)", filters=[_strip])
    variant_c_title = StringField("Variant C: title", filters=[_strip])
    variant_c_body = TextAreaField("Variant C: message", filters=[_text])
    variant_c_image = StringField("Variant C: image (optional)", filters=[_strip])
    test_share = StringField(
        "Test on this share of the audience first (optional)", filters=[_strip]
    )
    winner_after_hours = StringField("Send the winner to the rest after (hours)", filters=[_strip])
    urgency = StringField("Urgency", default="normal", filters=[_strip])
    ttl = StringField("Time to live, in seconds", default="86400", filters=[_strip])
    collapse_key = StringField("Collapse key (optional)", filters=[_strip])
    schedule = StringField("When to send", default="now", filters=[_strip])
    send_at = StringField("Date and time to send", filters=[_strip])
    timezone = StringField("Time zone", default=UTC_ZONE, filters=[_strip])
    local_time = StringField("At this time in each person's time zone (optional)", filters=[_strip])
    fallback_zone = StringField("Time zone for people whose zone is not known", filters=[_strip])
    deliver_until = StringField("Don't deliver after (optional)", filters=[_strip])
    # Chosen when the review page is shown: the campaign's id, so Launch is idempotent.
    campaign_id = HiddenField()
    # Editing a saved draft: which one, and the version the form was filled from.
    draft_id = HiddenField()
    draft_version = HiddenField()

    def topic_choices(self, session: Session) -> list[tuple[str, str]]:
        choices = [("", "Choose a topic")]
        for topic in active_topics(session):
            kind = "transactional" if topic.is_transactional else "marketing"
            choices.append((topic.slug, f"{topic.label} ({kind}, {topic.category})"))
        return choices

    def ttl_seconds(self) -> int | None:
        return whole_number(self.ttl.data or "")

    def chosen_id(self) -> uuid.UUID | None:
        try:
            return uuid.UUID(self.campaign_id.data or "")
        except ValueError:
            return None

    def draft(self) -> tuple[uuid.UUID, int] | None:
        """The saved draft this form edits and the version it was filled from."""
        try:
            draft_id = uuid.UUID(self.draft_id.data or "")
        except ValueError:
            return None
        version = self.draft_version.data or ""
        return (draft_id, int(version)) if _SECONDS.fullmatch(version) else None

    def typed(self) -> dict[str, str | None]:
        """The fields a draft keeps, as typed."""
        return {name: self[name].data for name in DRAFT_FIELDS}

    def actions(self) -> tuple[tuple[str, str], ...]:
        """The buttons filled in (label and link; either may be missing, which
        :func:`portal.campaigns.services.validate_draft` refuses)."""
        pairs = (
            (self.action1_title.data or "", self.action1_url.data or ""),
            (self.action2_title.data or "", self.action2_url.data or ""),
        )
        if pairs[1] != ("", ""):
            return pairs  # a second button needs a first: an empty first one is refused
        return pairs[:1] if pairs[0] != ("", "") else ()

    def variants(self) -> tuple[tuple[str, str, str | None], ...]:
        """Variants B and C as filled in: B alone, B and C, or a C without a B (which
        :func:`portal.campaigns.services.validate_draft` refuses on B's fields)."""
        found = tuple(
            (
                self[f"variant_{letter}_title"].data or "",
                self[f"variant_{letter}_body"].data or "",
                self[f"variant_{letter}_image"].data or None,
            )
            for letter in "bc"
        )
        if found[1] != ("", "", None):
            return found
        return found[:1] if found[0] != ("", "", None) else ()


class TestSendForm(CampaignForm):
    """The draft again (hidden fields), plus which of the sender's subscriptions."""

    subscription = StringField("Subscription", filters=[_strip])

    def subscription_id(self) -> uuid.UUID | None:
        try:
            return uuid.UUID(self.subscription.data or "")
        except ValueError:
            return None


class CancelForm(CheckedForm):
    confirm = BooleanField("Yes, cancel this campaign")


def _error(field: Field, message: str) -> None:
    if not field.errors:
        field.errors = [message]


def _times(form: CampaignForm) -> tuple[dt.datetime | None, dt.datetime | None]:
    """The send time and the "don't deliver after" time in UTC, as far as they read."""
    zone = form.timezone.data or UTC_ZONE
    try:
        check_zone(zone)  # the rule validate_draft applies again, for every caller
    except ValidationError as problem:
        _error(form.timezone, problem.message)
    send_at: dt.datetime | None = None
    deliver_until: dt.datetime | None = None
    if form.schedule.data not in {"now", "later"}:
        _error(form.schedule, "Choose when to send")
    elif form.schedule.data == "later":
        if not form.send_at.data:
            _error(form.send_at, "Enter the date and time to send")
        elif not form.timezone.errors:
            try:
                send_at = local_to_utc(form.send_at.data, zone)
            except LocalTimeError as problem:
                _error(form.send_at, str(problem))
    if form.deliver_until.data and not form.timezone.errors:
        try:
            deliver_until = local_to_utc(form.deliver_until.data, zone)
        except LocalTimeError as problem:
            _error(form.deliver_until, str(problem))
    return send_at, deliver_until


def _whole(field: Field, refusal: str) -> int | None:
    """A whole number typed in ``field``: None when empty, or (with the field's error)
    when it is not ASCII digits."""
    text = field.data or ""
    if not text:
        return None
    value = whole_number(text)
    if value is None:
        _error(field, refusal)
    return value


def _local_time(form: CampaignForm) -> dt.time | None:
    """The time of day for local-time delivery, when one is asked for and reads."""
    text = form.local_time.data or ""
    if not text:
        return None
    at = local_time.parse_local_time(text)
    if at is None:
        _error(form.local_time, "Enter the time as hours and minutes, like 09:00")
    return at


def check(form: CampaignForm, session: Session, *, now: dt.datetime) -> CampaignDraft | None:
    """Every problem with the submitted form as field errors; the draft when there are none."""
    # CSRFProtect checked the token before the view ran; the fields have no validators
    # of their own, so every message below comes from one place, in page order.
    for field in form:
        field.errors = []
    form.check_text()  # first, so a field with a control character says so
    form.campaign_id.errors = []  # hidden: chosen_id() ignores what is not a UUID
    form.draft_id.errors = form.draft_version.errors = []  # hidden, likewise (draft())
    ttl = form.ttl_seconds()
    if ttl is None:
        _error(form.ttl, "Enter the time to live as a whole number of seconds, like 86400")
    send_at, deliver_until = _times(form)
    draft = CampaignDraft(
        topic=form.topic.data or "",
        title=form.title.data or "",
        body=form.body.data or "",
        url=form.url.data or None,
        icon=form.icon.data or None,
        urgency=form.urgency.data or "",
        ttl=ttl if ttl is not None else 0,
        collapse_key=form.collapse_key.data or None,
        send_at=send_at,
        deliver_until=deliver_until,
        time_zone=form.timezone.data or UTC_ZONE,
        image=form.image.data or None,
        badge=form.badge.data or None,
        actions=form.actions(),
        require_interaction=bool(form.require_interaction.data),
        silent=bool(form.silent.data),
        local_time=_local_time(form),
        fallback_zone=form.fallback_zone.data or None,
        variants=form.variants(),
        test_share=_whole(form.test_share, SHARE_UNREAD),
        winner_after_hours=_whole(form.winner_after_hours, HOURS_UNREAD),
    )
    time_unclear = bool(form.send_at.errors or form.schedule.errors)
    for problem in services.validate_draft(
        session, draft, now=now, link_origins=campaign_link_origins()
    ):
        field = getattr(form, problem.field or "", None)
        if field is None:
            continue
        if field is form.deliver_until and time_unclear:
            continue  # compared with a send time we could not read: say nothing yet
        _error(field, problem.message[:1].upper() + problem.message[1:])
    if any(field.errors for field in form):
        return None
    return draft
