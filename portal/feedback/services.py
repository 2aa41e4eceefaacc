"""The delivery-feedback receiver's rules (SPEC §5, seed 004).

A digest is handled in four steps, each refusing before the next can write:

1. verify the signature over the raw bytes (401, nothing parsed);
2. parse and validate the whole digest (400/422, nothing applied — not even its valid
   events, so the sender is never told a page was taken that was only partly applied);
3. apply it in one transaction: the digest row, then per INVALID_TARGET
   event a marker inserted with ON CONFLICT DO NOTHING and, only when that insert took,
   the revocation — so a duplicate, even a concurrent one, applies nothing twice;
4. commit, and only then answer 200 (a database error answers 503 and the sender retries).

Only ``reason == "INVALID_TARGET"`` removes a target; a ``DEAD`` status says a delivery
job gave up, not that the address is dead.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from portal import metrics
from portal.config import Settings
from portal.consent import log
from portal.consent.models import EventKind
from portal.db import is_postgres, uuid7
from portal.delivery.models import Delivery
from portal.errors import ApiError, ValidationError
from portal.feedback import signature
from portal.feedback.models import DigestResult, FeedbackApplied, FeedbackDigest, Outcome
from portal.seams import current_portal
from portal.subscriptions.models import EndReason, PushSubscription, SubscriptionState
from portal.subscriptions.services import end_subscriptions, ending, find_by_endpoint
from portal.subscriptions.validation import endpoint_hash

if TYPE_CHECKING:
    from flask import Flask

logger = logging.getLogger("portal.feedback")

INVALID_TARGET = "INVALID_TARGET"
_ENDED = (SubscriptionState.REVOKED, SubscriptionState.EXPIRED)
# The sender's own reference implementation accepts only safe integers for ``at``.
_MAX_SAFE_INTEGER = 2**53 - 1
_ORGANIZATION_MAX = 128
_PROVIDER_MAX = 64
_DELIVERY_ID_MAX = 128
_MAX_BIGINT = 2**63 - 1
_applied = cast(sa.Table, FeedbackApplied.__table__)


# --- parsing ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CleanupEvent:
    """An INVALID_TARGET event, validated, with its event key."""

    index: int
    provider: str
    target: str
    delivery_id: str | None
    key: str

    @property
    def key_kind(self) -> str:
        return "delivery" if self.delivery_id is not None else "classic"

    @property
    def key_hash(self) -> bytes:
        return hashlib.sha256(_utf8(self.key)).digest()

    @property
    def target_hash(self) -> bytes:
        # For a web-push target, push_subscription.endpoint_hash of the endpoint however
        # the push service spells it (WNS writes its %-escapes in lower case, the stored
        # canonical form in upper case).
        return endpoint_hash(self.target)


@dataclass(frozen=True)
class Digest:
    organization: str
    events: int
    cleanups: tuple[CleanupEvent, ...]
    ignored: int
    truncated: bool
    events_omitted: int | None


def _utf8(text: str) -> bytes:
    # JSON may carry lone surrogates ("\ud800"); hash them rather than fail on them.
    return text.encode("utf-8", "surrogatepass")


def _utf16_length(text: str) -> int:
    # The key's length field counts UTF-16 code units, as the sender's Java and Node
    # helpers do, so our keys agree with theirs for any target.
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def event_key(event: Mapping[str, Any]) -> tuple[str, str, str | None]:
    """The seed's event key for one INVALID_TARGET event: (key, provider, deliveryId).

    ``delivery:<deliveryId>`` when the event names one of our deliveries, else
    ``classic:<provider>:<len>:<target>:<at>``. A missing provider, target or (for a
    classic event) timestamp is a :class:`ValidationError`: an event we cannot correlate
    must fail the request, never be acknowledged.
    """
    provider = event.get("provider")
    if not isinstance(provider, str) or not provider:
        raise ValidationError("missing_provider", "the event has no provider", "provider")
    target = _target_of(event)
    if target is None:
        raise ValidationError("missing_target", "the event has neither token nor endpoint", "token")
    delivery_id = event.get("deliveryId")
    if delivery_id is not None and not isinstance(delivery_id, str):
        raise ValidationError("invalid_digest", "deliveryId must be a string", "deliveryId")
    if delivery_id:
        return f"delivery:{delivery_id}", provider, delivery_id
    at = event.get("at")
    if isinstance(at, bool) or not isinstance(at, int) or abs(at) > _MAX_SAFE_INTEGER:
        raise ValidationError(
            "missing_timestamp", "an event without deliveryId needs an integer at", "at"
        )
    return f"classic:{provider}:{_utf16_length(target)}:{target}:{at}", provider, None


def _target_of(event: Mapping[str, Any]) -> str | None:
    """``token``, else ``endpoint`` (as the seed's helpers choose), when it is a string."""
    target = event.get("token") or event.get("endpoint")
    return target if isinstance(target, str) and target else None


def _stored_text(value: str, field: str, limit: int) -> str:
    """Text we store: bounded, printable and encodable (PostgreSQL refuses NUL)."""
    if len(value) > limit or not value.isprintable():
        raise ValidationError("invalid_digest", f"{field} is too long or not printable", field)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError("invalid_digest", f"{field} is not valid Unicode", field) from None
    return value


def parse_digest(raw: bytes, *, expected_organization: str | None) -> Digest:
    """Parse and validate a verified digest, all of it, before anything is applied."""
    try:
        data = json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        raise ApiError("invalid_json", "the digest is not valid JSON") from None
    if not isinstance(data, dict):
        raise ApiError("invalid_json", "the digest must be a JSON object")
    organization = _organization(data.get("organization"), expected_organization)
    events = data.get("events")
    if not isinstance(events, list):
        raise ValidationError("invalid_digest", "events must be a list", "events")
    truncated = data.get("truncated", False)
    if not isinstance(truncated, bool):
        raise ValidationError("invalid_digest", "truncated must be true or false", "truncated")
    omitted = data.get("eventsOmitted")
    if omitted is not None and (
        isinstance(omitted, bool) or not isinstance(omitted, int) or not 0 <= omitted < 2**31
    ):
        raise ValidationError("invalid_digest", "eventsOmitted must be a count", "eventsOmitted")
    cleanups = _cleanups(events)
    return Digest(
        organization, len(events), cleanups, len(events) - len(cleanups), truncated, omitted
    )


def _organization(value: object, expected: str | None) -> str:
    if not isinstance(value, str) or not value:
        raise ValidationError("missing_organization", "organization is required", "organization")
    _stored_text(value, "organization", _ORGANIZATION_MAX)
    if expected is not None and value != expected:
        raise ValidationError(
            "unknown_organization", "this receiver serves another organization", "organization"
        )
    return value


def _cleanups(events: list[Any]) -> tuple[CleanupEvent, ...]:
    """The INVALID_TARGET events, each validated; any bad one fails the whole digest."""
    cleanups: list[CleanupEvent] = []
    for index, event in enumerate(events):
        where = f"events[{index}]"
        if not isinstance(event, dict):
            raise ValidationError("invalid_digest", f"{where} must be an object", where)
        if event.get("reason") != INVALID_TARGET:
            # Transient failures, DEAD jobs, anything else: nothing to correlate or remove.
            continue
        try:
            key, provider, delivery_id = event_key(event)
        except ValidationError as error:
            raise ValidationError(
                error.code, f"{where}: {error.message}", f"{where}.{error.field}"
            ) from None
        _stored_text(provider, f"{where}.provider", _PROVIDER_MAX)
        if delivery_id is not None:
            _stored_text(delivery_id, f"{where}.deliveryId", _DELIVERY_ID_MAX)
        target = _target_of(event)
        assert target is not None  # event_key refused the event otherwise
        cleanups.append(CleanupEvent(index, provider, target, delivery_id, key))
    return tuple(cleanups)


# --- applying ---------------------------------------------------------------------------


def subscription_for_delivery(session: Session, delivery_id: str) -> uuid.UUID | None:
    """The subscription one of our deliveries went to, or None when the id is not ours.

    Our delivery ids are ``delivery.id``, sent as a decimal string (the push payload's
    ``deliveryId``); anything else names no delivery of ours. The delivery keeps its
    ``subscription_id`` even after that subscription is purged, so the answer is the
    subscription the failed send went to — never one registered since.
    """
    if not (delivery_id.isascii() and delivery_id.isdigit()) or int(delivery_id) > _MAX_BIGINT:
        return None
    return session.scalar(
        sa.select(Delivery.subscription_id).where(Delivery.id == int(delivery_id))
    )


def _target(session: Session, event: CleanupEvent) -> PushSubscription | None:
    """The subscription the failed delivery went to.

    Found as every look-up by endpoint finds its row, however the push service spells
    it (:func:`portal.subscriptions.services.find_by_endpoint`). A browser
    that registered a replacement since has a new endpoint and so a new row: the old
    failure can only ever reach the old row, never "whatever this person has now".
    """
    sub = find_by_endpoint(session, event.target, lock=True)
    if event.delivery_id is None:
        return sub
    delivered_to = subscription_for_delivery(session, event.delivery_id)
    if delivered_to is not None and (sub is None or sub.id != delivered_to):
        # Our delivery went to another subscription than the one the event's target
        # names: the two records disagree, and revoking on a guess could end the wrong
        # one. (The target is the endpoint we sent to, so normally they agree.)
        logger.warning(
            "feedback for delivery %s names a target that is not its subscription",
            event.delivery_id,
        )
        return None
    return sub


def _outcome(sub: PushSubscription | None) -> Outcome:
    if sub is None:
        return Outcome.UNMATCHED
    if sub.deleted_at is not None or sub.state in _ENDED:
        # Rotated, unsubscribed, expired or erased: it ended first, and how it ended
        # stays the recorded truth.
        return Outcome.ALREADY_ENDED
    return Outcome.REVOKED


def _mark(
    session: Session,
    organization: str,
    event: CleanupEvent,
    *,
    outcome: Outcome,
    subscription_id: uuid.UUID | None,
    digest_id: uuid.UUID,
    now: dt.datetime,
) -> bool:
    """Insert the event's marker; False when it already exists (a duplicate)."""
    insert = (postgresql.insert if is_postgres(session) else sqlite.insert)(_applied)
    statement = insert.values(
        id=uuid7(),
        organization=organization,
        event_key_hash=event.key_hash,
        key_kind=event.key_kind,
        delivery_id=event.delivery_id,
        provider=event.provider,
        target_hash=event.target_hash,
        outcome=outcome.value,
        subscription_id=subscription_id,
        digest_id=digest_id,
        applied_at=now,
    ).on_conflict_do_nothing(index_elements=[_applied.c.organization, _applied.c.event_key_hash])
    # RETURNING says whether this insert wrote the row (an INSERT's rowcount needs
    # preserve_rowcount on PostgreSQL: portal.db.affected_rows).
    return session.execute(statement.returning(_applied.c.id)).first() is not None


def revoke_subscription(
    session: Session,
    sub: PushSubscription,
    *,
    now: dt.datetime,
    organization: str,
    event: CleanupEvent,
) -> None:
    """Revoke a subscription its push provider reported invalid, and log it."""
    extra = {"organization": organization, "provider": event.provider, "reason": INVALID_TARGET}
    if event.delivery_id is not None:
        extra["delivery"] = event.delivery_id
    end_subscriptions(
        session,
        [ending(sub)],
        state=SubscriptionState.REVOKED,
        reason=EndReason.REVOKED_BY_FEEDBACK,
        # The caller checked it had not ended (_outcome): how it ended stays the truth.
        from_states=(SubscriptionState.PENDING, SubscriptionState.ACTIVE, SubscriptionState.STALE),
        now=now,
        event=EventKind.REVOKED_BY_FEEDBACK,
        context=log.Context(screen="delivery-feedback", extra=extra),
    )


@dataclass(frozen=True)
class DigestReport:
    id: uuid.UUID
    organization: str
    events: int
    applied: int
    revoked: int
    duplicates: int
    ignored: int
    truncated: bool
    events_omitted: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "organization": self.organization,
            "events": self.events,
            "applied": self.applied,
            "revoked": self.revoked,
            "duplicates": self.duplicates,
            "ignored": self.ignored,
            "truncated": self.truncated,
            "eventsOmitted": self.events_omitted,
        }


