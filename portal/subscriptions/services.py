"""The subscription registry: upsert, heartbeat, endpoint change, unsubscribe (seed 000 §6).

Plain functions over a session. They validate nothing (the caller passed validated
values) and commit nothing: the caller owns the transaction. Each one that names a
subscription by its endpoint acts only for the browser that holds it
(:mod:`portal.subscriptions.possession`), checked under the endpoint's lock, so no request can
slip in between the check and the write.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from portal.campaigns.testdevice_models import TestDevice
from portal.consent import log
from portal.consent.models import EventKind, Source
from portal.db import is_postgres, uuid7
from portal.delivery import quiet
from portal.errors import ApiError
from portal.metrics import subscription_upserts
from portal.subscriptions.models import (
    EndReason,
    PushSubscription,
    Subscriber,
    SubscriptionState,
    subscription_state_type,
)
from portal.subscriptions.possession import NotYourSubscription, Proof, holds
from portal.subscriptions.sealing import KeyRing
from portal.subscriptions.validation import ValidSubscription, lookup_hashes
from portal.useragent import family

_t = cast(sa.Table, PushSubscription.__table__)


@dataclass(frozen=True)
class Registration:
    """Who registers, and from where: request context the upsert stores."""

    origin: str
    user_agent: str | None = None
    locale: str | None = None
    subscriber_id: uuid.UUID | None = None  # from a signed cookie or a known endpoint
    device_id: uuid.UUID | None = None  # the subscription the device cookie names
    source: str = Source.API.value
    screen: str | None = None
    region_code: str | None = None  # from a trusted edge header, when configured
    time_zone: str | None = None  # the browser's, checked (campaigns.zones.browser_zone)
    policy_version: str | None = None  # the published notice the page showed, if it says

    def context(self, **extra: str) -> log.Context:
        return log.Context(screen=self.screen, client=family(self.user_agent), extra=extra or None)


@dataclass(frozen=True)
class UpsertResult:
    id: uuid.UUID
    state: SubscriptionState
    inserted: bool
    subscriber_id: uuid.UUID
    previous_state: SubscriptionState | None  # None when inserted
    subscriber_created: bool
    became_live: bool  # inserted, or back from revoked, expired or a tombstone


def _state(value: SubscriptionState) -> sa.ColumnElement[Any]:
    # An explicit cast: PostgreSQL will not unify a bare parameter with the enum in CASE.
    return sa.cast(sa.literal(value.value), subscription_state_type)


def _next_state_on_register() -> sa.ColumnElement[Any]:
    """Never downgrade: revoked/expired → pending; stale → active if it ever succeeded,
    else pending; pending and active stay as they are."""
    return sa.case(
        (_t.c.state.in_(["revoked", "expired"]), _state(SubscriptionState.PENDING)),
        (
            _t.c.state == "stale",
            sa.case(
                (_t.c.last_success_at.is_not(None), _state(SubscriptionState.ACTIVE)),
                else_=_state(SubscriptionState.PENDING),
            ),
        ),
        else_=_t.c.state,
    )


def find_by_endpoint(
    session: Session, endpoint: str, *, lock: bool = False
) -> PushSubscription | None:
    """The subscription an endpoint names, however it is spelled: the row with the hash
    of its canonical form, else one stored with exactly this text before endpoints were
    canonical. With ``lock``, the rows found are locked until COMMIT and read afresh."""
    hashes = lookup_hashes(endpoint)
    query = sa.select(PushSubscription).where(PushSubscription.endpoint_hash.in_(hashes))
    if lock:
        query = query.with_for_update().execution_options(populate_existing=True)
    found = {row.endpoint_hash: row for row in session.scalars(query)}
    return next((found[h] for h in hashes if h in found), None)


def _lock_row(session: Session, sub: PushSubscription) -> None:
    """Lock the subscription's row until COMMIT and read it afresh: its lifecycle events
    follow the state read here (the per-row rule that replaced the global chain lock)."""
    session.refresh(sub, with_for_update=True)


def held_by_endpoint(
    session: Session, endpoint: str, proof: Proof, *, keys: KeyRing, field: str = "endpoint"
) -> PushSubscription:
    """The subscription at this endpoint, when the request holds it; otherwise
    :class:`NotYourSubscription`, alike for an endpoint nobody registered."""
    sub = find_by_endpoint(session, endpoint)
    if sub is None or not holds_subscription(sub, proof, keys=keys):
        raise NotYourSubscription(field)
    return sub


def holds_subscription(sub: PushSubscription, proof: Proof, *, keys: KeyRing) -> bool:
    return holds(
        proof,
        subscription_id=sub.id,
        auth_sealed=sub.auth_sealed,
        auth_key_version=sub.auth_key_version,
        keys=keys,
    )


def held_as_test_device(session: Session, endpoint: str, proof: Proof, *, keys: KeyRing) -> bool:
    """True when this browser shows it holds a test device's subscription (its auth
    secret: a test device has no device cookie) that its push service has not dropped."""
    if proof.auth is None:
        return False
    devices = session.execute(
        sa.select(TestDevice.auth_sealed, TestDevice.auth_key_version).where(
            TestDevice.endpoint_hash.in_(lookup_hashes(endpoint)), TestDevice.gone_at.is_(None)
        )
    )
    return any(
        holds(
            Proof(auth=proof.auth),
            subscription_id=uuid.UUID(int=0),
            auth_sealed=sealed,
            auth_key_version=version,
            keys=keys,
        )
        for sealed, version in devices
    )


def _live_subscriber(session: Session, subscriber_id: uuid.UUID | None) -> uuid.UUID | None:
    if subscriber_id is None:
        return None
    return session.execute(
        sa.select(Subscriber.id).where(
            Subscriber.id == subscriber_id, Subscriber.erased_at.is_(None)
        )
    ).scalar_one_or_none()


def upsert_subscription(
    session: Session,
    subscription: ValidSubscription,
    registration: Registration,
    *,
    keys: KeyRing,
    now: dt.datetime,
    record_events: bool = True,
    field: str = "subscription.endpoint",
) -> UpsertResult:
    """Insert or refresh the subscription addressed by the endpoint's hash.

    An endpoint already registered is refreshed only for the browser that holds it: its
    device cookie names the row, or the subscription carries the row's own auth secret
    (the same browser after clearing its cookies). Anyone else gets
    :class:`NotYourSubscription` and nothing is written: no keys overwritten, no
    subscriber inherited or moved. A browser never legitimately brings new keys for an
    endpoint it already has — a new subscription gets a new endpoint from its push
    service — so different keys without the device cookie are someone else's.

    The subscriber is the one named by the registration when it is live; otherwise the
    one already on the row (unless erased: erasure means nothing is inherited);
    otherwise a new anonymous subscriber. Two requests racing to insert the same new
    endpoint both end on the same row and the same subscriber.

    A subscription that becomes live (new, or back from an end) logs the browser's
    permission grant and the subscription itself as consent events, against the notice
    version the registration says the page showed (validated by the caller).
    """
    digest = subscription.endpoint.hash
    # Requests registering the same endpoint take turns (no global lock: others do not
    # wait), and the row read below is locked until COMMIT, so the state the events'
    # previous_state comes from cannot change under this transaction.
    log.lock_resource(session, "push-endpoint", digest)
    existing_query = (
        sa.select(
            _t.c.id,
            _t.c.state,
            _t.c.subscriber_id,
            _t.c.deleted_at,
            _t.c.auth_sealed,
            _t.c.auth_key_version,
            Subscriber.erased_at,
        )
        .select_from(_t.outerjoin(Subscriber, Subscriber.id == _t.c.subscriber_id))
        .where(_t.c.endpoint_hash == digest)
    )
    if is_postgres(session):
        existing_query = existing_query.with_for_update(of=_t)
    existing = session.execute(existing_query).one_or_none()
    if existing is not None and not holds(
        Proof(registration.device_id, subscription.auth),
        subscription_id=existing.id,
        auth_sealed=existing.auth_sealed,
        auth_key_version=existing.auth_key_version,
        keys=keys,
    ):
        raise NotYourSubscription(field)

    subscriber_id = _live_subscriber(session, registration.subscriber_id)
    given = subscriber_id is not None
    created = False
    if (
        subscriber_id is None
        and existing is not None
        and existing.subscriber_id is not None
        and existing.erased_at is None
    ):
        subscriber_id, given = existing.subscriber_id, True
    if subscriber_id is None:
        subscriber_id = uuid7()
        session.add(
            Subscriber(
                id=subscriber_id,
                created_at=now,
                locale=registration.locale,
                region_code=registration.region_code,
                time_zone=registration.time_zone,
            )
        )
        session.flush()
        created = True
        # An existing row whose subscriber was erased (or that has none) takes the new
        # one; only a brand-new row may keep whatever a racing insert put there.
        given = existing is not None
    elif registration.time_zone is not None:
        # The latest browser to subscribe says where the person is now.
        session.execute(
            sa.update(Subscriber)
            .where(
                Subscriber.id == subscriber_id,
                Subscriber.time_zone.is_distinct_from(registration.time_zone),
            )
            .values(time_zone=registration.time_zone)
        )

    sealed = keys.seal(subscription.auth)
    values = {
        "id": uuid7(),
        "endpoint": subscription.endpoint.endpoint,
        "endpoint_hash": digest,
        "push_service": subscription.endpoint.push_service.value,
        "p256dh": subscription.p256dh,
        "auth_sealed": sealed.sealed,
        "auth_key_version": sealed.key_version,
        "content_encoding": "aes128gcm",
        "expiration_time": subscription.expiration_time,
        "subscriber_id": subscriber_id,
        "user_agent": (registration.user_agent or "")[:400] or None,
        "locale": registration.locale,
        "origin": registration.origin[:255],
        "state": SubscriptionState.PENDING,
        "created_at": now,
        "last_seen_at": now,
        "consecutive_failures": 0,
    }
    postgres = is_postgres(session)
    insert = (postgresql.insert if postgres else sqlite.insert)(_t).values(**values)
    excluded = insert.excluded
    subscriber_value = (
        excluded.subscriber_id
        if given
        else sa.func.coalesce(_t.c.subscriber_id, excluded.subscriber_id)
    )
    returning: list[sa.ColumnElement[Any]] = [_t.c.id, _t.c.state, _t.c.subscriber_id]
    if postgres:
        # xmax = 0 only on a row this statement inserted.
        returning.append(sa.literal_column("(xmax = 0)").label("inserted"))
    statement = insert.on_conflict_do_update(
        index_elements=[_t.c.endpoint_hash],
        set_={
            "endpoint": excluded.endpoint,
            "p256dh": excluded.p256dh,
            "auth_sealed": excluded.auth_sealed,
            "auth_key_version": excluded.auth_key_version,
            "expiration_time": excluded.expiration_time,
            "subscriber_id": subscriber_value,
            "user_agent": excluded.user_agent,
            "locale": excluded.locale,
            "origin": excluded.origin,
            "last_seen_at": excluded.last_seen_at,
            "deleted_at": None,
            "revoked_at": None,
            "end_reason": None,
            "ended_at": None,
            "stale_at": None,
            "browser_told_at": None,
            "consecutive_failures": 0,
            "state": _next_state_on_register(),
        },
    ).returning(*returning)
    row = session.execute(statement).one()
    # On SQLite every transaction holds the write lock from its start, so the row
    # read above cannot have appeared or vanished since.
    inserted = bool(row.inserted) if postgres else existing is None
    if created and row.subscriber_id != subscriber_id:
        # Lost a race to another request that inserted this endpoint first.
        session.execute(sa.delete(Subscriber).where(Subscriber.id == subscriber_id))
        created = False
    subscription_upserts.labels("inserted" if inserted else "updated").inc()
    previous = None if inserted or existing is None else SubscriptionState(existing.state)
    became_live = (
        inserted
        or existing is None
        or existing.deleted_at is not None
        or previous in (SubscriptionState.REVOKED, SubscriptionState.EXPIRED)
    )
    if became_live and record_events:
        context = registration.context()
        grant, _subscribed = log.append_many(
            session,
            [
                log.NewEvent(
                    kind=EventKind.PERMISSION_GRANTED,
                    subscriber_id=row.subscriber_id,
                    subscription_id=row.id,
                    new_state="granted",
                    source=registration.source,
                    policy_version=registration.policy_version,
                    actor="subscriber",
                    recorded_at=now,
                    context=context,
                ),
                log.NewEvent(
                    kind=EventKind.SUBSCRIBED,
                    subscriber_id=row.subscriber_id,
                    subscription_id=row.id,
                    previous_state=previous.value if previous else None,
                    new_state=SubscriptionState(row.state).value,
                    source=registration.source,
                    policy_version=registration.policy_version,
                    actor="subscriber",
                    recorded_at=now,
                    context=context,
                ),
            ],
        )
        session.execute(sa.update(_t).where(_t.c.id == row.id).values(grant_event_seq=grant))
    return UpsertResult(
        id=row.id,
        state=SubscriptionState(row.state),
        inserted=inserted,
        subscriber_id=row.subscriber_id,
        previous_state=previous,
        subscriber_created=created,
        became_live=became_live,
    )


@dataclass(frozen=True)
class HeartbeatResult:
    state: str
    action: str  # none | resubscribe | unsubscribe
    subscription: PushSubscription | None


def heartbeat(
    session: Session,
    endpoint: str,
    proof: Proof,
    *,
    subscriber_id: uuid.UUID | None,
    keys: KeyRing,
    now: dt.datetime,
    throttle: dt.timedelta,
) -> HeartbeatResult:
    """The page says the browser still holds this subscription.

    Refreshes ``last_seen_at`` at most once per ``throttle``, revives a stale row (this
    is the sign of life it lacked), and tells the browser what to do next.

    Only for the browser that holds it. For any other endpoint — one nobody registered,
    or one this browser cannot show is its own — the state is "unknown" and nothing is
    written: the caller learns no one's state and cannot keep a dead subscription alive
    or mark an erased one as told. The action then depends on the caller alone (its
    ``subscriber_id`` cookie), never on the endpoint: a browser of a person who agreed
    (a live subscriber) renews, and the new subscription joins them — a change the worker
    could not report, say; any other lets go, rather than register again unasked a
    subscription no one can tie to consent (a tombstone after its cookies were cleared,
    one purged long after it ended).
    """
    sub = find_by_endpoint(session, endpoint)
    if sub is None or not holds_subscription(sub, proof, keys=keys):
        known = _live_subscriber(session, subscriber_id) is not None
        if not known and held_as_test_device(session, endpoint, proof, keys=keys):
            # A staff member's test device (portal/campaigns/testdevices.py), not a
            # subscription: the browser keeps it, and nothing here changes.
            return HeartbeatResult("unknown", "none", None)
        return HeartbeatResult("unknown", "resubscribe" if known else "unsubscribe", None)
    if sub.deleted_at is not None or sub.state == SubscriptionState.REVOKED:
        # Erased, unsubscribed or revoked: the browser must drop its subscription, or the
        # next registration would silently recreate the relationship.
        if sub.browser_told_at is None:
            sub.browser_told_at = now
        return HeartbeatResult(sub.state.value, "unsubscribe", sub)
    expired = sub.expiration_time is not None and sub.expiration_time <= now
    if sub.state == SubscriptionState.EXPIRED or expired:
        return HeartbeatResult(SubscriptionState.EXPIRED.value, "resubscribe", sub)
    if sub.state == SubscriptionState.STALE:
        sub.state = SubscriptionState.ACTIVE if sub.last_success_at else SubscriptionState.PENDING
        sub.stale_at = None
        sub.last_seen_at = now
    elif sub.last_seen_at <= now - throttle:
        session.execute(
            sa.update(PushSubscription)
            .where(PushSubscription.id == sub.id, PushSubscription.last_seen_at <= now - throttle)
            .values(last_seen_at=now)
            .execution_options(synchronize_session=False)
        )
        sub.last_seen_at = now
    return HeartbeatResult(sub.state.value, "none", sub)


class DeviceStatus(enum.StrEnum):
    """What the server holds for one browser's subscription, in the words its pages use.

    Only ever told to the browser that holds the subscription; anyone else hears
    ``unknown``, as for an endpoint nobody registered."""

    RECEIVING = "receiving"  # live: campaigns it agreed to reach it
    STOPPED = "stopped"  # unsubscribed, revoked by its push service, or replaced
    ERASED = "erased"  # its person's data was erased
    EXPIRED = "expired"  # the push service's subscription ran out: the browser renews it
    UNKNOWN = "unknown"  # nothing of this browser's (never registered, purged, not proven)


def status_of(sub: PushSubscription | None, *, now: dt.datetime) -> DeviceStatus:
    """The one rule from a subscription row to what its browser is told about it."""
    if sub is None:
        return DeviceStatus.UNKNOWN
    if sub.end_reason == EndReason.ERASED.value:
        return DeviceStatus.ERASED
    if sub.deleted_at is not None or sub.state == SubscriptionState.REVOKED:
        return DeviceStatus.STOPPED
    expired = sub.expiration_time is not None and sub.expiration_time <= now
    if sub.state == SubscriptionState.EXPIRED or expired:
        return DeviceStatus.EXPIRED
    return DeviceStatus.RECEIVING


@dataclass(frozen=True)
class StatusResult:
    status: DeviceStatus
    action: str  # none | resubscribe | unsubscribe


def device_status(
    session: Session,
    endpoint: str,
    proof: Proof,
    *,
    keys: KeyRing,
    now: dt.datetime,
    throttle: dt.timedelta,
) -> StatusResult:
    """A page asks, on load, what the server holds for the subscription its browser
    holds, to show the truth (``POST /api/push/status``).

    It is the heartbeat answered in full: the holder's sign of life is recorded as the
    heartbeat records it (a stale row revived, ``last_seen_at``, ``browser_told_at`` for
    an ended one the browser now drops). Anyone who cannot show they hold the
    subscription hears ``unknown`` and writes nothing, as for an endpoint nobody
    registered: an endpoint alone reveals no state, person or topic. ``unknown`` always
    means "let go": the page then offers to subscribe again, rather than registering
    unasked a subscription the server cannot tie to consent.
    """
    beat = heartbeat(
        session, endpoint, proof, subscriber_id=None, keys=keys, now=now, throttle=throttle
    )
    status = status_of(beat.subscription, now=now)
    return StatusResult(status, beat.action)


def status_of_device(
    session: Session, device_id: uuid.UUID | None, *, now: dt.datetime
) -> DeviceStatus:
    """What the server knows of the subscription a browser's device cookie names: what a
    page says without JavaScript, before (or instead of) asking with the subscription."""
    if device_id is None:
        return DeviceStatus.UNKNOWN
    return status_of(session.get(PushSubscription, device_id), now=now)


@dataclass(frozen=True)
class Ending:
    """A subscription to end, with what its consent event records."""

    id: uuid.UUID
    subscriber_id: uuid.UUID | None
    previous_state: str


def end_subscriptions(
    session: Session,
    endings: Sequence[Ending],
    *,
    state: SubscriptionState,
    reason: EndReason,
    from_states: Collection[SubscriptionState],
    now: dt.datetime,
    event: EventKind | None,
    source: str = Source.SYSTEM.value,
    actor: str = "system",
    context: log.Context | None = None,
    undeleted_only: bool = False,
    values: Mapping[str, Any] | None = None,
) -> set[uuid.UUID]:
    """End subscriptions (revoked or expired, and why) and log each in the consent log.

    Only those still in one of ``from_states`` end (and, with ``undeleted_only``, not
    tombstoned); one already ended the same way (state and reason) is left as it is.
    One UPDATE for them all, then one ``event`` per subscription that ended and belongs
    to a subscriber, in the order given (none when ``event`` is None: the caller records
    what happened in its own terms). ``values`` are further columns to set. Returns the
    ids that ended; subscriptions loaded in the session see the change.
    """
    if not endings:
        return set()
    target = PushSubscription
    where = [
        target.id.in_([ending.id for ending in endings]),
        target.state.in_([s.value for s in from_states]),
        sa.or_(
            target.state != state.value,
            target.end_reason.is_(None),
            target.end_reason != reason.value,
        ),
    ]
    if undeleted_only:
        where.append(target.deleted_at.is_(None))
    changes: dict[str, Any] = {"state": state, "end_reason": reason.value, "ended_at": now}
    if state is SubscriptionState.REVOKED:
        changes["revoked_at"] = sa.func.coalesce(target.revoked_at, now)
    changes |= values or {}
    ended = set(
        session.execute(
            sa.update(target)
            .where(*where)
            .values(**changes)
            .returning(target.id)
            .execution_options(synchronize_session="fetch")
        ).scalars()
    )
    if event is not None:
        log.append_many(
            session,
            [
                log.NewEvent(
                    kind=event,
                    subscriber_id=ending.subscriber_id,
                    subscription_id=ending.id,
                    previous_state=ending.previous_state,
                    new_state=state.value,
                    source=source,
                    actor=actor,
                    recorded_at=now,
                    context=context,
                )
                for ending in endings
                if ending.id in ended and ending.subscriber_id is not None
            ],
        )
    return ended


def ending(sub: PushSubscription) -> Ending:
    return Ending(sub.id, sub.subscriber_id, SubscriptionState(sub.state).value)


@dataclass(frozen=True)
class ChangeResult:
    new: UpsertResult
    old: PushSubscription | None
    moved: bool


# How a subscription ends by someone's choice rather than by its push service: a
# rotation of it must not bring it back.
_ENDED_BY_CHOICE = frozenset({EndReason.UNSUBSCRIBED.value, EndReason.ERASED.value})


class SubscriptionEnded(ApiError):
    """The browser holds a subscription its person ended (unsubscribed, or erased): its
    push service's new endpoint takes nothing over and registers nothing (410); only the
    person's own choice on the page subscribes again."""

    status = 410

    def __init__(self, field: str) -> None:
        super().__init__(
            "subscription_ended",
            "this subscription was ended by its person: only their own choice subscribes again",
            field,
        )


