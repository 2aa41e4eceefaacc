"""Configuration from the environment: development defaults, production refusals."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from portal.config import ConfigError, Settings, generate_signing_key, generate_vapid_keys

ROOT = Path(__file__).resolve().parent.parent
PRIVATE, PUBLIC = generate_vapid_keys()
GOOD_PRODUCTION = {
    "PORTAL_ENV": "production",
    "SECRET_KEY": "s" * 40,
    "VAPID_PRIVATE_KEY": PRIVATE,
    "VAPID_PUBLIC_KEY": PUBLIC,
    "VAPID_SUBJECT": "mailto:ops@example.com",
    "SUBSCRIPTION_AUTH_KEY_V1": base64.b64encode(bytes(range(32))).decode(),
    "DATABASE_URL": "postgresql://u@db/portal",
    "PUBLIC_URL": "https://portal.example.com",
    "CONSENT_LOG_SIGNING_KEY": generate_signing_key(),
}


def test_development_needs_nothing_and_generates_secrets_once(tmp_path):
    first = Settings.from_env({}, str(tmp_path))
    second = Settings.from_env({}, str(tmp_path))
    assert first.secret_key and first.secret_key == second.secret_key
    assert first.vapid_public_key == second.vapid_public_key
    assert first.auth_keys == second.auth_keys and len(first.auth_keys[1]) == 32
    assert first.consent_log_signing_key and (
        first.consent_log_signing_key == second.consent_log_signing_key
    )
    assert first.database_url == f"sqlite:///{tmp_path.resolve() / 'portal.sqlite3'}"
    assert first.auto_migrate is True
    assert first.seed_demo_data is True  # the run command shows demo topics and a notice
    secrets_file = tmp_path / "portal-secrets.json"
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600


def test_production_with_everything_set(tmp_path):
    settings = Settings.from_env(GOOD_PRODUCTION, str(tmp_path))
    assert settings.is_production
    assert settings.database_url == "postgresql+psycopg://u@db/portal"
    assert settings.auto_migrate is False
    assert settings.seed_demo_data is False
    assert not (tmp_path / "portal-secrets.json").exists()  # nothing generated in production


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("SECRET_KEY", None, "SECRET_KEY is missing"),
        ("SECRET_KEY", "changeme", "SECRET_KEY is missing or left at a default"),
        ("SECRET_KEY", "short-but-set", "SECRET_KEY is too short"),
        ("SECRET_KEY", "", "SECRET_KEY is missing"),
        ("SECRET_KEY", "  secret  ", "SECRET_KEY is missing or left at a default"),
        ("VAPID_PRIVATE_KEY", None, "VAPID_PRIVATE_KEY is missing"),
        ("VAPID_PRIVATE_KEY", "changeme", "VAPID_PRIVATE_KEY is missing or left at a default"),
        ("VAPID_PUBLIC_KEY", "default", "VAPID_PUBLIC_KEY is missing or left at a default"),
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
        (
            "SUBSCRIPTION_AUTH_KEY_V1",
            base64.b64encode(bytes(32)).decode(),
            "SUBSCRIPTION_AUTH_KEY_V1 is missing or left at a default",
        ),
        (
            "SUBSCRIPTION_AUTH_KEY_V2",
            base64.b64encode(b"k" * 32).decode(),
            "SUBSCRIPTION_AUTH_KEY_V2 is missing or left at a default",
        ),
        ("SUBSCRIPTION_AUTH_KEY_VERSION", "2", "SUBSCRIPTION_AUTH_KEY_V2 is missing"),
        pytest.param(  # a fresh key: named, or pytest-xdist's workers would collect it apart
            "VAPID_PUBLIC_KEY",
            generate_vapid_keys()[1],
            "VAPID_PUBLIC_KEY does not match",
            id="VAPID_PUBLIC_KEY-another-key",
        ),
        ("CONSENT_LOG_SIGNING_KEY", None, "CONSENT_LOG_SIGNING_KEY is missing"),
        ("CONSENT_LOG_SIGNING_KEY", "changeme", "CONSENT_LOG_SIGNING_KEY is missing or left"),
        (
            "CONSENT_LOG_SIGNING_KEY",
            "bm90IDMyIGJ5dGVz",
            "CONSENT_LOG_SIGNING_KEY must be a base64url raw 32-byte Ed25519 private key",
        ),
        ("PORTAL_SCHEDULER", "maybe", "PORTAL_SCHEDULER must be 'on' or 'off'"),
        ("PUBLIC_URL", None, "PUBLIC_URL is missing"),
        ("PUBLIC_URL", "http://portal.example.com", "PUBLIC_URL must be an https:// origin"),
        ("METRICS_TOKEN", "changeme", "METRICS_TOKEN is missing or left at a default"),
        ("CAMPAIGN_LINK_ORIGINS", "http://shop.example", "CAMPAIGN_LINK_ORIGINS must list"),
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


def test_development_accepts_any_well_formed_data_key(tmp_path):
    weak = base64.b64encode(bytes(32)).decode()
    settings = Settings.from_env({"SUBSCRIPTION_AUTH_KEY_V1": weak}, str(tmp_path))
    assert settings.auth_keys[1] == bytes(32)


def _start(tmp_path: Path, settings: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``flask routes`` in a fresh process with only ``settings`` for configuration."""
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SECRET", "VAPID", "SUBSCRIPTION", "PORTAL", "DATABASE"))
    }
    environ |= settings | {"PORTAL_INSTANCE_PATH": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-m", "flask", "--app", "app", "routes"],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("VAPID_PRIVATE_KEY", "changeme"),
        ("SUBSCRIPTION_AUTH_KEY_V1", base64.b64encode(bytes(32)).decode()),
    ],
)
def test_production_start_names_a_default_key_in_one_line(tmp_path, name, value):
    result = _start(tmp_path, GOOD_PRODUCTION | {name: value})
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        f"portal: configuration error: {name} is missing or left at a default: "
        "set it in the environment"
    ]


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