def apply_digest(
    session: Session,
    digest: Digest,
    *,
    now: dt.datetime,
    secret_index: int,
    signed_at: dt.datetime | None,
) -> DigestReport:
    """Apply a validated digest in the caller's transaction (which commits it).

    Markers are kept for INVALID_TARGET events only — the events that can change
    anything — whatever their outcome (revoked, unmatched, already ended), so a replay
    of any of them counts as a duplicate. Other events change nothing, need no
    idempotence and are only counted.
    """
    row = FeedbackDigest(
        id=uuid7(),
        received_at=now,
        organization=digest.organization,
        result=DigestResult.ACCEPTED.value,
        secret_index=secret_index,
        signed_at=signed_at,
        events=digest.events,
        ignored=digest.ignored,
        truncated=digest.truncated,
        events_omitted=digest.events_omitted,
    )
    session.add(row)
    session.flush()
    applied = revoked = duplicates = 0
    for event in digest.cleanups:
        sub = _target(session, event)
        outcome = _outcome(sub)
        if not _mark(
            session,
            digest.organization,
            event,
            outcome=outcome,
            subscription_id=sub.id if sub is not None else None,
            digest_id=row.id,
            now=now,
        ):
            duplicates += 1
            continue
        applied += 1
        if outcome is Outcome.REVOKED and sub is not None:
            revoke_subscription(
                session, sub, now=now, organization=digest.organization, event=event
            )
            revoked += 1
    row.applied, row.revoked, row.duplicates = applied, revoked, duplicates
    session.flush()
    return DigestReport(
        row.id,
        digest.organization,
        digest.events,
        applied,
        revoked,
        duplicates,
        digest.ignored,
        digest.truncated,
        digest.events_omitted,
    )