def ended_by_choice(session: Session, sub: PushSubscription) -> bool:
    """Whether someone ended this subscription (its person unsubscribed, or was erased),
    rather than its push service. A tombstone keeps how it ended; one that had ended
    otherwise before its person was erased is the erased person's all the same."""
    if sub.end_reason in _ENDED_BY_CHOICE:
        return True
    person = session.get(Subscriber, sub.subscriber_id) if sub.subscriber_id else None
    return person is not None and person.erased_at is not None


def refuse_renewal_of_an_ended_device(session: Session, registration: Registration) -> None:
    """The service worker registers a new push subscription on its own (the browser gave
    no old one to move, or it could not be proven): refused (410) when the browser's
    device cookie names a subscription someone ended, so nothing is registered that the
    person did not choose. A person who wants notifications again asks on the page."""
    if registration.source != Source.SERVICE_WORKER.value or registration.device_id is None:
        return
    device = session.get(PushSubscription, registration.device_id)
    if device is not None and ended_by_choice(session, device):
        raise SubscriptionEnded("subscription")


def change_endpoint(
    session: Session,
    old_endpoint: str,
    new: ValidSubscription,
    registration: Registration,
    proof: Proof,
    *,
    keys: KeyRing,
    now: dt.datetime,
) -> ChangeResult:
    """pushsubscriptionchange: the new endpoint takes over the old one's subscriber.

    The caller must hold the old subscription (``proof``: its device cookie, or the old
    subscription's auth secret, which the worker has from ``event.oldSubscription``);
    otherwise — or when the old endpoint is unknown — :class:`NotYourSubscription`, and
    nothing is written. The old row ends as rotated in the same transaction, so at no
    point do both or neither carry the subscriber's preferences.
    """
    old = held_by_endpoint(session, old_endpoint, proof, keys=keys, field="oldEndpoint")
    _lock_row(session, old)
    if ended_by_choice(session, old):
        # The person (or erasure) ended it: no consent carries over, and none is new.
        raise SubscriptionEnded("oldEndpoint")
    carry = None
    if old.deleted_at is None and old.subscriber_id is not None:
        carry = _live_subscriber(session, old.subscriber_id)
    rotating = carry is not None and old.endpoint_hash != new.endpoint.hash
    result = upsert_subscription(
        session,
        new,
        dataclasses.replace(registration, subscriber_id=carry or registration.subscriber_id),
        keys=keys,
        now=now,
        # A rotation is one event, not a fresh grant: the grant carries over.
        record_events=not rotating,
    )
    moved = False
    if rotating:
        old_state = old.state
        moved = bool(
            end_subscriptions(
                session,
                [ending(old)],
                state=SubscriptionState.REVOKED,
                reason=EndReason.ROTATED,
                from_states=tuple(SubscriptionState),
                now=now,
                event=None,  # one ENDPOINT_ROTATED event, on the new subscription
            )
        )
        if moved:
            seq = log.append(
                session,
                kind=EventKind.ENDPOINT_ROTATED,
                subscriber_id=result.subscriber_id,
                subscription_id=result.id,
                previous_state=old_state.value,
                new_state=result.state.value,
                source=registration.source,
                actor="subscriber",
                recorded_at=now,
                context=registration.context(previous_subscription=str(old.id)),
            )
            session.execute(
                sa.update(_t)
                .where(_t.c.id == result.id)
                .values(grant_event_seq=sa.func.coalesce(old.grant_event_seq, seq))
            )
    return ChangeResult(result, old, moved)


