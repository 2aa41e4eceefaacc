"""Configuration from the environment: development defaults, production refusals."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from portal.config import ConfigError, Settings, generate_vapid_keys

ROOT = Path(__file__).resolve().parent.parent
PRIVATE, PUBLIC = generate_vapid_keys()
GOOD_PRODUCTION = {
    "PORTAL_ENV": "production",
    "SECRET_KEY": "s" * 40,
    "VAPID_PRIVATE_KEY": PRIVATE,
    "VAPID_PUBLIC_KEY": PUBLIC,
    "VAPID_SUBJECT": "mailto:ops@example.com",
    "SUBSCRIPTION_AUTH_KEY_V1": base64.b64encode(b"k" * 32).decode(),
    "DATABASE_URL": "postgresql://u@db/portal",
}


def test_development_needs_nothing_and_generates_secrets_once(tmp_path):
    first = Settings.from_env({}, str(tmp_path))
    second = Settings.from_env({}, str(tmp_path))
    assert first.secret_key and first.secret_key == second.secret_key
    assert first.vapid_public_key == second.vapid_public_key
    assert first.auth_keys == second.auth_keys and len(first.auth_keys[1]) == 32
    assert first.database_url == f"sqlite:///{tmp_path.resolve() / 'portal.sqlite3'}"
    assert first.auto_migrate is True
    secrets_file = tmp_path / "portal-secrets.json"
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600


def test_production_with_everything_set(tmp_path):
    settings = Settings.from_env(GOOD_PRODUCTION, str(tmp_path))
    assert settings.is_production
    assert settings.database_url == "postgresql+psycopg://u@db/portal"
    assert settings.auto_migrate is False
    assert not (tmp_path / "portal-secrets.json").exists()  # nothing generated in production


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("SECRET_KEY", None, "SECRET_KEY is missing"),
        ("SECRET_KEY", "changeme", "SECRET_KEY is missing or left at a default"),
        ("SECRET_KEY", "short-but-set", "SECRET_KEY is too short"),
        ("VAPID_PRIVATE_KEY", None, "VAPID_PRIVATE_KEY is missing"),
        ("VAPID_PUBLIC_KEY", None, "VAPID_PUBLIC_KEY is missing"),
        ("VAPID_SUBJECT", None, "VAPID_SUBJECT is missing"),
        ("VAPID_SUBJECT", "ops@example.com", "VAPID_SUBJECT must be a mailto: address"),
        ("SUBSCRIPTION_AUTH_KEY_V1", None, "SUBSCRIPTION_AUTH_KEY_V1 is missing"),
        (
            "SUBSCRIPTION_AUTH_KEY_V1",
            "bm90IDMyIGJ5dGVz",
            "SUBSCRIPTION_AUTH_KEY_V1 must decode to 32 bytes",
        ),
        ("SUBSCRIPTION_AUTH_KEY_V1", "***", "SUBSCRIPTION_AUTH_KEY_V1 is not valid base64"),
        ("SUBSCRIPTION_AUTH_KEY_VERSION", "2", "SUBSCRIPTION_AUTH_KEY_V2 is missing"),
        ("VAPID_PUBLIC_KEY", generate_vapid_keys()[1], "VAPID_PUBLIC_KEY does not match"),
        ("PORTAL_SCHEDULER", "maybe", "PORTAL_SCHEDULER must be 'on' or 'off'"),
    ],
)
def test_production_refuses_missing_or_default_secrets(tmp_path, name, value, message):
    environ = dict(GOOD_PRODUCTION)
    if value is None:
        environ.pop(name)
    else:
        environ[name] = value
    with pytest.raises(ConfigError, match=message):
        Settings.from_env(environ, str(tmp_path))


def test_allowed_hosts_and_numbers_from_the_environment(tmp_path):
    settings = Settings.from_env(
        {"PUSH_ALLOWED_HOSTS": "push.example.com, 127.0.0.1:8443", "RETRY_MAX_ATTEMPTS": "7"},
        str(tmp_path),
    )
    assert settings.push_allowed_hosts == ("push.example.com", "127.0.0.1:8443")
    assert settings.retry.max_attempts == 7
    with pytest.raises(ConfigError, match="RETRY_MAX_ATTEMPTS must be a whole number"):
        Settings.from_env({"RETRY_MAX_ATTEMPTS": "lots"}, str(tmp_path))


def test_the_dispatch_lease_comes_from_the_environment_and_is_never_zero(tmp_path):
    assert Settings.from_env({}, str(tmp_path)).dispatch_lease_seconds == 60.0
    settings = Settings.from_env({"DISPATCH_LEASE_SECONDS": "2.5"}, str(tmp_path))
    assert settings.dispatch_lease_seconds == 2.5
    for value in ("0", "-1", "soon"):
        with pytest.raises(ConfigError, match="DISPATCH_LEASE_SECONDS must"):
            Settings.from_env({"DISPATCH_LEASE_SECONDS": value}, str(tmp_path))


def test_production_start_fails_with_one_line_naming_the_variable(tmp_path):
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SECRET", "VAPID", "SUBSCRIPTION", "PORTAL", "DATABASE"))
    }
    environ |= {k: v for k, v in GOOD_PRODUCTION.items() if k != "SECRET_KEY"}
    environ["PORTAL_INSTANCE_PATH"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "flask", "--app", "app", "routes"],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert lines == [
        "portal: configuration error: SECRET_KEY is missing or left at a default: set it in the environment"
    ]