# --- receiving --------------------------------------------------------------------------


@dataclass(frozen=True)
class Receipt:
    """The answer to the sender: only a 200 advances its watermark."""

    status: int
    body: dict[str, Any]


def _from_millis(value: int) -> dt.datetime | None:
    try:
        return dt.datetime.fromtimestamp(value / 1000, tz=dt.UTC)
    except (OverflowError, OSError, ValueError):
        return None


def count_rejection(reason: str) -> None:
    metrics.feedback_digests.labels(DigestResult.REJECTED.value).inc()
    metrics.feedback_rejections.labels(reason).inc()


def _record_rejection(sessions: sessionmaker[Session], **values: Any) -> None:
    """Note a refused digest (counts and reason, never the body) on its own transaction.

    Best effort: when the database is the reason, this fails too and is only logged.
    """
    try:
        with sessions() as session, session.begin():
            session.add(FeedbackDigest(result=DigestResult.REJECTED.value, **values))
    except SQLAlchemyError:
        logger.warning("could not record a rejected feedback digest", exc_info=True)


def receive(
    raw: bytes,
    header: str | None,
    *,
    settings: Settings,
    now: dt.datetime,
    sessions: sessionmaker[Session],
) -> Receipt:
    """Verify, validate, apply and commit one digest; the answer says which step refused.

    Unsigned or badly signed requests are counted in metrics but not written down, so
    no one without the secret can add rows. Signed digests that are refused are
    recorded with their reason, for the operations page.
    """
    try:
        if not settings.feedback_secrets:
            raise signature.SignatureError(
                "not_configured", "the feedback receiver has no FEEDBACK_SECRETS configured"
            )
        parsed = signature.parse_header(header)
        secret_index = signature.verify(
            parsed,
            raw,
            settings.feedback_secrets,
            now_ms=int(now.timestamp() * 1000),
            max_age_seconds=settings.feedback_max_age_seconds,
        )
    except signature.SignatureError as error:
        count_rejection(error.reason)
        return Receipt(401, ApiError(error.reason, error.message).to_json())
    signed_at = _from_millis(parsed.timestamp_ms)

    try:
        digest = parse_digest(raw, expected_organization=settings.feedback_organization)
    except ApiError as error:
        count_rejection(error.code)
        organization = _organization_hint(raw)
        _record_rejection(
            sessions,
            received_at=now,
            organization=organization,
            reason=error.code,
            secret_index=secret_index,
            signed_at=signed_at,
        )
        return Receipt(error.status, error.to_json())

    try:
        with sessions() as session, session.begin():
            report = apply_digest(
                session, digest, now=now, secret_index=secret_index, signed_at=signed_at
            )
    except SQLAlchemyError:
        logger.exception("feedback digest not applied; answering 503 so the sender retries")
        count_rejection("unavailable")
        _record_rejection(
            sessions,
            received_at=now,
            organization=digest.organization,
            reason="unavailable",
            secret_index=secret_index,
            signed_at=signed_at,
            events=digest.events,
            truncated=digest.truncated,
            events_omitted=digest.events_omitted,
        )
        unavailable = ApiError(
            "unavailable", "the digest was not applied; send it again later", status=503
        )
        return Receipt(503, unavailable.to_json())

    # Committed: now, and only now, the digest counts as accepted.
    metrics.feedback_digests.labels(DigestResult.ACCEPTED.value).inc()
    metrics.feedback_events.labels("applied").inc(report.applied)
    metrics.feedback_events.labels("duplicate").inc(report.duplicates)
    metrics.feedback_events.labels("ignored").inc(report.ignored)
    metrics.feedback_revocations.inc(report.revoked)
    logger.info(
        "feedback digest %s from %s: %d events, %d applied, %d revoked, %d duplicates",
        report.id,
        report.organization,
        report.events,
        report.applied,
        report.revoked,
        report.duplicates,
    )
    return Receipt(200, report.to_json())


