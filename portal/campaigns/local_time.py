"""Local-time delivery: a campaign sent "at 09:00 in each person's time zone".

The rule (:func:`local_due`): a person's delivery is due at the first moment, at or after
the campaign's send time, when the clocks of their zone show the chosen time. A campaign
launched at 10:00 UTC for 09:00 therefore reaches Tokyo (already past 09:00) the next
morning and New York the same day: each zone once, within about a day of the send time.

The zone is the one the person's browser reported (``subscriber.time_zone``); people
whose browser said nothing get the campaign's fallback zone, and a stored zone this
process's time-zone database no longer knows is treated the same way.

Clock changes follow java.time and Python's zoneinfo: a chosen time the clocks skip
(02:30 on a spring-forward night) goes as long after the jump as it was after the gap's
start (03:30), and a time that happens twice (autumn) goes at its first occurrence.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections import Counter
from collections.abc import Iterable

from portal.campaigns.zones import zone_names
from portal.clock import zone_info

_HH_MM = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])")


def parse_local_time(text: str) -> dt.time | None:
    """``"09:00"`` → 09:00; None unless it is a 24-hour HH:MM (a browser's ``type=time``
    field sends exactly that)."""
    match = _HH_MM.fullmatch(text.strip())
    return dt.time(int(match.group(1)), int(match.group(2))) if match else None


def shown(at: dt.time) -> str:
    return at.strftime("%H:%M")


def local_due(start: dt.datetime, at: dt.time, zone: str) -> dt.datetime | None:
    """The first moment at or after ``start`` (aware) when it is ``at`` in ``zone``, in
    UTC; None when this process's time-zone database has no ``zone``."""
    tz = zone_info(zone)
    if tz is None:
        return None
    day = start.astimezone(tz).date() - dt.timedelta(days=1)
    # Three days cover every case: the day before (a zone whose clock is behind the
    # start's date line), the day itself, and the next; a fourth for a skipped day.
    for offset in range(4):
        local = dt.datetime.combine(day + dt.timedelta(days=offset), at, tzinfo=tz)
        due = local.astimezone(dt.UTC)  # fold=0: a skipped time moves on, a doubled one first
        if due >= start:
            return due
    raise AssertionError("unreachable: a day always has the time")


def due_by_zone(
    start: dt.datetime, at: dt.time, zones: Iterable[str | None], fallback: str
) -> dict[str | None, dt.datetime]:
    """Each of ``zones`` (None: no zone known) → when its deliveries are due; a zone this
    process cannot read gets the fallback's time."""
    fallback_due = local_due(start, at, fallback)
    if fallback_due is None:
        raise ValueError(f"unknown fallback zone {fallback!r}")
    return {zone: (zone and local_due(start, at, zone)) or fallback_due for zone in zones}


@functools.lru_cache(maxsize=64)
def latest_due(start: dt.datetime, at: dt.time) -> dt.datetime:
    """The last moment any zone's deliveries can be due for a campaign starting at
    ``start``: what "don't deliver after" must come after."""
    every = [*zone_names(), *(f"Etc/GMT{sign}{n}" for sign in "+-" for n in range(15))]
    return max(due for due in (local_due(start, at, z) for z in every) if due is not None)


def per_hour(
    start: dt.datetime, at: dt.time, audience: dict[str | None, int], fallback: str
) -> list[tuple[dt.datetime, int]]:
    """The deliveries due in each hour (its start, UTC), in order, from the audience
    counted by zone: what the review page shows."""
    due = due_by_zone(start, at, audience, fallback)
    hours: Counter[dt.datetime] = Counter()
    for zone, count in audience.items():
        hours[due[zone].replace(minute=0, second=0, microsecond=0)] += count
    return sorted(hours.items())
