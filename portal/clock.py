"""The clock seam: services ask it for the time so tests can move time at will."""

from __future__ import annotations

import datetime as dt
import threading
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