def unsubscribe_endpoint(
    session: Session,
    endpoint: str,
    proof: Proof,
    *,
    keys: KeyRing,
    now: dt.datetime,
    source: str = Source.API.value,
    context: log.Context | None = None,
) -> PushSubscription:
    """The browser stops notifications for the subscription it holds (``proof``);
    :class:`NotYourSubscription` for any other endpoint, known or not."""
    sub = held_by_endpoint(session, endpoint, proof, keys=keys)
    _lock_row(session, sub)
    _unsubscribe(session, sub, now=now, source=source, context=context)
    return sub


def unsubscribe(
    session: Session,
    *,
    now: dt.datetime,
    subscription_id: uuid.UUID,
    source: str = Source.API.value,
    context: log.Context | None = None,
) -> PushSubscription | None:
    """The person stops notifications on one of their devices (the caller checked the
    device is theirs): revoked, and logged as unsubscribed."""
    sub = session.get(
        PushSubscription, subscription_id, with_for_update=True, populate_existing=True
    )
    if sub is None:
        return None
    _unsubscribe(session, sub, now=now, source=source, context=context)
    return sub


def _unsubscribe(
    session: Session,
    sub: PushSubscription,
    *,
    now: dt.datetime,
    source: str,
    context: log.Context | None,
) -> None:
    end_subscriptions(
        session,
        [ending(sub)],
        state=SubscriptionState.REVOKED,
        reason=EndReason.UNSUBSCRIBED,
        from_states=tuple(SubscriptionState),
        undeleted_only=True,
        now=now,
        event=EventKind.UNSUBSCRIBED,
        source=source,
        actor="subscriber",
        context=context,
    )


