"""Costly readings of a campaign's progress, reused for a time in proportion to their cost.

A campaign's page reads its progress (counts, outcome by push service, the delivery
funnel) in aggregate queries over all its deliveries, and the page's script asks again
every few seconds. For a campaign of 3,000,000 deliveries that reading took 6.5 s of the
database (``docs/campaigns.md``, "Progress at scale"): asked every 5 s by every open page,
it never stopped. A reading that took longer than ``REUSE_ABOVE`` is therefore kept and
answered again, in this process, for ``REUSE_FACTOR`` times what it cost, so the database
spends at most about a tenth of its time on one campaign's page for each web process; a
cheaper reading is never reused. A reading is kept for the campaign's status it was taken
under: a pause, a resume, a cancel or the end of sending makes the next request read
afresh. The answer says how old it is (``at``) and when to ask again (``refreshAfter``).

While one request renews a kept reading, the others asking for it (the page's script,
another member of staff opening the page) are answered with the kept one, older than
its time, rather than reading it again beside it: two readings of the same campaign at
once cost the database twice and each took longer (``bench/progress.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

REUSE_ABOVE = 0.25  # seconds: a reading cheaper than this is always taken afresh
REUSE_FACTOR = 10  # a costly reading is answered again for this many times its cost
MAX_KEPT = 256  # readings kept at most, the oldest dropped first


@dataclass(frozen=True)
class Reading:
    value: Any
    cost: float  # seconds it took
    fresh_until: float  # on the monotonic clock


class CostlyReadings:
    """Readings by key, each kept for ``REUSE_FACTOR`` times its cost when that cost was
    above ``REUSE_ABOVE``. Safe to share between a web process's threads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._kept: dict[Hashable, Reading] = {}
        self._renewing: set[Hashable] = set()  # keys a thread is reading afresh
        self._lock = threading.Lock()

    def read(self, key: Hashable, take: Callable[[], Any]) -> Reading:
        """The kept reading of ``key`` while it is fresh, or while another thread is
        renewing it; else ``take()``'s, timed."""
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and (self._clock() < kept.fresh_until or key in self._renewing):
                return kept
            self._renewing.add(key)
        try:
            started = self._clock()
            value = take()
            finished = self._clock()
        finally:
            with self._lock:
                self._renewing.discard(key)
        cost = finished - started
        reading = Reading(value, cost, finished + REUSE_FACTOR * cost)
        with self._lock:
            if cost > REUSE_ABOVE:
                self._kept[key] = reading
                while len(self._kept) > MAX_KEPT:
                    del self._kept[next(iter(self._kept))]
            else:
                self._kept.pop(key, None)
        return reading

    def seconds_fresh(self, reading: Reading) -> float:
        """How long ``reading`` stays the answer (0 for one never kept)."""
        if reading.cost <= REUSE_ABOVE:
            return 0.0
        return max(0.0, reading.fresh_until - self._clock())
