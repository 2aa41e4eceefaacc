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
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from portal.delivery.quiet import Window, parse_window

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


_DEFAULT_PORTS = {"http": 80, "https": 443}


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
class _Reading:
    """What the parsers read from: the environment, whether this is production, and the
    development secrets generated into the instance folder (none in production)."""

    environ: Mapping[str, str]
    production: bool
    generated: Mapping[str, str]
    instance_path: str

    def text(self, name: str) -> str:
        return self.environ.get(name, "")

    def secret(self, name: str, default: str = "") -> str:
        """The variable, or its generated development value when unset or empty."""
        value = self.environ.get(name)
        if value is None or value == "":
            return self.generated.get(name, default)
        return value


# A parser turns one variable into its setting's value: (what to read, the variable's
# name, the field's declared default) -> value. It raises ConfigError naming the variable.
Parser = Callable[[_Reading, str, Any], Any]


@dataclass(frozen=True)
class Variable:
    """The environment variable a setting comes from, and how it is read."""

    name: str
    parse: Parser


def setting(name: str, parse: Parser, default: Any = MISSING, *, factory: Any = MISSING) -> Any:
    """A settings field read from the environment variable ``name`` by ``parse``."""
    metadata = {"env": Variable(name, parse)}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _whole(reading: _Reading, name: str, default: int) -> int:
    return _int(reading.environ, name, default)


def _positive_whole(reading: _Reading, name: str, default: int) -> int:
    return _positive(reading.environ, name, default)


def _whole_or_default(reading: _Reading, name: str, default: int) -> int:
    # Zero means "the default" for batch sizes and intervals.
    return _int(reading.environ, name, default) or default


def _number(reading: _Reading, name: str, default: float) -> float:
    return _float(reading.environ, name, default)


def _milliseconds(reading: _Reading, name: str, default: float) -> float:
    """A variable in whole milliseconds, for a setting in seconds."""
    return _int(reading.environ, name, round(default * 1000)) / 1000


def _lease(reading: _Reading, name: str, default: float) -> float:
    # A zero lease would let every process take every other's claims: duplicates.
    seconds = _float(reading.environ, name, default)
    if seconds <= 0:
        raise ConfigError(f"{name} must be more than 0")
    return seconds


def _share(reading: _Reading, name: str, default: float) -> float:
    share = _float(reading.environ, name, default)
    if not 0 < share <= 1:
        raise ConfigError(f"{name} must be more than 0 and at most 1")
    return share


def _niceness(reading: _Reading, name: str, default: int) -> int:
    niceness = _int(reading.environ, name, default)
    if not 0 <= niceness <= 19:
        raise ConfigError(f"{name} must be from 0 to 19")
    return niceness


def _on_off(reading: _Reading, name: str, default: bool) -> bool:
    return _flag(reading.environ, name, default=default)


def _on_in_development(reading: _Reading, name: str, default: bool) -> bool:
    """A switch that is on unless told otherwise in development, off in production."""
    return _flag(reading.environ, name, default=not reading.production)


def _text_or_default(reading: _Reading, name: str, default: str) -> str:
    return reading.text(name).strip() or default


def _text_or_none(reading: _Reading, name: str, default: None) -> str | None:
    return reading.text(name).strip() or None


def _verbatim_or_none(reading: _Reading, name: str, default: None) -> str | None:
    return reading.text(name) or None


def _secret(reading: _Reading, name: str, default: str) -> str:
    return reading.secret(name)