def test_the_web_workers_dispatch_share_is_a_share_of_one_cpu(tmp_path):
    assert Settings.from_env({}, str(tmp_path)).dispatch_web_cpu_share == 0.1
    settings = Settings.from_env({"DISPATCH_WEB_CPU_SHARE": "1"}, str(tmp_path))
    assert settings.dispatch_web_cpu_share == 1.0
    for value in ("0", "-0.5", "1.5", "half"):
        with pytest.raises(ConfigError, match="DISPATCH_WEB_CPU_SHARE must"):
            Settings.from_env({"DISPATCH_WEB_CPU_SHARE": value}, str(tmp_path))


def test_the_web_workers_job_niceness_is_a_niceness_a_thread_may_take(tmp_path):
    assert Settings.from_env({}, str(tmp_path)).dispatch_web_nice == 10
    assert Settings.from_env({"DISPATCH_WEB_NICE": "0"}, str(tmp_path)).dispatch_web_nice == 0
    assert Settings.from_env({"DISPATCH_WEB_NICE": "19"}, str(tmp_path)).dispatch_web_nice == 19
    for value in ("-1", "20", "low", "2.5"):
        with pytest.raises(ConfigError, match="DISPATCH_WEB_NICE must"):
            Settings.from_env({"DISPATCH_WEB_NICE": value}, str(tmp_path))


def test_production_start_fails_with_one_line_naming_the_variable(tmp_path):
    result = _start(tmp_path, {k: v for k, v in GOOD_PRODUCTION.items() if k != "SECRET_KEY"})
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert lines == [
        "portal: configuration error: SECRET_KEY is missing or left at a default: set it in the environment"
    ]


