"""How campaign facts read on the staff pages: plain words, labels, the outcome chart.

No rules here (those are in :mod:`portal.campaigns.services`), only wording and layout,
kept out of the templates so the command line and the JSON endpoint say the same.
"""

from __future__ import annotations

import datetime as dt
import http
import zoneinfo
from collections import defaultdict
from dataclasses import dataclass

from portal.campaigns.models import CircuitState
from portal.campaigns.zones import UTC_ZONE
from portal.config import FrequencyCapSettings
from portal.consent.preferences import Reason
from portal.delivery.models import DeliveryStatus
from portal.delivery.quiet import Window

DELIVERY_LABELS = {
    DeliveryStatus.QUEUED.value: ("Queued", "waiting to be sent, or to be retried"),
    DeliveryStatus.SENDING.value: ("Sending", "handed to a push service, answer pending"),
    DeliveryStatus.ACCEPTED.value: ("Accepted", "the push service took the message"),
    DeliveryStatus.FAILED.value: ("Failed", "refused, or retried until the limit"),
    DeliveryStatus.REVOKED.value: ("Revoked", "the subscription is gone (410)"),
    DeliveryStatus.SKIPPED.value: (
        "Skipped",
        "consent withdrawn, over a frequency cap, subscription ended, cancelled or expired "
        "before sending",
    ),
}

AUDIENCE_LABELS = {
    Reason.EXPLICIT_OPT_IN.value: ("Opted in", "chose this topic themselves"),
    Reason.TRANSACTIONAL_GRANT.value: (
        "Transactional grant",
        "allowed notifications in the browser; this topic is transactional",
    ),
    Reason.DEFAULT_BY_REGION.value: (
        "Region default",
        "have not decided; the topic is on by default where they live",
    ),
}

URGENCIES = {  # RFC 8030 §5.3: what the push service may wait for
    "very-low": ("Very low", "delivered only when the device is on power and Wi-Fi"),
    "low": ("Low", "delivered when the device is on power or its battery is not low"),
    "normal": ("Normal", "most messages"),
    "high": ("High", "time-critical; may wake the device and use battery"),
}


def urgency_text(value: str) -> str:
    """ "Low — delivered when the device is on power or its battery is not low"."""
    label, meaning = URGENCIES.get(value, (value, ""))
    return f"{label} — {meaning}" if meaning else label


_UNITS = (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))


def ttl_in_words(seconds: int) -> str:
    """``86400`` → "1 day"; ``5400`` → "1 hour and 30 minutes"; ``0`` explained."""
    if seconds <= 0:
        return "0 seconds: delivered only if the browser can be reached at once"
    parts = []
    rest = seconds
    for name, size in _UNITS:
        amount, rest = divmod(rest, size)
        if amount:
            parts.append(f"{amount} {name}{'' if amount == 1 else 's'}")
    if len(parts) == 1:
        return parts[0]
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def answer_label(answer: str) -> str:
    """An outcome bucket: an HTTP answer ("201 Created") or a status with no answer."""
    if answer.isdigit():
        try:
            return f"{answer} {http.HTTPStatus(int(answer)).phrase}"
        except ValueError:
            return answer
    status, _, reason = answer.partition(":")
    label = DELIVERY_LABELS.get(status, (status.capitalize(), ""))[0]
    if reason:
        if reason.startswith("subscription_"):
            reason = "subscription_ended"
        return f"{label}: {_NO_ANSWER.get(reason, reason.replace('_', ' '))}"
    return label + " (no answer)"


# Why a delivery without an HTTP answer ended or waits, in a few words: the chart's labels
# have room for about 24 characters (the reasons in full are in the failures table).
_NO_ANSWER = {
    "max_attempts": "gave up, no answer",
    "network_error": "no answer yet",
    "invalid_endpoint": "bad endpoint",
    "payload_too_large": "too large",
    "invalid_request": "bad request",
    "send_error": "send error",
    "deliver_until_passed": "expired",
    "consent_withdrawn": "no consent",
    "frequency_cap": "frequency cap",
    "quiet_hours": "quiet hours",
    "awaiting_winner": "waiting for the A/B winner",
    "subscription_ended": "subscription ended",
    "unreadable_keys": "keys unreadable",
}


def answer_kind(answer: str) -> str:
    """A CSS class for the bar; the text label always says the same, colour is extra."""
    if answer.isdigit():
        code = int(answer)
        if 200 <= code < 300:
            return "ok"
        if code == 410:
            return "gone"
        if code == 429 or code >= 500:
            return "retry"
        return "error"
    status, _, reason = answer.partition(":")
    if status == DeliveryStatus.FAILED.value:
        return "error"
    if status == DeliveryStatus.QUEUED.value and reason not in (
        "",
        "quiet_hours",
        "awaiting_winner",
    ):
        return "retry"
    return "none"


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _day(at: dt.datetime) -> str:
    return f"{_DAYS[at.weekday()]} {at.day} {_MONTHS[at.month - 1]} {at.year}"


