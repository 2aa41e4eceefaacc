"""Staff sign-in settings come from the environment with safe defaults."""

from __future__ import annotations

import pytest

from portal.config import ConfigError, Settings


def test_defaults(tmp_path):
    staff = Settings.from_env({}, str(tmp_path)).staff
    assert (staff.lockout_attempts, staff.lockout_minutes) == (5, 15)
    assert staff.attempts_per_minute == 10
    assert (staff.session_idle_minutes, staff.session_max_hours) == (30, 12)


def test_read_from_the_environment(tmp_path):
    environ = {
        "STAFF_LOCKOUT_ATTEMPTS": "3",
        "STAFF_LOCKOUT_MINUTES": "60",
        "STAFF_LOGIN_ATTEMPTS_PER_MINUTE": "4",
        "STAFF_SESSION_IDLE_MINUTES": "10",
        "STAFF_SESSION_MAX_HOURS": "8",
    }
    staff = Settings.from_env(environ, str(tmp_path)).staff
    assert (staff.lockout_attempts, staff.lockout_minutes, staff.attempts_per_minute) == (3, 60, 4)
    assert (staff.session_idle_minutes, staff.session_max_hours) == (10, 8)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "must be at least 1"),
        ("-2", "must not be negative"),
        ("five", "must be a whole number"),
    ],
)
def test_bad_values_name_the_variable(tmp_path, value, message):
    with pytest.raises(ConfigError, match=f"STAFF_LOCKOUT_ATTEMPTS {message}"):
        Settings.from_env({"STAFF_LOCKOUT_ATTEMPTS": value}, str(tmp_path))
