"""Properties: the lockout state machine and the ``next`` validator."""

from __future__ import annotations

import datetime as dt
import re
from urllib.parse import urlsplit

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from portal.staff.access import safe_next
from portal.staff.lockout import LockoutPolicy, LockState, after_failure, after_success

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


class Lockout(RuleBasedStateMachine):
    """Random sign-in attempts and waits against a model kept as a plain event history:
    the account is locked exactly when the last ``attempts`` counted failures came in a
    row with no success or lock in between, and stays locked for ``duration``."""

    def __init__(self) -> None:
        super().__init__()
        self.policy = LockoutPolicy(attempts=3, duration=dt.timedelta(minutes=15))
        self.now = START
        self.state = LockState()
        self.streak: list[dt.datetime] = []  # counted failures since the last reset
        self.lock_ends: dt.datetime | None = None

    def _locked(self) -> bool:
        return self.lock_ends is not None and self.now < self.lock_ends

    @rule(minutes=st.integers(min_value=0, max_value=40), seconds=st.integers(0, 59))
    def wait(self, minutes: int, seconds: int) -> None:
        self.now += dt.timedelta(minutes=minutes, seconds=seconds)

    @rule()
    def wrong_password(self) -> None:
        before = self.state
        self.state = after_failure(self.state, self.now, self.policy)
        if self._locked():
            assert self.state == before  # attempts while locked change nothing
            return
        self.streak.append(self.now)
        if len(self.streak) == self.policy.attempts:
            self.lock_ends = self.now + self.policy.duration
            self.streak = []

    @precondition(lambda self: not self.state.is_locked(self.now))
    @rule()
    def right_password(self) -> None:
        # The service refuses a right password while locked; unlocked, it signs in.
        self.state = after_success(self.state)
        self.streak = []

    @invariant()
    def agrees_with_the_model(self) -> None:
        assert self.state.is_locked(self.now) == self._locked()
        if not self._locked():
            assert self.state.failures == len(self.streak)

    @invariant()
    def never_reaches_the_threshold_unlocked(self) -> None:
        assert 0 <= self.state.failures < self.policy.attempts

    @invariant()
    def the_wait_is_honest(self) -> None:
        minutes = self.state.minutes_left(self.now)
        if self.state.is_locked(self.now):
            assert self.lock_ends is not None
            left = self.lock_ends - self.now
            assert 1 <= minutes <= 15
            assert dt.timedelta(minutes=minutes - 1) < left <= dt.timedelta(minutes=minutes)
        else:
            assert minutes == 0


TestLockout = Lockout.TestCase
TestLockout.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def _browser_reading(path: str) -> str:
    """What a browser makes of a Location path: tabs and newlines dropped, \\ as /."""
    return re.sub(r"[\t\n\r]", "", path).replace("\\", "/")


_PIECES = st.sampled_from(
    [
        "/",
        "\\",
        ":",
        ".",
        "@",
        "?",
        "#",
        "%2F",
        "a",
        " ",
        "\t",
        "\n",
        "\x00",
        "http",
        "evil.example",
    ]
)


@given(st.one_of(st.lists(_PIECES, max_size=12).map("".join), st.text(max_size=30)))
def test_safe_next_only_lets_through_paths_on_this_site(value):
    result = safe_next(value)
    if result is None:
        return
    assert result == value
    seen = _browser_reading(result)
    assert seen.startswith("/") and not seen.startswith("//")
    parts = urlsplit(seen)
    assert not parts.scheme and not parts.netloc


@given(st.from_regex(r"\A/staff(/[a-z0-9_-]{1,10}){0,3}(\?[a-z]{1,5}=[a-z0-9.%]{0,10})?\Z"))
def test_safe_next_keeps_ordinary_staff_paths(path):
    assert safe_next(path) == path


def test_safe_next_examples():
    for bad in (
        None,
        "",
        "https://evil.example/",
        "//evil.example",
        "///evil.example",
        "/\\evil.example",
        "\\/evil.example",
        "/\t/evil.example",
        "/\n/evil.example",
        " /staff/",
        "javascript:alert(1)",
        "staff/",
        "/" + "a" * 3000,
    ):
        assert safe_next(bad) is None, bad
    assert safe_next("/staff/admin/audit?action=staff.created&before=9") == (
        "/staff/admin/audit?action=staff.created&before=9"
    )