def _organization_hint(raw: bytes) -> str | None:
    """The organization a refused (but signed) digest claims, when it is storable."""
    try:
        data = json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        return None
    value = data.get("organization") if isinstance(data, dict) else None
    if not isinstance(value, str) or not value:
        return None
    try:
        return _stored_text(value, "organization", _ORGANIZATION_MAX)
    except ValidationError:
        return None


# --- operations -------------------------------------------------------------------------


def recent_digests(session: Session, limit: int = 50) -> Sequence[FeedbackDigest]:
    """The latest digests received, newest first, for the operations page."""
    return session.scalars(
        sa.select(FeedbackDigest).order_by(FeedbackDigest.received_at.desc()).limit(limit)
    ).all()


TEST_ORGANIZATION = "portal-test"


def build_test_digest(settings: Settings, now: dt.datetime) -> bytes:
    """A small digest that exercises the whole receiver without touching a subscription.

    Its INVALID_TARGET event names an endpoint under the reserved ``.invalid`` domain,
    which no subscription can have, so it applies as ``unmatched``; the transient
    failure beside it is ignored.
    """
    now_ms = int(now.timestamp() * 1000)
    marker = uuid.uuid4().hex
    body = {
        "organization": settings.feedback_organization or TEST_ORGANIZATION,
        "test": True,
        "events": [
            {
                "deliveryId": f"test-{marker}",
                "provider": "webpush",
                "endpoint": f"https://feedback-test.invalid/{marker}",
                "status": "FAILED",
                "reason": INVALID_TARGET,
                "attempts": 1,
                "at": now_ms,
            },
            {
                "provider": "webpush",
                "endpoint": f"https://feedback-test.invalid/{marker}/transient",
                "status": "DEAD",
                "reason": "PROVIDER_UNAVAILABLE",
                "attempts": 5,
                "at": now_ms,
            },
        ],
        "truncated": False,
        "eventsOmitted": 0,
    }
    return json.dumps(body, separators=(",", ":")).encode()


