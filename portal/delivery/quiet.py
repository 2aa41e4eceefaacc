"""Quiet hours: marketing notifications wait while it is night where the person is.

Two windows, both in the person's own time zone (``subscriber.time_zone``; where no
browser said, the campaign's fallback zone, or the zone it was scheduled in, or UTC):

- the portal-wide one, ``QUIET_HOURS`` (``21:00-08:00``; off unless set);
- the person's own, "Do not send between …" in the preference centre
  (``subscriber.quiet_from`` / ``quiet_until``; a change is a consent event).

A marketing delivery whose turn comes inside either window is not sent: it goes back to
the queue, due when the windows end (:func:`quiet_until`), with reason ``quiet_hours``,
and the campaign page says how many wait and until when. Transactional topics and test
sends are never held. The engine asks :func:`quiet_until` for each claimed delivery,
after the consent re-check and before the frequency caps.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from portal.campaigns.local_time import local_due, parse_local_time
from portal.clock import zone_info

QUIET_HOURS = "quiet_hours"  # the reason a delivery waiting for a window's end carries
_WINDOW = re.compile(r"\s*([0-9:]+)\s*[-–]\s*([0-9:]+)\s*")


@dataclass(frozen=True)
class Window:
    """From ``start`` (inclusive) to ``end`` (exclusive), local wall-clock times; a window
    whose start is after its end crosses midnight (21:00–08:00)."""

    start: dt.time
    end: dt.time

    def holds(self, at: dt.time) -> bool:
        if self.start < self.end:
            return self.start <= at < self.end
        return at >= self.start or at < self.end

    def __str__(self) -> str:
        return f"{self.start:%H:%M}–{self.end:%H:%M}"


def window(start: dt.time | None, end: dt.time | None) -> Window | None:
    """A window from two times; None when either is missing or they are the same (a
    window of no time, or of all of it: neither is quiet hours)."""
    if start is None or end is None or start == end:
        return None
    return Window(start, end)


def parse_window(text: str) -> Window | None:
    """``"21:00-08:00"`` → a window; None when it is not two different HH:MM times."""
    match = _WINDOW.fullmatch(text)
    if not match:
        return None
    start, end = parse_local_time(match.group(1)), parse_local_time(match.group(2))
    return window(start, end)


def quiet_until(now: dt.datetime, zone: str, windows: list[Window]) -> dt.datetime | None:
    """When the quiet hours around ``now`` end in ``zone`` (UTC), or None when ``now`` is
    inside none of ``windows``. Overlapping or touching windows are one quiet time: the
    end is the moment none of them holds. A zone this process does not know: UTC."""
    moment = now
    for _ in range(2 * len(windows) + 1):
        due = None
        for each in windows:
            local = _local(moment, zone)
            if each.holds(local.time()):
                end = local_due(moment, each.end, zone) or local_due(moment, each.end, "UTC")
                assert end is not None
                due = end if due is None else max(due, end)
        if due is None:
            return None if moment == now else moment
        moment = due
    return moment


def _local(moment: dt.datetime, zone: str) -> dt.datetime:
    return moment.astimezone(zone_info(zone) or dt.UTC)
