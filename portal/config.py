"""Configuration from the environment, in one object.

Development mode needs nothing: SQLite in the instance folder and secrets generated
once into ``instance/portal-secrets.json``. Production mode refuses to start when a
secret is missing or left at a well-known default, naming the variable.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from portal.origins import canonical_origin

DEFAULT_PUSH_HOSTS = (
    "fcm.googleapis.com",
    "updates.push.services.mozilla.com",
    "web.push.apple.com",
    "*.notify.windows.com",
)

# Values that show a secret was never really set.
_PLACEHOLDER_SECRETS = frozenset(
    {"", "changeme", "change-me", "change_me", "secret", "dev", "development", "test", "default"}
)
_MIN_SECRET_KEY_LENGTH = 32
_SECRETS_FILE = "portal-secrets.json"


class ConfigError(Exception):
    """A setting is missing or malformed; the message names the variable."""


def b64url_encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def generate_vapid_keys() -> tuple[str, str]:
    """A new application-server key pair: (private scalar, uncompressed public point),
    both base64url as browsers and pywebpush expect them."""
    key = ec.generate_private_key(ec.SECP256R1())
    private = key.private_numbers().private_value.to_bytes(32, "big")
    public = key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    return b64url_encode(private), b64url_encode(public)


def generate_signing_key() -> str:
    key = ed25519.Ed25519PrivateKey.generate()
    return b64url_encode(
        key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
    )


@dataclass(frozen=True)
class RetrySettings:
    max_attempts: int = 5
    initial_delay: float = 1.0
    max_delay: float = 64.0
    backoff_factor: float = 2.0
    jitter: float = 0.3


@dataclass(frozen=True)
class RetentionSettings:
    """How long subscriptions live without a sign of life, and what is kept after."""

    stale_after_days: int = 30
    expire_stale_after_days: int = 30
    tombstone_grace_days: int = 7
    audit_window_months: int = 13
    batch_size: int = 1000


@dataclass(frozen=True)
class ScheduleSettings:
    """Intervals of the embedded scheduler's jobs, in seconds."""

    dispatch: int = 5
    sweep: int = 3600
    tombstone: int = 3600
    purge: int = 86400
    reseal: int = 86400
    verify_log: int = 86400
    rate_limit_prune: int = 600


@dataclass(frozen=True)
class StaffAuthSettings:
    """Staff sign-in: account lockout, per-address throttle, session lifetimes."""

    lockout_attempts: int = 5
    lockout_minutes: int = 15
    attempts_per_minute: int = 10
    session_idle_minutes: int = 30
    session_max_hours: int = 12


@dataclass(frozen=True)
class RateLimitSettings:
    """Requests to the JSON API per fixed window: per client address and endpoint, and
    per push subscription endpoint. Zero turns that limit off (load tests)."""

    window_seconds: int = 60
    per_address: int = 300
    per_endpoint: int = 60

    @property
    def enabled(self) -> bool:
        return self.per_address > 0 or self.per_endpoint > 0