def send_test_digest(app: Flask) -> tuple[int, dict[str, Any]]:
    """Sign a test digest with the first secret and send it to the receiver.

    To ``FEEDBACK_TEST_URL`` over HTTP when set (the whole path: proxy, TLS, routing),
    else through the application itself. Returns the answer's status and JSON body;
    status 0 when no HTTP answer came back. Call it outside an open database
    transaction: on SQLite the receiver needs the write lock.
    """
    portal = current_portal(app)
    settings = portal.settings
    now = portal.clock.now()
    raw = build_test_digest(settings, now)
    headers = {"Content-Type": "application/json"}
    if settings.feedback_secrets:
        headers[settings.feedback_signature_header] = signature.header_value(
            settings.feedback_secrets[0], int(now.timestamp() * 1000), raw
        )
    if settings.feedback_test_url:
        import requests

        try:
            response = requests.post(
                settings.feedback_test_url, data=raw, headers=headers, timeout=10
            )
        except requests.RequestException as error:
            return 0, ApiError("unreachable", str(error)).to_json()
        try:
            body = response.json()
        except ValueError:
            body = {"text": response.text[:500]}
        return response.status_code, body if isinstance(body, dict) else {"body": body}
    client = app.test_client()
    answer = client.post("/api/push/feedback", data=raw, headers=headers)
    return answer.status_code, answer.get_json(silent=True) or {}
