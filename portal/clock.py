"""The clock seam: services ask it for the time so tests can move time at will."""

from __future__ import annotations

import datetime as dt
import functools
import threading
import zoneinfo
from typing import Protocol

# A period of UTC days ends at the midnight after its last day, which must exist: the
# calendar's last day (9999-12-31) cannot end a period.
LAST_DAY = dt.date.max - dt.timedelta(days=1)


class Clock(Protocol):
    def now(self) -> dt.datetime: ...


class SystemClock:
    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)


class FrozenClock:
    """A clock that stands still until told to move (tests, time-travel checks)."""

    def __init__(self, start: dt.datetime | None = None) -> None:
        self._now = start or dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        self._lock = threading.Lock()

    def now(self) -> dt.datetime:
        with self._lock:
            return self._now

    def advance(self, delta: dt.timedelta | None = None, **kwargs: float) -> dt.datetime:
        with self._lock:
            self._now += delta if delta is not None else dt.timedelta(**kwargs)
            return self._now

    def set(self, when: dt.datetime) -> None:
        with self._lock:
            self._now = when


@functools.lru_cache(maxsize=1024)
def zone_info(name: str) -> zoneinfo.ZoneInfo | None:
    """The zone of that name, or None when this process's time-zone database lacks it."""
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return None


def day_in(at: dt.datetime, zone: str | None) -> str:
    """The day of ``at`` as a person reads it ("05 December 2026"): in their time zone
    when we know it (a page that says its times are theirs must not give UTC's day),
    else UTC's."""
    tz = zone_info(zone) if zone else None
    return at.astimezone(tz or dt.UTC).strftime("%d %B %Y")