# The frequency_chosen event's states: the person's "How often".
AS_SENT, ONE_A_DAY = "as_sent", "one_a_day"


def choose_one_a_day(
    session: Session,
    subscriber_id: uuid.UUID,
    one_a_day: bool,
    *,
    now: dt.datetime,
    source: str,
    context: log.Context | None = None,
) -> bool:
    """The person's "at most one a day" choice (the preference centre's "How often"):
    their marketing notifications are capped at one per rolling day while it is on
    (portal/delivery/caps.py). A change is a ``frequency_chosen`` consent event, so the
    log says which cap held when; choosing what is already chosen writes nothing.
    Returns whether it changed."""
    log.lock_subscriber(session, subscriber_id)
    before = session.execute(
        sa.select(Subscriber.one_a_day).where(Subscriber.id == subscriber_id)
    ).scalar_one()
    if before == one_a_day:
        return False
    session.execute(
        sa.update(Subscriber).where(Subscriber.id == subscriber_id).values(one_a_day=one_a_day)
    )
    log.append(
        session,
        kind=EventKind.FREQUENCY_CHOSEN,
        subscriber_id=subscriber_id,
        source=source,
        actor="subscriber",
        recorded_at=now,
        decided_at=now,
        previous_state=ONE_A_DAY if before else AS_SENT,
        new_state=ONE_A_DAY if one_a_day else AS_SENT,
        context=context,
    )
    return True


