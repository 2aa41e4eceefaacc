"""Registry maintenance jobs: re-sealing under the current key, repairing endpoint hashes,
rewriting endpoints stored before they were canonical.

All walk the table by primary key (keyset pagination, never OFFSET, through
``subscription_batches``) in short transactions, so they can be stopped at any point and
run again: each batch that committed is done, and the next run picks up what is left.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, cast

import sqlalchemy as sa
from flask import Flask
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from portal.batches import replication_lag_seconds, replication_throttle
from portal.consent import log
from portal.consent.models import EventKind, Source
from portal.db import affected_rows, db, is_postgres
from portal.jobreport import JobReport, Progress
from portal.seams import current_portal
from portal.subscriptions.batches import subscription_batches
from portal.subscriptions.models import EndReason, PushSubscription, Subscriber, SubscriptionState
from portal.subscriptions.sealing import KeyRing, SealBroken, UnknownKeyVersion
from portal.subscriptions.validation import (
    EndpointParts,
    EndpointRefused,
    endpoint_hash,
    parse_endpoint,
    push_service_for,
)

_t = cast(sa.Table, PushSubscription.__table__)
logger = logging.getLogger("portal.subscriptions")


def reseal(
    app: Flask,
    keys: KeyRing,
    *,
    batch_size: int,
    progress: Progress,
    stop: threading.Event | None = None,
) -> JobReport:
    """Move every sealed auth secret to the current key version.

    A row whose version has no key (or whose seal does not open) is reported and left
    as it is; every other row still moves. With ``stop`` set (the scheduler shutting
    down) it returns after the batch in hand; the next run moves the rest.
    """
    report = JobReport("reseal")
    current = keys.current_version

    def move(session: Session, rows: Sequence[sa.Row[Any]]) -> int:
        changed = 0
        for row in rows:
            try:
                secret = keys.open(row.auth_sealed, row.auth_key_version)
            except (UnknownKeyVersion, SealBroken) as problem:
                report.problems.append(f"subscription {row.id}: {problem}")
                continue
            sealed = keys.seal(secret)
            changed += affected_rows(
                session,
                sa.update(_t)
                .where(
                    _t.c.id == row.id,
                    _t.c.auth_key_version == row.auth_key_version,
                    _t.c.auth_sealed == row.auth_sealed,
                )
                .values(auth_sealed=sealed.sealed, auth_key_version=sealed.key_version),
            )
        return changed

    # Another re-seal run (another process) takes other rows meanwhile: SKIP LOCKED.
    subscription_batches(
        app,
        (_t.c.auth_sealed.is_not(None)) & (_t.c.auth_key_version != current),
        batch_size=batch_size,
        progress=progress,
        handle=move,
        stop=stop,
        report=report,
        columns=(_t.c.auth_sealed, _t.c.auth_key_version),
    )
    return report


def backfill_endpoint_hash(
    app: Flask,
    *,
    batch_size: int,
    progress: Progress,
    pause_seconds: float = 0.0,
    max_lag_seconds: float | None = None,
    lag: Callable[[Session], float] = replication_lag_seconds,
    sleep: Callable[[float], None] = time.sleep,
) -> JobReport:
    """Make every live row's ``endpoint_hash`` the :func:`endpoint_hash` of its endpoint.

    The repair half of an online hash migration (migrations/README.md): rows written
    before the column existed, or under an older algorithm, get the right digest. A row
    whose endpoint already belongs to another row is reported, never merged (merging is
    ``canonicalise-endpoints``'s). Between chunks it sleeps ``pause_seconds`` and stops
    (reporting it; run it again to go on) when replication lag is over
    ``max_lag_seconds``.
    """
    report = JobReport("backfill-hash")

    def repair(session: Session, rows: Sequence[sa.Row[Any]]) -> int:
        changed = 0
        for row in rows:
            digest = endpoint_hash(row.endpoint)
            if row.endpoint_hash == digest:
                continue
            try:
                with session.begin_nested():
                    session.execute(
                        sa.update(_t).where(_t.c.id == row.id).values(endpoint_hash=digest)
                    )
                changed += 1
            except IntegrityError:
                report.problems.append(
                    f"subscription {row.id}: its endpoint is already stored on another row"
                )
        return changed

    subscription_batches(
        app,
        _t.c.endpoint.is_not(None),
        batch_size=batch_size,
        progress=progress,
        handle=repair,
        stop=None,
        report=report,
        columns=(_t.c.endpoint, _t.c.endpoint_hash),
        between=replication_throttle(
            app,
            report,
            pause_seconds=pause_seconds,
            max_lag_seconds=max_lag_seconds,
            lag=lag,
            sleep=sleep,
        ),
    )
    return report


def canonicalise_endpoints(
    app: Flask,
    *,
    batch_size: int,
    progress: Progress,
    pause_seconds: float = 0.0,
    max_lag_seconds: float | None = None,
    lag: Callable[[Session], float] = replication_lag_seconds,
    sleep: Callable[[float], None] = time.sleep,
) -> JobReport:
    """Rewrite every row stored before endpoints were canonical to the canonical form
    and its hash; rows that turn out to be spellings of one push resource are merged.

    In chunks like :func:`backfill_endpoint_hash` (same pause and replication check),
    safe to stop and to run again; a row whose canonical form another row holds is
    merged after the walk, each merge in a short transaction of its own under the
    consent chain's lock (it appends events), so no chunk ever holds that lock. A row
    whose endpoint is no push endpoint, or whose canonical form belongs to a tombstone,
    is reported and left as it is.

    The merge rule, two rows at a time (so any number of spellings end as one row):

    - The row kept is the earliest registration (``created_at``, then id) whose
      subscriber is live (not erased): its id, subscriber, ``created_at`` and grant
      stay. Before this, a spelling of someone's endpoint could be registered by anyone
      and got a subscriber of its own; the first registration is the resource's owner.
    - It takes the newest registration's keys (``p256dh``, sealed ``auth``, expiry) and
      request context, and its ``last_seen_at``: the newest row is what the browser
      holds now.
    - Its lifecycle (state, end, delivery health) is that of the latest act: the newest
      registration, or an end (an unsubscribe, a revocation by the push service...) made
      after it through another spelling.
    - The other row ends as revoked, ``rotated``, keeping a spelling of its own (and its
      hash), and an ``endpoint_rotated`` consent event records the merge for the kept
      subscriber (``previous_subscription``) and, when the other row had another live
      subscriber, for them too (``merged_into``). Its queued deliveries are skipped by
      the engine's re-check, so one campaign sends one message to the resource.
    """
    report = JobReport(CANONICALISE_JOB)
    clock = current_portal(app).clock
    collisions: list[tuple[uuid.UUID, EndpointParts]] = []

    def rewrite(session: Session, rows: Sequence[sa.Row[Any]]) -> int:
        changed = 0
        for row in rows:
            try:
                parts = parse_endpoint(row.endpoint)
            except EndpointRefused as refused:
                report.problems.append(
                    f"subscription {row.id}: its endpoint is not a push endpoint "
                    f"({refused.code}); left as it is"
                )
                continue
            digest = endpoint_hash(parts.url)
            if row.endpoint == parts.url and row.endpoint_hash == digest:
                continue
            try:
                with session.begin_nested():
                    changed += affected_rows(
                        session,
                        sa.update(_t)
                        .where(_t.c.id == row.id, _t.c.endpoint == row.endpoint)
                        .values(
                            endpoint=parts.url,
                            endpoint_hash=digest,
                            push_service=push_service_for(parts.host),
                        ),
                    )
            except IntegrityError:  # another row holds the canonical form: a merge
                collisions.append((row.id, parts))
        return changed

    subscription_batches(
        app,
        _t.c.endpoint.is_not(None) & _t.c.deleted_at.is_(None),
        batch_size=batch_size,
        progress=progress,
        handle=rewrite,
        stop=None,
        report=report,
        columns=(_t.c.endpoint, _t.c.endpoint_hash),
        between=replication_throttle(
            app,
            report,
            pause_seconds=pause_seconds,
            max_lag_seconds=max_lag_seconds,
            lag=lag,
            sleep=sleep,
        ),
    )
    # A merge appends consent events: each is a short transaction of its own.
    for subscription_id, parts in collisions:
        with db.begin(app) as session:
            report.changed += _merge_into_twin(session, subscription_id, parts, report, clock.now())
    return report


CANONICALISE_JOB = "canonicalise-endpoints"
_ENDED_STATES = ("revoked", "expired")
# What the kept row takes from the newest registration, and from the latest act.
_FROM_NEWEST = (
    "p256dh",
    "auth_sealed",
    "auth_key_version",
    "content_encoding",
    "expiration_time",
    "user_agent",
    "locale",
    "origin",
    "last_seen_at",
)
_FROM_LATEST_ACT = (
    "state",
    "stale_at",
    "ended_at",
    "revoked_at",
    "end_reason",
    "browser_told_at",
    "last_success_at",
    "last_failure_at",
    "last_status_code",
    "consecutive_failures",
)


def _locked(session: Session, where: sa.ColumnElement[bool]) -> sa.Row[Any] | None:
    query = (
        sa.select(_t, Subscriber.erased_at.label("subscriber_erased_at"))
        .select_from(_t.outerjoin(Subscriber, Subscriber.id == _t.c.subscriber_id))
        .where(where)
    )
    if is_postgres(session):
        query = query.with_for_update(of=_t)
    return session.execute(query).one_or_none()


def _merge_into_twin(
    session: Session,
    subscription_id: uuid.UUID,
    parts: EndpointParts,
    report: JobReport,
    now: dt.datetime,
) -> int:
    """One row whose canonical form another row holds: merged with it, or reported when
    that row is a tombstone; returns how many rows it changed (0 or 1)."""
    canonical, digest = parts.url, endpoint_hash(parts.url)
    mine = _locked(session, _t.c.id == subscription_id)
    if mine is None or mine.deleted_at is not None:
        return 0  # tombstoned since its chunk was read
    twin = _locked(session, (_t.c.endpoint_hash == digest) & (_t.c.id != subscription_id))
    service = {"push_service": push_service_for(parts.host)}
    if twin is None:  # gone since: nothing to merge with
        session.execute(
            sa.update(_t)
            .where(_t.c.id == subscription_id)
            .values(endpoint=canonical, endpoint_hash=digest, **service)
        )
        return 1
    if twin.deleted_at is not None:
        report.problems.append(
            f"subscription {subscription_id}: its canonical endpoint belongs to the tombstone "
            f"{twin.id}; left as it is"
        )
        return 0
    if mine.state == "revoked" and mine.end_reason == EndReason.ROTATED.value:
        return 0  # merged already (or rotated away by the browser): nothing to carry over
    _merge(session, mine, twin, canonical, digest, service, now)
    return 1


def _merge(
    session: Session,
    mine: sa.Row[Any],
    twin: sa.Row[Any],
    canonical: str,
    digest: bytes,
    service: dict[str, Any],
    now: dt.datetime,
) -> None:
    """Two spellings of one push resource become one subscription (the rule is in
    :func:`canonicalise_endpoints`' docstring)."""
    by_age = sorted((mine, twin), key=lambda r: (r.created_at, r.id))
    keep = next(
        (r for r in by_age if r.subscriber_id is not None and r.subscriber_erased_at is None),
        by_age[0],
    )
    other = twin if keep is mine else mine
    newest = max((mine, twin), key=lambda r: (r.last_seen_at, r.created_at, r.id))
    ended = [r for r in (mine, twin) if r.state in _ENDED_STATES and r.ended_at is not None]
    latest_end = max(ended, key=lambda r: r.ended_at, default=None)
    latest = (
        latest_end
        if latest_end is not None and latest_end.ended_at > newest.last_seen_at
        else newest
    )
    values: dict[str, Any] = {column: getattr(newest, column) for column in _FROM_NEWEST}
    values |= {column: getattr(latest, column) for column in _FROM_LATEST_ACT}
    if keep.grant_event_seq is None and other.subscriber_id == keep.subscriber_id:
        values["grant_event_seq"] = other.grant_event_seq
    if keep is mine:
        # The kept row takes the canonical hash from the other, which takes the kept
        # row's old spelling instead (a placeholder in between: the hash is UNIQUE).
        placeholder = hashlib.sha256(b"merging:" + other.id.bytes).digest()
        session.execute(sa.update(_t).where(_t.c.id == other.id).values(endpoint_hash=placeholder))
    session.execute(
        sa.update(_t)
        .where(_t.c.id == keep.id)
        .values(endpoint=canonical, endpoint_hash=digest, **service, **values)
    )
    spelling = (
        {"endpoint": keep.endpoint, "endpoint_hash": keep.endpoint_hash} if keep is mine else {}
    )
    session.execute(
        sa.update(_t)
        .where(_t.c.id == other.id)
        .values(
            state=SubscriptionState.REVOKED.value,
            end_reason=EndReason.ROTATED.value,
            ended_at=now,
            revoked_at=other.revoked_at or now,
            stale_at=None,
            **spelling,
        )
    )

    def live(row: sa.Row[Any]) -> bool:
        return row.subscriber_id is not None and row.subscriber_erased_at is None

    events: list[log.NewEvent] = []
    if live(keep):
        events.append(
            _rotated(
                keep.subscriber_id,
                keep.id,
                other.state,
                values["state"],
                now,
                previous_subscription=str(other.id),
            )
        )
    if live(other) and other.subscriber_id != keep.subscriber_id:
        events.append(
            _rotated(
                other.subscriber_id,
                other.id,
                other.state,
                SubscriptionState.REVOKED.value,
                now,
                merged_into=str(keep.id),
            )
        )
    if events:
        log.append_many(session, events)
    logger.info("subscription %s merged into %s: one push resource", other.id, keep.id)


def _rotated(
    subscriber_id: uuid.UUID,
    subscription_id: uuid.UUID,
    previous: str,
    new: str,
    now: dt.datetime,
    **extra: str,
) -> log.NewEvent:
    return log.NewEvent(
        kind=EventKind.ENDPOINT_ROTATED,
        subscriber_id=subscriber_id,
        subscription_id=subscription_id,
        previous_state=previous,
        new_state=new,
        source=Source.SYSTEM.value,
        actor="system",
        recorded_at=now,
        context=log.Context(screen=CANONICALISE_JOB, extra=extra),
    )


def reseal_job(app: Flask, progress: Progress) -> JobReport:
    portal = current_portal(app)
    return reseal(
        app,
        portal.keys,
        batch_size=portal.settings.reseal_batch_size,
        progress=progress,
        stop=app.extensions.get("portal.stop"),
    )


def backfill_hash_job(app: Flask, progress: Progress) -> JobReport:
    portal = current_portal(app)
    settings = portal.settings
    return backfill_endpoint_hash(
        app,
        batch_size=settings.reseal_batch_size,
        progress=progress,
        pause_seconds=settings.backfill_pause_seconds,
        max_lag_seconds=settings.backfill_max_replication_lag_seconds,
    )


def canonicalise_job(app: Flask, progress: Progress) -> JobReport:
    settings = current_portal(app).settings
    return canonicalise_endpoints(
        app,
        batch_size=settings.reseal_batch_size,
        progress=progress,
        pause_seconds=settings.backfill_pause_seconds,
        max_lag_seconds=settings.backfill_max_replication_lag_seconds,
    )
