"""Account lockout as a small pure state machine, so its rules can be checked on their own.

A failure while unlocked counts; the ``attempts``-th failure in a row locks for
``duration`` and starts the count again. Attempts while locked change nothing (they
neither count nor extend the lock). A success clears everything.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LockoutPolicy:
    attempts: int = 5
    duration: dt.timedelta = dt.timedelta(minutes=15)


@dataclass(frozen=True)
class LockState:
    failures: int = 0
    locked_until: dt.datetime | None = None

    def is_locked(self, now: dt.datetime) -> bool:
        return self.locked_until is not None and now < self.locked_until

    def minutes_left(self, now: dt.datetime) -> int:
        """Whole minutes until the lock ends, rounded up (at least 1 while locked)."""
        if not self.is_locked(now):
            return 0
        assert self.locked_until is not None
        return max(1, math.ceil((self.locked_until - now).total_seconds() / 60))


def after_failure(state: LockState, now: dt.datetime, policy: LockoutPolicy) -> LockState:
    if state.is_locked(now):
        return state
    failures = state.failures + 1
    if failures >= policy.attempts:
        return LockState(failures=0, locked_until=now + policy.duration)
    return LockState(failures=failures, locked_until=None)


def after_success(_state: LockState) -> LockState:
    return LockState()