@dataclass(frozen=True)
class Settings:
    env: str = "development"
    instance_path: str = "instance"
    public_url: str | None = None
    database_url: str = ""
    database_connect_timeout: int = 5
    secret_key: str = ""
    vapid_private_key: str = ""
    vapid_public_key: str = ""
    vapid_subject: str = ""
    auth_keys: Mapping[int, bytes] = field(default_factory=dict)
    auth_key_version: int = 1
    push_allowed_hosts: tuple[str, ...] = DEFAULT_PUSH_HOSTS
    push_ca_bundle: str | None = None
    scheduler: bool = True
    feedback_secrets: tuple[str, ...] = ()
    feedback_signature_header: str = "X-CN1-Signature"
    feedback_max_age_seconds: int = 300
    feedback_organization: str | None = None
    feedback_max_body_bytes: int = 1024 * 1024
    feedback_test_url: str | None = None
    # Other sites campaign links and icons may point to (the public origin always may).
    campaign_link_origins: tuple[str, ...] = ()
    # When set, /metrics answers only "Authorization: Bearer <this>".
    metrics_token: str | None = None
    export_signing_key: str = ""
    endpoint_max_length: int = 4096
    api_max_body_bytes: int = 16 * 1024
    max_body_bytes: int = 1024 * 1024
    trusted_proxies: int = 0
    rate_limit: RateLimitSettings = field(default_factory=RateLimitSettings)
    last_seen_throttle_seconds: int = 3600
    failures_before_stale: int = 3
    retry: RetrySettings = field(default_factory=RetrySettings)
    # How long a claimed delivery belongs to its process unless renewed (the sender
    # renews it while sending); past it (the process died) another may send it again.
    dispatch_lease_seconds: float = 60.0
    reseal_batch_size: int = 500
    # The hash backfill rewrites a live table: it pauses between chunks and stops when a
    # replica falls behind (seed 000 §9), so it can run during the day.
    backfill_pause_seconds: float = 0.075
    backfill_max_replication_lag_seconds: float = 10.0
    staff: StaffAuthSettings = field(default_factory=StaffAuthSettings)
    auto_migrate: bool = False
    identity_assertion_secrets: tuple[str, ...] = ()
    preference_link_max_age: int = 30 * 24 * 3600
    # How far a decision's client time (the API's decidedAt) may lie from the server
    # clock, before or after.
    decided_at_max_skew_seconds: int = 24 * 3600
    region_header: str | None = None
    seed_demo_data: bool = False
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    schedule: ScheduleSettings = field(default_factory=ScheduleSettings)

    @property
    def is_production(self) -> bool:
        return self.env == "production"

    def with_overrides(self, **changes: Any) -> Settings:
        return replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str], instance_path: str) -> Settings:
        env = environ.get("PORTAL_ENV", "development").strip().lower()
        if env not in {"development", "production"}:
            raise ConfigError(f"PORTAL_ENV must be 'development' or 'production', not {env!r}")
        production = env == "production"
        generated: dict[str, str] = {} if production else _dev_secrets(instance_path)

        def get(name: str, default: str = "") -> str:
            value = environ.get(name)
            if value is None or value == "":
                return generated.get(name, default)
            return value

        secret_key = get("SECRET_KEY")
        vapid_private = get("VAPID_PRIVATE_KEY")
        vapid_public = get("VAPID_PUBLIC_KEY")
        vapid_subject = get("VAPID_SUBJECT", "" if production else "mailto:admin@localhost")
        version_text = get("SUBSCRIPTION_AUTH_KEY_VERSION", "1")
        try:
            key_version = int(version_text)
        except ValueError:
            raise ConfigError(
                f"SUBSCRIPTION_AUTH_KEY_VERSION must be a whole number, not {version_text!r}"
            ) from None
        auth_keys = _auth_keys(environ, generated)
        export_key = get("EXPORT_SIGNING_KEY")
        feedback_secrets = tuple(s.strip() for s in get("FEEDBACK_SECRETS").split(",") if s.strip())
        public_url = _public_url(environ.get("PUBLIC_URL", ""), production=production)
        metrics_token = environ.get("METRICS_TOKEN", "").strip() or None

        if production:
            _require_secret("SECRET_KEY", secret_key)
            _require_secret("VAPID_PRIVATE_KEY", vapid_private)
            _require_secret("VAPID_PUBLIC_KEY", vapid_public)
            _require_secret("VAPID_SUBJECT", vapid_subject)
            _require_secret(f"SUBSCRIPTION_AUTH_KEY_V{key_version}", auth_keys.get(key_version))
            for version, key in sorted(auth_keys.items()):
                _require_data_key(f"SUBSCRIPTION_AUTH_KEY_V{version}", key)
            # Optional (unset disables the receiver), but never a well-known value.
            for secret in feedback_secrets:
                _require_secret("FEEDBACK_SECRETS", secret)
            if metrics_token is not None:
                _require_secret("METRICS_TOKEN", metrics_token)
        if key_version not in auth_keys:
            raise ConfigError(
                f"SUBSCRIPTION_AUTH_KEY_V{key_version} is missing: "
                f"SUBSCRIPTION_AUTH_KEY_VERSION is {key_version}"
            )
        if vapid_subject and not re.match(r"^(mailto:[^@\s]+@[^@\s]+|https://\S+)$", vapid_subject):
            raise ConfigError("VAPID_SUBJECT must be a mailto: address or an https: URL")
        _check_vapid_pair(vapid_private, vapid_public)
        _check_signing_key(export_key)

        database_url = environ.get("DATABASE_URL") or (
            f"sqlite:///{Path(instance_path).resolve() / 'portal.sqlite3'}"
        )
        hosts_text = environ.get("PUSH_ALLOWED_HOSTS", "")
        hosts = tuple(h.strip().lower() for h in hosts_text.split(",") if h.strip())
        return cls(
            env=env,
            instance_path=instance_path,
            public_url=public_url,
            database_url=normalise_database_url(database_url),
            database_connect_timeout=_positive(environ, "DATABASE_CONNECT_TIMEOUT_SECONDS", 5),
            secret_key=secret_key,
            vapid_private_key=vapid_private,
            vapid_public_key=vapid_public,
            vapid_subject=vapid_subject,
            auth_keys=auth_keys,
            auth_key_version=key_version,
            push_allowed_hosts=hosts or DEFAULT_PUSH_HOSTS,
            push_ca_bundle=environ.get("PUSH_CA_BUNDLE") or None,
            scheduler=_flag(environ, "PORTAL_SCHEDULER", default=True),
            feedback_secrets=feedback_secrets,
            feedback_signature_header=(
                environ.get("FEEDBACK_SIGNATURE_HEADER", "").strip() or "X-CN1-Signature"
            ),
            feedback_max_age_seconds=_int(environ, "FEEDBACK_MAX_AGE_SECONDS", 300),
            feedback_organization=environ.get("FEEDBACK_ORGANIZATION", "").strip() or None,
            feedback_max_body_bytes=_int(environ, "FEEDBACK_MAX_BODY_BYTES", 1024 * 1024),
            feedback_test_url=environ.get("FEEDBACK_TEST_URL", "").strip() or None,
            campaign_link_origins=_link_origins(environ.get("CAMPAIGN_LINK_ORIGINS", "")),
            metrics_token=metrics_token,
            export_signing_key=export_key,
            endpoint_max_length=_int(environ, "PUSH_ENDPOINT_MAX_LENGTH", 4096),
            api_max_body_bytes=_int(environ, "API_MAX_BODY_BYTES", 16 * 1024),
            max_body_bytes=_positive(environ, "MAX_BODY_BYTES", 1024 * 1024),
            trusted_proxies=_int(environ, "TRUSTED_PROXIES", 0),
            rate_limit=RateLimitSettings(
                window_seconds=_positive(environ, "RATE_LIMIT_WINDOW_SECONDS", 60),
                per_address=_int(environ, "RATE_LIMIT_PER_ADDRESS", 300),
                per_endpoint=_int(environ, "RATE_LIMIT_PER_ENDPOINT", 60),
            ),
            last_seen_throttle_seconds=_int(environ, "LAST_SEEN_THROTTLE_SECONDS", 3600),
            failures_before_stale=_int(environ, "PUSH_FAILURES_BEFORE_STALE", 3),
            retry=RetrySettings(
                max_attempts=_int(environ, "RETRY_MAX_ATTEMPTS", 5),
                initial_delay=_float(environ, "RETRY_INITIAL_DELAY_SECONDS", 1.0),
                max_delay=_float(environ, "RETRY_MAX_DELAY_SECONDS", 64.0),
                backoff_factor=_float(environ, "RETRY_BACKOFF_FACTOR", 2.0),
                jitter=_float(environ, "RETRY_JITTER", 0.3),
            ),
            dispatch_lease_seconds=_lease(environ),
            reseal_batch_size=_int(environ, "RESEAL_BATCH_SIZE", 500),
            backfill_pause_seconds=_int(environ, "BACKFILL_PAUSE_MS", 75) / 1000,
            backfill_max_replication_lag_seconds=_float(
                environ, "BACKFILL_MAX_REPLICATION_LAG_SECONDS", 10.0
            ),
            staff=StaffAuthSettings(
                lockout_attempts=_positive(environ, "STAFF_LOCKOUT_ATTEMPTS", 5),
                lockout_minutes=_positive(environ, "STAFF_LOCKOUT_MINUTES", 15),
                attempts_per_minute=_positive(environ, "STAFF_LOGIN_ATTEMPTS_PER_MINUTE", 10),
                session_idle_minutes=_positive(environ, "STAFF_SESSION_IDLE_MINUTES", 30),
                session_max_hours=_positive(environ, "STAFF_SESSION_MAX_HOURS", 12),
            ),
            auto_migrate=_flag(environ, "PORTAL_AUTO_MIGRATE", default=not production),
            identity_assertion_secrets=tuple(
                s.strip() for s in get("IDENTITY_ASSERTION_SECRETS").split(",") if s.strip()
            ),
            preference_link_max_age=_int(
                environ, "PREFERENCE_LINK_MAX_AGE_SECONDS", 30 * 24 * 3600
            ),
            decided_at_max_skew_seconds=_positive(
                environ, "DECIDED_AT_MAX_SKEW_SECONDS", 24 * 3600
            ),
            region_header=environ.get("REGION_HEADER") or None,
            seed_demo_data=_flag(environ, "PORTAL_DEMO_DATA", default=not production),
            retention=RetentionSettings(
                stale_after_days=_int(environ, "STALE_AFTER_DAYS", 30),
                expire_stale_after_days=_int(environ, "EXPIRE_STALE_AFTER_DAYS", 30),
                tombstone_grace_days=_int(environ, "TOMBSTONE_GRACE_DAYS", 7),
                audit_window_months=_int(environ, "AUDIT_WINDOW_MONTHS", 13),
                batch_size=_int(environ, "SWEEP_BATCH_SIZE", 1000) or 1000,
            ),
            schedule=ScheduleSettings(
                dispatch=_int(environ, "DISPATCH_TICK_SECONDS", 5) or 5,
                sweep=_int(environ, "SWEEP_INTERVAL_SECONDS", 3600) or 3600,
                tombstone=_int(environ, "TOMBSTONE_INTERVAL_SECONDS", 3600) or 3600,
                purge=_int(environ, "PURGE_INTERVAL_SECONDS", 86400) or 86400,
                reseal=_int(environ, "RESEAL_INTERVAL_SECONDS", 86400) or 86400,
                verify_log=_int(environ, "VERIFY_LOG_INTERVAL_SECONDS", 86400) or 86400,
                rate_limit_prune=_int(environ, "RATE_LIMIT_PRUNE_INTERVAL_SECONDS", 600) or 600,
            ),
        )