def test_hardening_defaults(tmp_path):
    settings = Settings.from_env({}, str(tmp_path))
    assert settings.max_body_bytes == 1024 * 1024
    assert settings.trusted_proxies == 0  # X-Forwarded-For is not trusted unless told
    assert settings.rate_limit.window_seconds == 60
    assert settings.rate_limit.per_address == 300
    assert settings.rate_limit.per_endpoint == 60
    assert settings.rate_limit.enabled
    assert settings.schedule.rate_limit_prune == 600


def test_hardening_settings_from_the_environment(tmp_path):
    settings = Settings.from_env(
        {
            "MAX_BODY_BYTES": "65536",
            "TRUSTED_PROXIES": "2",
            "RATE_LIMIT_WINDOW_SECONDS": "10",
            "RATE_LIMIT_PER_ADDRESS": "20",
            "RATE_LIMIT_PER_ENDPOINT": "5",
            "RATE_LIMIT_PRUNE_INTERVAL_SECONDS": "120",
        },
        str(tmp_path),
    )
    assert settings.max_body_bytes == 65536
    assert settings.trusted_proxies == 2
    assert (settings.rate_limit.window_seconds, settings.rate_limit.per_address) == (10, 20)
    assert settings.rate_limit.per_endpoint == 5
    assert settings.schedule.rate_limit_prune == 120
    off = Settings.from_env(
        {"RATE_LIMIT_PER_ADDRESS": "0", "RATE_LIMIT_PER_ENDPOINT": "0"}, str(tmp_path)
    )
    assert not off.rate_limit.enabled  # load tests turn both off


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("MAX_BODY_BYTES", "0", "MAX_BODY_BYTES must be at least 1"),
        ("MAX_BODY_BYTES", "1MB", "MAX_BODY_BYTES must be a whole number"),
        ("TRUSTED_PROXIES", "-1", "TRUSTED_PROXIES must not be negative"),
        ("RATE_LIMIT_WINDOW_SECONDS", "0", "RATE_LIMIT_WINDOW_SECONDS must be at least 1"),
        ("RATE_LIMIT_PER_ADDRESS", "many", "RATE_LIMIT_PER_ADDRESS must be a whole number"),
        ("RATE_LIMIT_PER_ENDPOINT", "-5", "RATE_LIMIT_PER_ENDPOINT must not be negative"),
    ],
)
def test_hardening_settings_refuse_bad_values(tmp_path, name, value, message):
    with pytest.raises(ConfigError, match=message):
        Settings.from_env({name: value}, str(tmp_path))


def test_the_decided_at_skew_comes_from_the_environment_and_is_never_zero(tmp_path):
    assert Settings.from_env({}, str(tmp_path)).decided_at_max_skew_seconds == 24 * 3600
    settings = Settings.from_env({"DECIDED_AT_MAX_SKEW_SECONDS": "600"}, str(tmp_path))
    assert settings.decided_at_max_skew_seconds == 600
    for value in ("0", "-1", "a day"):
        with pytest.raises(ConfigError, match="DECIDED_AT_MAX_SKEW_SECONDS must"):
            Settings.from_env({"DECIDED_AT_MAX_SKEW_SECONDS": value}, str(tmp_path))


def test_an_instance_folder_from_before_the_log_key_gains_one(tmp_path):
    """Development secrets written before CONSENT_LOG_SIGNING_KEY existed keep every other
    value and get a log key once."""
    import json

    first = Settings.from_env({}, str(tmp_path))
    path = tmp_path / "portal-secrets.json"
    stored = json.loads(path.read_text())
    del stored["CONSENT_LOG_SIGNING_KEY"]
    path.write_text(json.dumps(stored))
    second = Settings.from_env({}, str(tmp_path))
    third = Settings.from_env({}, str(tmp_path))
    assert second.secret_key == first.secret_key
    assert second.consent_log_signing_key and (
        second.consent_log_signing_key == third.consent_log_signing_key
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