# The quiet_hours_chosen event's state when the person has no quiet hours of their own.
NO_QUIET_HOURS = "none"


def quiet_hours_state(window: quiet.Window | None) -> str:
    """How the consent log writes a person's quiet hours: ``22:00-07:00`` or ``none``."""
    return NO_QUIET_HOURS if window is None else f"{window.start:%H:%M}-{window.end:%H:%M}"


def choose_quiet_hours(
    session: Session,
    subscriber_id: uuid.UUID,
    window: quiet.Window | None,
    *,
    now: dt.datetime,
    source: str,
    context: log.Context | None = None,
) -> bool:
    """The person's own quiet hours ("Do not send between …" in the preference centre),
    or none: their marketing notifications due inside them wait until they end
    (portal/delivery/quiet.py). A change is a ``quiet_hours_chosen`` consent event;
    choosing what is already chosen writes nothing. Returns whether it changed."""
    log.lock_subscriber(session, subscriber_id)
    start, end = session.execute(
        sa.select(Subscriber.quiet_from, Subscriber.quiet_until).where(
            Subscriber.id == subscriber_id
        )
    ).one()
    before = quiet.window(start, end)
    if before == window:
        return False
    session.execute(
        sa.update(Subscriber)
        .where(Subscriber.id == subscriber_id)
        .values(
            quiet_from=None if window is None else window.start,
            quiet_until=None if window is None else window.end,
        )
    )
    log.append(
        session,
        kind=EventKind.QUIET_HOURS_CHOSEN,
        subscriber_id=subscriber_id,
        source=source,
        actor="subscriber",
        recorded_at=now,
        decided_at=now,
        previous_state=quiet_hours_state(before),
        new_state=quiet_hours_state(window),
        context=context,
    )
    return True