def normalise_database_url(url: str) -> str:
    """Route plain ``postgresql://`` URLs to psycopg 3, the driver we ship."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def _public_url(value: str, *, production: bool) -> str | None:
    """PUBLIC_URL as its origin; required, and https, in production."""
    value = value.strip()
    if not value:
        if production:
            raise ConfigError(
                "PUBLIC_URL is missing: set it to the address people reach the portal at, "
                "like https://portal.example.com"
            )
        return None
    origin = _origin_only(value)
    if origin is None:
        raise ConfigError(
            f"PUBLIC_URL must be an origin like https://portal.example.com "
            f"(scheme and host, no path), not {value!r}"
        )
    if production and not origin.startswith("https://"):
        raise ConfigError("PUBLIC_URL must be an https:// origin in production")
    return origin


def _link_origins(value: str) -> tuple[str, ...]:
    origins = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        origin = _origin_only(item)
        if origin is None or not origin.startswith("https://"):
            raise ConfigError(
                f"CAMPAIGN_LINK_ORIGINS must list https:// origins like "
                f"https://shop.example.com, not {item!r}"
            )
        origins.append(origin)
    return tuple(dict.fromkeys(origins))


def _origin_only(value: str) -> str | None:
    """The canonical origin ``value`` names, or None when it is not only an origin (a
    path, query or fragment, credentials, another scheme)."""
    origin = canonical_origin(value)
    if origin is None or "?" in value or "#" in value:
        return None
    return origin if urlsplit(value.strip()).path in ("", "/") else None


def _require_secret(name: str, value: object) -> None:
    if value is None or (isinstance(value, str) and value.strip().lower() in _PLACEHOLDER_SECRETS):
        raise ConfigError(f"{name} is missing or left at a default: set it in the environment")
    if name == "SECRET_KEY" and isinstance(value, str) and len(value) < _MIN_SECRET_KEY_LENGTH:
        raise ConfigError(
            f"SECRET_KEY is too short: use at least {_MIN_SECRET_KEY_LENGTH} characters"
        )


def _require_data_key(name: str, key: bytes) -> None:
    # One byte repeated (32 zero bytes, "AAAA…=") is a placeholder, never a generated key.
    if len(set(key)) == 1:
        raise ConfigError(f"{name} is missing or left at a default: set it in the environment")


def _auth_keys(environ: Mapping[str, str], generated: Mapping[str, str]) -> dict[int, bytes]:
    keys: dict[int, bytes] = {}
    names = {**generated, **environ}
    for name, value in names.items():
        match = re.fullmatch(r"SUBSCRIPTION_AUTH_KEY_V(\d+)", name)
        if not match or not value:
            continue
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(f"{name} is not valid base64") from None
        if len(raw) != 32:
            raise ConfigError(f"{name} must decode to 32 bytes, not {len(raw)}")
        keys[int(match.group(1))] = raw
    return keys


def _check_vapid_pair(private: str, public: str) -> None:
    if not private or not public:
        return
    try:
        scalar = int.from_bytes(b64url_decode(private), "big")
        key = ec.derive_private_key(scalar, ec.SECP256R1())
    except (ValueError, binascii.Error):
        raise ConfigError("VAPID_PRIVATE_KEY is not a base64url P-256 private key") from None
    expected = key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    try:
        given = b64url_decode(public)
    except (ValueError, binascii.Error):
        given = b""
    if given != expected:
        raise ConfigError("VAPID_PUBLIC_KEY does not match VAPID_PRIVATE_KEY")


def _check_signing_key(value: str) -> None:
    # Unset is allowed (exports are then refused, saying why); a malformed key is not.
    if not value:
        return
    try:
        raw = b64url_decode(value)
    except (ValueError, binascii.Error):
        raw = b""
    if len(raw) != 32:
        raise ConfigError("EXPORT_SIGNING_KEY must be a base64url raw 32-byte Ed25519 private key")


def _dev_secrets(instance_path: str) -> dict[str, str]:
    """Secrets for development, generated on first start and kept in the instance folder."""
    folder = Path(instance_path)
    path = folder / _SECRETS_FILE
    if path.exists():
        return json.loads(path.read_text())
    # The instance folder holds these secrets and the SQLite database: its owner only.
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    private, public = generate_vapid_keys()
    values = {
        "SECRET_KEY": secrets.token_urlsafe(48),
        "VAPID_PRIVATE_KEY": private,
        "VAPID_PUBLIC_KEY": public,
        "SUBSCRIPTION_AUTH_KEY_V1": base64.b64encode(secrets.token_bytes(32)).decode(),
        "FEEDBACK_SECRETS": secrets.token_urlsafe(32),
        "IDENTITY_ASSERTION_SECRETS": secrets.token_urlsafe(32),
        "EXPORT_SIGNING_KEY": generate_signing_key(),
    }
    # Written with 0600 and renamed into place so two processes starting together
    # end up with one set of keys.
    tmp = folder / f".{_SECRETS_FILE}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(values, handle, indent=2)
    try:
        os.link(tmp, path)
    except FileExistsError:
        values = json.loads(path.read_text())
    finally:
        tmp.unlink()
    return values


def _flag(environ: Mapping[str, str], name: str, *, default: bool) -> bool:
    value = environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in {"1", "on", "true", "yes"}:
        return True
    if value in {"0", "off", "false", "no"}:
        return False
    raise ConfigError(f"{name} must be 'on' or 'off', not {value!r}")


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    value = environ.get(name, "").strip()
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, not {value!r}") from None
    if number < 0:
        raise ConfigError(f"{name} must not be negative")
    return number


def _positive(environ: Mapping[str, str], name: str, default: int) -> int:
    # Zero would mean "lock at once" or "sessions that never start": always a mistake.
    number = _int(environ, name, default)
    if number == 0:
        raise ConfigError(f"{name} must be at least 1")
    return number


def _lease(environ: Mapping[str, str]) -> float:
    # A zero lease would let every process take every other's claims: duplicates.
    seconds = _float(environ, "DISPATCH_LEASE_SECONDS", 60.0)
    if seconds <= 0:
        raise ConfigError("DISPATCH_LEASE_SECONDS must be more than 0")
    return seconds


def _float(environ: Mapping[str, str], name: str, default: float) -> float:
    value = environ.get(name, "").strip()
    if not value:
        return default
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{name} must be a number, not {value!r}") from None
    if number < 0:
        raise ConfigError(f"{name} must not be negative")
    return number