def _secret_list(reading: _Reading, name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(s.strip() for s in reading.secret(name).split(",") if s.strip())


def _vapid_subject(reading: _Reading, name: str, default: str) -> str:
    return reading.secret(name, "" if reading.production else "mailto:admin@localhost")


def _portal_env(reading: _Reading, name: str, default: str) -> str:
    return "production" if reading.production else "development"


def _database_url(reading: _Reading, name: str, default: str) -> str:
    url = reading.environ.get(name) or (
        f"sqlite:///{Path(reading.instance_path).resolve() / 'portal.sqlite3'}"
    )
    return normalise_database_url(url)


def _public_url_setting(reading: _Reading, name: str, default: None) -> str | None:
    return _public_url(reading.text(name), production=reading.production)


def _link_origins_setting(reading: _Reading, name: str, default: tuple[str, ...]) -> tuple:
    return _link_origins(reading.text(name))


def _hosts(reading: _Reading, name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    hosts = tuple(h.strip().lower() for h in reading.text(name).split(",") if h.strip())
    return hosts or default


def _key_version(reading: _Reading, name: str, default: int) -> int:
    text = reading.secret(name, str(default))
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, not {text!r}") from None


def _auth_keys_setting(reading: _Reading, name: str, default: Any) -> dict[int, bytes]:
    return _auth_keys(reading.environ, reading.generated)


# The data keys are numbered: SUBSCRIPTION_AUTH_KEY_V1, SUBSCRIPTION_AUTH_KEY_V2, ...
AUTH_KEY_VARIABLES = "SUBSCRIPTION_AUTH_KEY_V<n>"


@dataclass(frozen=True)
class RetrySettings:
    max_attempts: int = setting("RETRY_MAX_ATTEMPTS", _whole, 5)
    initial_delay: float = setting("RETRY_INITIAL_DELAY_SECONDS", _number, 1.0)
    max_delay: float = setting("RETRY_MAX_DELAY_SECONDS", _number, 64.0)
    backoff_factor: float = setting("RETRY_BACKOFF_FACTOR", _number, 2.0)
    jitter: float = setting("RETRY_JITTER", _number, 0.3)


@dataclass(frozen=True)
class RetentionSettings:
    """How long subscriptions live without a sign of life, and what is kept after."""

    stale_after_days: int = setting("STALE_AFTER_DAYS", _whole, 30)
    expire_stale_after_days: int = setting("EXPIRE_STALE_AFTER_DAYS", _whole, 30)
    tombstone_grace_days: int = setting("TOMBSTONE_GRACE_DAYS", _whole, 7)
    audit_window_months: int = setting("AUDIT_WINDOW_MONTHS", _whole, 13)
    batch_size: int = setting("SWEEP_BATCH_SIZE", _whole_or_default, 1000)
    # The bounded tables (portal/retention/tables.py, docs/configuration.md).
    feedback_digest_days: int = setting("FEEDBACK_DIGEST_RETENTION_DAYS", _positive_whole, 90)
    feedback_marker_days: int = setting("FEEDBACK_MARKER_RETENTION_DAYS", _positive_whole, 30)
    staff_session_days: int = setting("STAFF_SESSION_RETENTION_DAYS", _whole, 1)
    receipt_months: int = setting("RECEIPT_RETENTION_MONTHS", _positive_whole, 13)
    # Deliveries of campaigns finished this long ago are folded into per-campaign counters
    # (portal/campaigns/tally.py); never before the audit window (Settings.from_env).
    delivery_months: int = setting("DELIVERY_RETENTION_MONTHS", _positive_whole, 13)
    # The fold's pause between batches, so sending and pages beside it keep their share
    # of the database (bench/delivery_retention.py); it also stops on replication lag.
    fold_pause_seconds: float = setting("DELIVERY_FOLD_PAUSE_MS", _milliseconds, 0.1)
    # How long making or dropping a month partition of delivery (PostgreSQL) waits for
    # its exclusive lock before giving up until the next run (portal/delivery/partitions.py).
    partition_lock_timeout_ms: int = setting(
        "DELIVERY_PARTITION_LOCK_TIMEOUT_MS", _positive_whole, 5000
    )
    # Job runs: the sequencer alone records one a second (portal/retention/tables.py).
    job_run_days: int = setting("JOB_RUN_RETENTION_DAYS", _positive_whole, 7)
    # Uploaded pictures no campaign or draft uses (portal/retention/tables.py).
    picture_unused_days: int = setting("PICTURE_UNUSED_RETENTION_DAYS", _positive_whole, 30)


@dataclass(frozen=True)
class PictureSettings:
    """Uploads of campaign pictures (portal/campaigns/media.py): at most this many new
    pictures per member of staff in any 24 hours; zero, no limit."""

    uploads_per_day: int = setting("PICTURE_UPLOADS_PER_DAY", _whole, 100)


@dataclass(frozen=True)
class FrequencyCapSettings:
    """At most this many marketing notifications per person (every device together) in
    any 24 hours and in any 7 days; zero turns that cap off. Transactional topics and
    test sends are never capped and never counted (portal/delivery/caps.py)."""

    per_day: int = setting("MARKETING_CAP_PER_DAY", _whole, 0)
    per_week: int = setting("MARKETING_CAP_PER_WEEK", _whole, 0)


def _quiet_window(reading: _Reading, name: str, default: Window | None) -> Window | None:
    text = reading.text(name).strip()
    if not text:
        return default
    found = parse_window(text)
    if found is None:
        raise ConfigError(
            f"{name} must be two different times, from and until, like 21:00-08:00, not {text!r}"
        )
    return found


@dataclass(frozen=True)
class QuietHoursSettings:
    """The portal-wide quiet hours, in each person's time zone: marketing deliveries due
    inside them wait until they end (portal/delivery/quiet.py). Unset: none."""

    # setting() returns a dataclasses.field, and a Window is frozen: nothing is shared.
    window: Window | None = setting("QUIET_HOURS", _quiet_window, None)  # noqa: RUF009


@dataclass(frozen=True)
class ScheduleSettings:
    """Intervals of the embedded scheduler's jobs, in seconds (zero: the default)."""

    dispatch: int = setting("DISPATCH_TICK_SECONDS", _whole_or_default, 5)
    sweep: int = setting("SWEEP_INTERVAL_SECONDS", _whole_or_default, 3600)
    tombstone: int = setting("TOMBSTONE_INTERVAL_SECONDS", _whole_or_default, 3600)
    purge: int = setting("PURGE_INTERVAL_SECONDS", _whole_or_default, 86400)
    reseal: int = setting("RESEAL_INTERVAL_SECONDS", _whole_or_default, 86400)
    verify_log: int = setting("VERIFY_LOG_INTERVAL_SECONDS", _whole_or_default, 86400)
    rate_limit_prune: int = setting("RATE_LIMIT_PRUNE_INTERVAL_SECONDS", _whole_or_default, 600)
    table_retention: int = setting("TABLE_RETENTION_INTERVAL_SECONDS", _whole_or_default, 3600)
    # The consent log's maximum merge delay: how often the sequencer integrates.
    consent_log_sequencer: int = setting(
        "CONSENT_LOG_MAX_MERGE_DELAY_SECONDS", _whole_or_default, 1
    )


@dataclass(frozen=True)
class StaffAuthSettings:
    """Staff sign-in: account lockout, per-address throttle, session lifetimes."""

    lockout_attempts: int = setting("STAFF_LOCKOUT_ATTEMPTS", _positive_whole, 5)
    lockout_minutes: int = setting("STAFF_LOCKOUT_MINUTES", _positive_whole, 15)
    attempts_per_minute: int = setting("STAFF_LOGIN_ATTEMPTS_PER_MINUTE", _positive_whole, 10)
    session_idle_minutes: int = setting("STAFF_SESSION_IDLE_MINUTES", _positive_whole, 30)
    session_max_hours: int = setting("STAFF_SESSION_MAX_HOURS", _positive_whole, 12)


@dataclass(frozen=True)
class RateLimitSettings:
    """Requests to the JSON API per fixed window: per client address and endpoint, and
    per push subscription endpoint; consent receipts per subscriber. Zero turns that
    limit off (load tests)."""

    window_seconds: int = setting("RATE_LIMIT_WINDOW_SECONDS", _positive_whole, 60)
    per_address: int = setting("RATE_LIMIT_PER_ADDRESS", _whole, 300)
    per_endpoint: int = setting("RATE_LIMIT_PER_ENDPOINT", _whole, 60)
    # Consent receipts per subscriber: each one is signed and carries proofs.
    receipts: int = setting("RATE_LIMIT_RECEIPTS", _whole, 20)
    # Preference-centre form saves per subscriber and form: each may append consent
    # events, which are kept for good.
    saves: int = setting("RATE_LIMIT_SAVES", _whole, 60)

    @property
    def enabled(self) -> bool:
        return self.per_address > 0 or self.per_endpoint > 0


@dataclass(frozen=True)
class Settings:
    """Every setting, each field naming the environment variable it is read from."""

    env: str = setting("PORTAL_ENV", _portal_env, "development")
    instance_path: str = "instance"  # where create_app puts the instance folder
    database_url: str = setting("DATABASE_URL", _database_url, "")
    database_connect_timeout: int = setting("DATABASE_CONNECT_TIMEOUT_SECONDS", _positive_whole, 5)
    # Server-side prepared statements (psycopg prepares a statement run five times on one
    # connection). Off: a pooler in transaction mode (PgBouncer before 1.21, or without
    # max_prepared_statements) lends another server connection, which has never heard of
    # it. Turn on only when the app reaches PostgreSQL directly.
    database_prepared_statements: bool = setting("DATABASE_PREPARED_STATEMENTS", _on_off, False)
    secret_key: str = setting("SECRET_KEY", _secret, "")
    vapid_private_key: str = setting("VAPID_PRIVATE_KEY", _secret, "")
    vapid_public_key: str = setting("VAPID_PUBLIC_KEY", _secret, "")
    vapid_subject: str = setting("VAPID_SUBJECT", _vapid_subject, "")
    auth_key_version: int = setting("SUBSCRIPTION_AUTH_KEY_VERSION", _key_version, 1)
    auth_keys: Mapping[int, bytes] = setting(AUTH_KEY_VARIABLES, _auth_keys_setting, factory=dict)
    public_url: str | None = setting("PUBLIC_URL", _public_url_setting, None)
    push_allowed_hosts: tuple[str, ...] = setting("PUSH_ALLOWED_HOSTS", _hosts, DEFAULT_PUSH_HOSTS)
    push_ca_bundle: str | None = setting("PUSH_CA_BUNDLE", _verbatim_or_none, None)
    scheduler: bool = setting("PORTAL_SCHEDULER", _on_off, True)
    feedback_secrets: tuple[str, ...] = setting("FEEDBACK_SECRETS", _secret_list, ())
    feedback_signature_header: str = setting(
        "FEEDBACK_SIGNATURE_HEADER", _text_or_default, "X-CN1-Signature"
    )
    feedback_max_age_seconds: int = setting("FEEDBACK_MAX_AGE_SECONDS", _whole, 300)
    feedback_organization: str | None = setting("FEEDBACK_ORGANIZATION", _text_or_none, None)
    feedback_max_body_bytes: int = setting("FEEDBACK_MAX_BODY_BYTES", _whole, 1024 * 1024)
    feedback_test_url: str | None = setting("FEEDBACK_TEST_URL", _text_or_none, None)
    # Other sites campaign links and icons may point to (the public origin always may).
    campaign_link_origins: tuple[str, ...] = setting(
        "CAMPAIGN_LINK_ORIGINS", _link_origins_setting, ()
    )
    # When set, /metrics answers only "Authorization: Bearer <this>".
    metrics_token: str | None = setting("METRICS_TOKEN", _text_or_none, None)
    export_signing_key: str = setting("EXPORT_SIGNING_KEY", _secret, "")
    # Ed25519, base64url of the 32 raw bytes: signs the consent log's tree heads.
    consent_log_signing_key: str = setting("CONSENT_LOG_SIGNING_KEY", _secret, "")
    # How long a sequence number with no committed event may hold up the tree before
    # the sequencer closes it with a gap event.
    consent_log_gap_grace_seconds: int = setting("CONSENT_LOG_GAP_GRACE_SECONDS", _whole, 10)
    endpoint_max_length: int = setting("PUSH_ENDPOINT_MAX_LENGTH", _whole, 4096)
    api_max_body_bytes: int = setting("API_MAX_BODY_BYTES", _whole, 16 * 1024)
    max_body_bytes: int = setting("MAX_BODY_BYTES", _positive_whole, 1024 * 1024)
    trusted_proxies: int = setting("TRUSTED_PROXIES", _whole, 0)
    rate_limit: RateLimitSettings = field(default_factory=RateLimitSettings)
    last_seen_throttle_seconds: int = setting("LAST_SEEN_THROTTLE_SECONDS", _whole, 3600)
    failures_before_stale: int = setting("PUSH_FAILURES_BEFORE_STALE", _whole, 3)
    retry: RetrySettings = field(default_factory=RetrySettings)
    frequency_caps: FrequencyCapSettings = field(default_factory=FrequencyCapSettings)
    quiet_hours: QuietHoursSettings = field(default_factory=QuietHoursSettings)
    pictures: PictureSettings = field(default_factory=PictureSettings)
    # How long a claimed delivery belongs to its process unless renewed (the sender
    # renews it while sending); past it (the process died) another may send it again.
    dispatch_lease_seconds: float = setting("DISPATCH_LEASE_SECONDS", _lease, 60.0)
    # The share of one CPU a web worker's sender may use (the embedded scheduler beside
    # the pages); `portal scheduler` processes send at full speed.
    dispatch_web_cpu_share: float = setting("DISPATCH_WEB_CPU_SHARE", _share, 0.1)
    # The niceness of a web worker's background job threads (Linux): the kernel gives
    # the pages' threads, in every worker, the CPU first. 0 leaves them as the pages.
    dispatch_web_nice: int = setting("DISPATCH_WEB_NICE", _niceness, 10)
    reseal_batch_size: int = setting("RESEAL_BATCH_SIZE", _whole, 500)
    # The hash backfill rewrites a live table: it pauses between chunks and stops when a
    # replica falls behind (seed 000 §9), so it can run during the day.
    backfill_pause_seconds: float = setting("BACKFILL_PAUSE_MS", _milliseconds, 0.075)
    backfill_max_replication_lag_seconds: float = setting(
        "BACKFILL_MAX_REPLICATION_LAG_SECONDS", _number, 10.0
    )
    staff: StaffAuthSettings = field(default_factory=StaffAuthSettings)
    auto_migrate: bool = setting("PORTAL_AUTO_MIGRATE", _on_in_development, False)
    identity_assertion_secrets: tuple[str, ...] = setting(
        "IDENTITY_ASSERTION_SECRETS", _secret_list, ()
    )
    preference_link_max_age: int = setting(
        "PREFERENCE_LINK_MAX_AGE_SECONDS", _whole, 30 * 24 * 3600
    )
    # How far a decision's client time (the API's decidedAt) may lie from the server
    # clock, before or after.
    decided_at_max_skew_seconds: int = setting(
        "DECIDED_AT_MAX_SKEW_SECONDS", _positive_whole, 24 * 3600
    )
    region_header: str | None = setting("REGION_HEADER", _verbatim_or_none, None)
    # Who a consent receipt names as the controller, and under which law.
    consent_controller_name: str | None = setting("CONSENT_CONTROLLER_NAME", _text_or_none, None)
    consent_controller_contact: str | None = setting(
        "CONSENT_CONTROLLER_CONTACT", _text_or_none, None
    )
    consent_jurisdiction: str | None = setting("CONSENT_JURISDICTION", _text_or_none, None)
    seed_demo_data: bool = setting("PORTAL_DEMO_DATA", _on_in_development, False)
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
        reading = _Reading(
            environ,
            production=production,
            generated={} if production else _dev_secrets(instance_path),
            instance_path=instance_path,
        )
        # The settings the refusals look at come first, so that with several mistakes
        # the first one reported is the same as it always was.
        values = _read(cls, reading, lambda name: name in _CHECKED)
        _check(values, production=production)
        values |= _read(cls, reading, lambda name: name not in _CHECKED)
        retention = values["retention"]
        if retention.delivery_months < retention.audit_window_months:
            # A delivery row is the proof of consent for its send.
            raise ConfigError(
                "DELIVERY_RETENTION_MONTHS must be at least AUDIT_WINDOW_MONTHS "
                f"({retention.audit_window_months}): a delivery is the proof of consent "
                "for its send"
            )
        return cls(**values, instance_path=instance_path)


def _read(cls: type[Any], reading: _Reading, only: Callable[[str], bool]) -> dict[str, Any]:
    """The fields of the settings dataclass ``cls`` that ``only`` accepts, each read by
    its parser; a field holding settings of its own (``retry``, ``staff``...) is built
    the same way."""
    values = {}
    for item in fields(cls):
        if not only(item.name):
            continue
        variable = item.metadata.get("env")
        if variable is not None:
            default = item.default
            if item.default_factory is not MISSING:
                default = item.default_factory()
            values[item.name] = variable.parse(reading, variable.name, default)
        elif item.default_factory is not MISSING and is_dataclass(item.default_factory):
            nested = cast(type[Any], item.default_factory)
            values[item.name] = nested(**_read(nested, reading, lambda name: True))
    return values


def environment_variables() -> frozenset[str]:
    """The name of every environment variable the settings read (the numbered data keys
    as ``SUBSCRIPTION_AUTH_KEY_V<n>``)."""
    names: set[str] = set()

    def collect(cls: type[Any]) -> None:
        for item in fields(cls):
            if (variable := item.metadata.get("env")) is not None:
                names.add(variable.name)
            elif item.default_factory is not MISSING and is_dataclass(item.default_factory):
                collect(cast(type[Any], item.default_factory))

    collect(Settings)
    return frozenset(names)


# What _check looks at, read before every other setting.
_CHECKED = frozenset(
    {
        "secret_key",
        "vapid_private_key",
        "vapid_public_key",
        "vapid_subject",
        "auth_key_version",
        "auth_keys",
        "public_url",
        "feedback_secrets",
        "metrics_token",
        "export_signing_key",
        "consent_log_signing_key",
    }
)


def _check(values: Mapping[str, Any], *, production: bool) -> None:
    """The refusals that look at more than one setting: production's secrets, the data
    key in use, the VAPID pair and subject, the export signing key."""
    version: int = values["auth_key_version"]
    auth_keys: Mapping[int, bytes] = values["auth_keys"]
    if production:
        _require_secret("SECRET_KEY", values["secret_key"])
        _require_secret("VAPID_PRIVATE_KEY", values["vapid_private_key"])
        _require_secret("VAPID_PUBLIC_KEY", values["vapid_public_key"])
        _require_secret("VAPID_SUBJECT", values["vapid_subject"])
        _require_secret(f"SUBSCRIPTION_AUTH_KEY_V{version}", auth_keys.get(version))
        for number, key in sorted(auth_keys.items()):
            _require_data_key(f"SUBSCRIPTION_AUTH_KEY_V{number}", key)
        # Optional (unset disables the receiver), but never a well-known value.
        for secret in values["feedback_secrets"]:
            _require_secret("FEEDBACK_SECRETS", secret)
        if values["metrics_token"] is not None:
            _require_secret("METRICS_TOKEN", values["metrics_token"])
        _require_secret("CONSENT_LOG_SIGNING_KEY", values["consent_log_signing_key"])
    if version not in auth_keys:
        raise ConfigError(
            f"SUBSCRIPTION_AUTH_KEY_V{version} is missing: "
            f"SUBSCRIPTION_AUTH_KEY_VERSION is {version}"
        )
    subject = values["vapid_subject"]
    if subject and not re.match(r"^(mailto:[^@\s]+@[^@\s]+|https://\S+)$", subject):
        raise ConfigError("VAPID_SUBJECT must be a mailto: address or an https: URL")
    _check_vapid_pair(values["vapid_private_key"], values["vapid_public_key"])
    _check_signing_key(values["export_signing_key"])
    if values["consent_log_signing_key"]:
        _check_signing_key(values["consent_log_signing_key"], "CONSENT_LOG_SIGNING_KEY")


def canonical_origin(text: str) -> str | None:
    """``scheme://host[:port]`` as a browser serialises it (lower case, punycode, the
    default port dropped), or None when ``text`` is not an http(s) URL with a host —
    ``null`` included. Path, query and fragment are ignored; credentials are refused."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:  # an unclosed IPv6 bracket, a port out of range
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname or "@" in parts.netloc:
        return None
    host = parts.hostname.rstrip(".")
    if not host:
        return None
    try:
        host = host.encode("idna").decode("ascii")
    except UnicodeError:
        return None
    if ":" in host:  # IPv6
        host = f"[{host}]"
    if port is None or port == _DEFAULT_PORTS[scheme]:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


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


def _check_signing_key(value: str, name: str = "EXPORT_SIGNING_KEY") -> None:
    # Unset is allowed (exports are then refused, saying why); a malformed key is not.
    if not value:
        return
    try:
        raw = b64url_decode(value)
    except (ValueError, binascii.Error):
        raw = b""
    if len(raw) != 32:
        raise ConfigError(f"{name} must be a base64url raw 32-byte Ed25519 private key")


def _dev_secrets(instance_path: str) -> dict[str, str]:
    """Secrets for development, generated on first start and kept in the instance folder."""
    folder = Path(instance_path)
    path = folder / _SECRETS_FILE
    if path.exists():
        stored: dict[str, str] = json.loads(path.read_text())
        if "CONSENT_LOG_SIGNING_KEY" not in stored:
            # An instance folder from before the log key: add it, keeping the rest.
            stored["CONSENT_LOG_SIGNING_KEY"] = generate_signing_key()
            tmp = folder / f".{_SECRETS_FILE}.{os.getpid()}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                json.dump(stored, handle, indent=2)
            tmp.replace(path)
        return stored
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
        "CONSENT_LOG_SIGNING_KEY": generate_signing_key(),
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