def _clock(at: dt.datetime) -> str:
    return f"{at:%H:%M:%S}" if at.second else f"{at:%H:%M}"


def _offset(at: dt.datetime) -> str:
    """ "UTC+01:00", "UTC-03:30" (seconds only where a zone had them)."""
    delta = at.utcoffset() or dt.timedelta(0)
    sign = "-" if delta < dt.timedelta(0) else "+"
    minutes, seconds = divmod(abs(int(delta.total_seconds())), 60)
    text = f"UTC{sign}{minutes // 60:02d}:{minutes % 60:02d}"
    return text + (f":{seconds:02d}" if seconds else "")


@dataclass(frozen=True)
class ZonedTime:
    """An instant as it was chosen, in its zone, and in UTC."""

    iso: str  # "2026-12-08T08:00:00Z": a <time datetime="…">
    local: str  # "Tue 8 Dec 2026, 09:00 Europe/Paris (UTC+01:00)"
    utc: str  # "08:00 UTC", or with its day when the day differs from the local one
    zone: str | None  # None: shown in UTC only
    zone_known: bool  # False: launched before the zone was kept

    @property
    def text(self) -> str:
        return f"{self.local} — {self.utc}" if self.zone else self.utc


def zoned_time(at: dt.datetime, zone: str | None) -> ZonedTime:
    """``at`` in ``zone`` with the zone's offset at that moment, and in UTC:
    "Tue 8 Dec 2026, 09:00 Europe/Paris (UTC+01:00) — 08:00 UTC". ``UTC`` or no zone
    (NULL: a campaign launched before zones were kept) reads "Tue 8 Dec 2026, 08:00 UTC"."""
    utc = at.astimezone(dt.UTC)
    iso = utc.strftime("%Y-%m-%dT%H:%M:%SZ")
    whole_utc = f"{_day(utc)}, {_clock(utc)} UTC"
    tz: dt.tzinfo | None = None
    if zone and zone != UTC_ZONE:
        try:
            tz = zoneinfo.ZoneInfo(zone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            tz = None  # a zone a later database dropped: UTC, truthfully
    if tz is None:
        return ZonedTime(iso, whole_utc, whole_utc, None, zone is not None)
    local = utc.astimezone(tz)
    same_day = local.date() == utc.date()
    return ZonedTime(
        iso,
        f"{_day(local)}, {_clock(local)} {zone} ({_offset(local)})",
        f"{_clock(utc)} UTC" if same_day else whole_utc,
        zone,
        True,
    )


def local_schedule(at: dt.time | None, fallback: str | None) -> str | None:
    """ "At 09:00 in each person's time zone (Europe/London for people whose zone is not
    known)"; None for a campaign that goes to everyone at its send time."""
    if at is None or fallback is None:
        return None
    return (
        f"At {at:%H:%M} in each person's time zone ({fallback} for people whose zone is not known)"
    )


def circuit_sentence(circuit: CircuitState) -> str:
    """ "fcm slowed down until 12:03 UTC — 40 of 50 answers were 429/5xx"."""
    until = circuit.open_until.astimezone(dt.UTC).strftime("%H:%M:%S UTC")
    return f"{circuit.push_service} slowed down until {until} — {circuit.reason}"


@dataclass(frozen=True)
class Bar:
    service: str
    answer: str
    label: str
    kind: str
    count: int
    y: int
    width: float


@dataclass(frozen=True)
class Group:
    service: str
    y: int
    total: int


@dataclass(frozen=True)
class OutcomeChart:
    """Horizontal bars, one per (push service, answer), grouped by push service."""

    groups: list[Group]
    bars: list[Bar]
    height: int
    total: int
    width: int = 640
    label_width: int = 220
    bar_height: int = 24
    max_bar: int = 340

    @property
    def bar_x(self) -> int:
        return self.label_width + 8

    def description(self) -> str:
        if not self.bars:
            return "No answers yet."
        parts = []
        for group in self.groups:
            mine = [b for b in self.bars if b.service == group.service]
            listed = ", ".join(f"{b.count} {b.label}" for b in mine)
            parts.append(f"{group.service}: {listed}")
        return "; ".join(parts) + "."


def outcome_chart(rows: list[tuple[str, str, int]]) -> OutcomeChart:
    """Lay out :func:`~portal.campaigns.services.outcome_by_service` rows as bars."""
    by_service: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for service, answer, count in rows:
        by_service[service].append((answer, count))
    largest = max((count for _, _, count in rows), default=0)
    groups: list[Group] = []
    bars: list[Bar] = []
    y = 0
    chart = OutcomeChart([], [], 0, 0)
    step = chart.bar_height + 6
    for service in sorted(by_service):
        answers = by_service[service]
        groups.append(Group(service, y, sum(count for _, count in answers)))
        y += step  # the group's heading line
        for answer, count in answers:
            width = chart.max_bar * count / largest if largest else 0
            bars.append(
                Bar(
                    service,
                    answer,
                    answer_label(answer),
                    answer_kind(answer),
                    count,
                    y,
                    max(width, 2.0),  # a visible sliver for small counts
                )
            )
            y += step
        y += 8
    return OutcomeChart(groups, bars, max(y, step), sum(c for _, _, c in rows))


# -- per-platform previews ----------------------------------------------------------------


@dataclass(frozen=True)
class Platform:
    """How one browser on one system draws a notification: how many characters of the
    title and the body it shows before it cuts them, whether it shows the large image,
    and how many buttons (and how many characters of their labels). The figures are
    those measured and published by push vendors (docs/campaigns.md, "Per-platform
    preview"); systems change them, so they are a guide, not a promise."""

    key: str
    name: str
    title_max: int
    body_max: int
    shows_image: bool
    max_actions: int
    action_max: int
    actions_note: str = ""


PLATFORMS = (
    Platform("chrome-windows", "Chrome on Windows", 70, 140, True, 2, 19),
    Platform(
        "chrome-macos",
        "Chrome on macOS",
        43,
        88,
        False,
        2,
        19,
        "macOS shows the buttons under Options.",
    ),
    Platform("chrome-android", "Chrome on Android", 30, 65, True, 2, 19),
    Platform("firefox", "Firefox on Windows", 50, 200, False, 0, 0, "Firefox shows no buttons."),
)


@dataclass(frozen=True)
class Cut:
    """A text as a platform shows it: ``shown`` (with "…" when cut) and whether it was."""

    shown: str
    cut: bool
    limit: int
    length: int


def cut(text: str, limit: int) -> Cut:
    """``text`` cut where a platform cuts it: at most ``limit`` characters, the last a
    "…" when the text is longer (line breaks count as a space, as the systems show them)."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return Cut(flat, False, limit, len(flat))
    return Cut(flat[: limit - 1].rstrip() + "…", True, limit, len(flat))


@dataclass(frozen=True)
class PlatformPreview:
    platform: Platform
    title: Cut
    body: Cut
    image: str | None
    actions: list[Cut]
    actions_left_out: int


def platform_previews(
    title: str, body: str, image: str | None, actions: list[str]
) -> list[PlatformPreview]:
    """The notification as each of :data:`PLATFORMS` draws it. ``image`` is only what
    may be drawn (an address the link rule allows), ``actions`` the buttons' labels."""
    shown = []
    for platform in PLATFORMS:
        labels = actions[: platform.max_actions]
        shown.append(
            PlatformPreview(
                platform,
                cut(title or "Your title appears here", platform.title_max),
                cut(body or "Your message appears here", platform.body_max),
                image if platform.shows_image else None,
                [cut(label, platform.action_max) for label in labels],
                len(actions) - len(labels),
            )
        )
    return shown


def frequency_cap_note(caps: FrequencyCapSettings, *, transactional: bool) -> str:
    """What the frequency caps (portal/delivery/caps.py) will do to this campaign, for the
    review page: staff learn before launching that some people may be skipped."""
    if transactional:
        return (
            "A transactional topic: frequency caps never hold it back, and it does not "
            "count towards them."
        )
    limits = [
        f"{n} a {period}" for n, period in ((caps.per_day, "day"), (caps.per_week, "week")) if n
    ]
    if limits:
        return (
            f"Frequency caps apply: at most {' and '.join(limits)} marketing notifications per "
            "person; anyone who has had that many, or who chose at most one a day and had it, "
            "is skipped and counted on the campaign page."
        )
    return (
        "No portal-wide frequency cap is set; people who chose at most one a day and have "
        "had one in the last 24 hours are skipped and counted on the campaign page."
    )


def quiet_hours_note(window: Window | None, *, transactional: bool) -> str:
    """What quiet hours (portal/delivery/quiet.py) will do to this campaign, for the
    review page: staff learn before launching that some deliveries may wait."""
    if transactional:
        return "A transactional topic: quiet hours never hold it back."
    if window is not None:
        return (
            f"Quiet hours apply: a delivery whose turn comes between {window.start:%H:%M} and "
            f"{window.end:%H:%M} where the person is, or inside quiet hours they set "
            "themselves, waits until they end; the campaign page says how many wait."
        )
    return (
        "No portal-wide quiet hours are set; deliveries to people who set their own wait "
        "until those end, and the campaign page says how many wait."
    )
