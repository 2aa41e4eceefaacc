"""Ageing sweeps, tombstones, purge and erasure.

A dead endpoint has no purpose, so these are compliance controls, not housekeeping.
Every batch job walks its candidates by primary key in short transactions (keyset
pagination), claims rows with SKIP LOCKED on PostgreSQL, and can be stopped between
batches and run again.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa
from flask import Flask
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from portal.config import RetentionSettings
from portal.consent import log
from portal.consent.models import ConsentEvent, EventKind, Source, TopicPreference
from portal.db import affected_rows, is_postgres
from portal.jobreport import JobReport, Progress
from portal.retention.models import RetentionCounter
from portal.subscriptions.batches import subscription_batches
from portal.subscriptions.models import (
    LIVE_STATES,
    EndReason,
    PushSubscription,
    Subscriber,
    SubscriptionState,
)
from portal.subscriptions.services import Ending, end_subscriptions

_t = cast(sa.Table, PushSubscription.__table__)
# Batches that append consent events hold their rows' locks from their first row to their
# commit. Measured when every consent write also took the log's global lock: at 50 rows a
# subscribe waited at most ~120 ms on a busy 2-core machine (200: ~190 ms), for ~1,000
# expiries a second (bench/sweeps.py, docs/BENCHMARKS.md).
EVENT_BATCH_SIZE = 50
_TOMBSTONE_EMPTIES = {
    "endpoint": None,
    "p256dh": None,
    "auth_sealed": None,
    "user_agent": None,
    "locale": None,
    "expiration_time": None,
}


def months_before(when: dt.datetime, months: int) -> dt.datetime:
    """The same moment ``months`` calendar months earlier (clamped to the month's end)."""
    index = when.year * 12 + when.month - 1 - months
    year, month = divmod(index, 12)
    month += 1
    next_month = dt.date(year + (month == 12), month % 12 + 1, 1)
    last_day = (next_month - dt.timedelta(days=1)).day
    return when.replace(year=year, month=month, day=min(when.day, last_day))


def sweep(
    app: Flask,
    *,
    now: dt.datetime,
    retention: RetentionSettings,
    progress: Progress,
    stop: threading.Event | None = None,
) -> JobReport:
    """Age subscriptions: quiet → stale → expired, and past ``expiration_time`` → expired."""
    report = JobReport("sweep")
    quiet_since = now - dt.timedelta(days=retention.stale_after_days)
    stale_since = now - dt.timedelta(days=retention.expire_stale_after_days)
    live = _t.c.state.in_([s.value for s in LIVE_STATES]) & _t.c.deleted_at.is_(None)

    # 1. No sign of life (neither seen by the page nor reached by a send) → stale.
    quiet = (
        live
        & (_t.c.last_seen_at < quiet_since)
        & (_t.c.last_success_at.is_(None) | (_t.c.last_success_at < quiet_since))
        & (_t.c.expiration_time.is_(None) | (_t.c.expiration_time > now))
    )

    def to_stale(session: Session, rows: Sequence[sa.Row[Any]]) -> int:
        return affected_rows(
            session,
            sa.update(_t)
            .where(_t.c.id.in_([r.id for r in rows]), live)
            .values(state=SubscriptionState.STALE.value, stale_at=now),
        )

    subscription_batches(
        app,
        quiet,
        batch_size=retention.batch_size,
        progress=progress,
        handle=to_stale,
        stop=stop,
        report=report,
    )

    # 2. Stale for long enough, or past the push service's own expiry → expired, logged.
    overdue = (_t.c.deleted_at.is_(None)) & (
        (
            (_t.c.state == "stale")
            & (sa.func.coalesce(_t.c.stale_at, _t.c.last_seen_at) < stale_since)
        )
        | (_t.c.state.in_(["pending", "active", "stale"]) & (_t.c.expiration_time <= now))
    )

    def to_expired(session: Session, rows: Sequence[sa.Row[Any]]) -> int:
        # One UPDATE and one bulk append per batch. The candidate query locked these rows
        # (or, on SQLite, the whole database), so the states it read are still theirs.
        ended = end_subscriptions(
            session,
            # In id order, as the rows were claimed, so the log's order is stable.
            [Ending(row.id, row.subscriber_id, row.state) for row in rows],
            state=SubscriptionState.EXPIRED,
            reason=EndReason.EXPIRED,
            from_states=(*LIVE_STATES, SubscriptionState.STALE),
            now=now,
            event=EventKind.EXPIRED,
            context=log.Context(screen="sweep"),
        )
        return len(ended)

    subscription_batches(
        app,
        overdue,
        # Its rows stay locked for the whole batch: kept short.
        batch_size=min(retention.batch_size, EVENT_BATCH_SIZE),
        progress=progress,
        handle=to_expired,
        stop=stop,
        report=report,
        columns=(_t.c.subscriber_id, _t.c.state),
    )
    return report


def tombstone_values(now: dt.datetime) -> dict[str, Any]:
    return {**_TOMBSTONE_EMPTIES, "deleted_at": now}


def tombstone(
    app: Flask,
    *,
    now: dt.datetime,
    retention: RetentionSettings,
    progress: Progress,
    stop: threading.Event | None = None,
) -> JobReport:
    """Ended rows past the grace period keep only what proves consent existed and ended:
    the endpoint hash, the subscriber, the creation and revocation times."""
    report = JobReport("tombstone")
    cutoff = now - dt.timedelta(days=retention.tombstone_grace_days)
    ended = (
        _t.c.deleted_at.is_(None)
        & _t.c.state.in_(["expired", "revoked"])
        & (sa.func.coalesce(_t.c.ended_at, _t.c.revoked_at, _t.c.last_seen_at) < cutoff)
    )

    def bury(session: Session, rows: Sequence[sa.Row[Any]]) -> int:
        return affected_rows(
            session,
            sa.update(_t)
            .where(_t.c.id.in_([r.id for r in rows]), _t.c.deleted_at.is_(None))
            .values(**tombstone_values(now)),
        )

    subscription_batches(
        app,
        ended,
        batch_size=retention.batch_size,
        progress=progress,
        handle=bury,
        stop=stop,
        report=report,
    )
    return report


def purge(
    app: Flask,
    *,
    now: dt.datetime,
    retention: RetentionSettings,
    progress: Progress,
    stop: threading.Event | None = None,
) -> JobReport:
    """Tombstones older than the audit window are deleted, folded into counters first."""
    report = JobReport("purge")
    cutoff = months_before(now, retention.audit_window_months)
    old = _t.c.deleted_at.is_not(None) & (_t.c.deleted_at < cutoff)
    counters = cast(sa.Table, RetentionCounter.__table__)

    def fold(session: Session, rows: Sequence[sa.Row[Any]]) -> int:
        tally: Counter[tuple[str, str, str]] = Counter()
        for row in rows:
            ended = row.ended_at or row.revoked_at or row.deleted_at
            tally[(f"{ended:%Y-%m}", row.push_service, row.end_reason or "unknown")] += 1
        insert = (postgresql.insert if is_postgres(session) else sqlite.insert)(counters)
        for (month, service, reason), count in tally.items():
            statement = insert.values(
                month=month, push_service=service, end_reason=reason, count=count
            )
            session.execute(
                statement.on_conflict_do_update(
                    index_elements=[
                        counters.c.month,
                        counters.c.push_service,
                        counters.c.end_reason,
                    ],
                    set_={"count": counters.c.count + statement.excluded.count},
                )
            )
        return affected_rows(session, sa.delete(_t).where(_t.c.id.in_([r.id for r in rows])))

    subscription_batches(
        app,
        old,
        batch_size=retention.batch_size,
        progress=progress,
        handle=fold,
        stop=stop,
        report=report,
        columns=(
            _t.c.ended_at,
            _t.c.revoked_at,
            _t.c.deleted_at,
            _t.c.push_service,
            _t.c.end_reason,
        ),
    )
    return report


def receipt_id(event_seq: int, event_hash: str) -> str:
    """An erasure receipt's ID, ``ER-<event>-<first 8 hex of its hash>``: the consent log's
    erasure event, with a check so a mistyped number names no other erasure. The hash is
    the event's RFC 9162 leaf hash (its hash-chain hash on receipts issued before the
    tree). Every receipt ever issued holds both parts (``consentEventSeq``,
    ``consentEventHash``)."""
    return f"ER-{event_seq}-{event_hash[:RECEIPT_CHECK].upper()}"


RECEIPT_CHECK = 8
_RECEIPT_ID = re.compile(r"ER-?([0-9]{1,18})-([0-9A-F]{8,64})")
_RECEIPT_GAPS = re.compile(r"[\s_-]+")
_HEX_LOOKALIKES = str.maketrans({"O": "0", "I": "1", "L": "1"})


def parse_receipt_id(text: str) -> tuple[int, str] | None:
    """The event number and hash prefix (lowercase hex) a typed receipt ID names, however
    it is cased or spaced (``er 1042 3fa9c2d1``); None when ``text`` is no receipt ID."""
    value = _RECEIPT_GAPS.sub("-", text.strip().upper())
    if not value.startswith("ER"):
        return None
    found = _RECEIPT_ID.fullmatch("ER" + value[2:].translate(_HEX_LOOKALIKES))
    if found is None:
        return None
    return int(found.group(1)), found.group(2).lower()


def erasure_by_receipt_id(session: Session, text: str) -> uuid.UUID | None:
    """The erased subscriber a receipt ID names; None when it names no erasure."""
    parsed = parse_receipt_id(text)
    if parsed is None:
        return None
    seq, check = parsed
    e = ConsentEvent.__table__
    row = session.execute(
        sa.select(e).where(e.c.seq == seq, e.c.kind == EventKind.ERASED.value)
    ).first()
    if row is None or row.subscriber_id is None:
        return None
    # Receipts issued since the tree name the event's RFC 9162 leaf hash; those issued
    # before it (migration 0018) named its hash-chain hash, which that event still has.
    checks = [log.event_leaf_hash(row).hex()]
    if row.hash is not None:
        checks.append(bytes(row.hash).hex())
    if not any(value.startswith(check) for value in checks):
        return None
    return uuid.UUID(str(row.subscriber_id))


@dataclass(frozen=True)
class ErasureReceipt:
    subscriber_id: uuid.UUID
    erased_at: dt.datetime
    event_seq: int
    event_hash: str
    subscriptions: int

    @property
    def receipt_id(self) -> str:
        return receipt_id(self.event_seq, self.event_hash)


def erase_subscriber(
    session: Session,
    subscriber_id: uuid.UUID,
    *,
    now: dt.datetime,
    actor: str = "subscriber",
    source: str = Source.PREFERENCE_CENTRE.value,
    context: log.Context | None = None,
) -> ErasureReceipt:
    """GDPR Art. 17, in the caller's transaction.

    Removes the person's data (identifiers, device details, endpoints, keys, current
    preferences) and tombstones their subscriptions, keeping the hashes so their browsers
    are told to unsubscribe at the next heartbeat; the consent log keeps — and gains an
    ``erased`` event proving — that consent existed and ended. It holds no raw personal
    data, so nothing in it needs editing.
    """
    # Read afresh, and locked (the consent log's per-subscriber rule).
    subscriber = session.get(
        Subscriber, subscriber_id, with_for_update=True, populate_existing=True
    )
    if subscriber is None or subscriber.erased_at is not None:
        raise LookupError("no such subscriber, or already erased")
    ended = affected_rows(
        session,
        sa.update(_t)
        .where(_t.c.subscriber_id == subscriber_id, _t.c.deleted_at.is_(None))
        .values(
            state=SubscriptionState.REVOKED.value,
            end_reason=EndReason.ERASED.value,
            ended_at=now,
            revoked_at=sa.func.coalesce(_t.c.revoked_at, now),
            **tombstone_values(now),
        ),
    )
    # Tombstones from before also lose anything left beyond the hash.
    session.execute(
        sa.update(_t).where(_t.c.subscriber_id == subscriber_id).values(**_TOMBSTONE_EMPTIES)
    )
    session.execute(
        sa.delete(TopicPreference).where(TopicPreference.subscriber_id == subscriber_id)
    )
    subscriber.external_user_id = None
    subscriber.reference = None
    subscriber.locale = None
    subscriber.region_code = None
    subscriber.time_zone = None  # where the person is: theirs, not the log's
    subscriber.quiet_from = subscriber.quiet_until = None  # their own quiet hours, likewise
    subscriber.erased_at = now
    seq = log.append(
        session,
        kind=EventKind.ERASED,
        subscriber_id=subscriber_id,
        new_state="erased",
        source=source,
        actor=actor,
        recorded_at=now,
        context=context,
    )
    session.flush()
    # The erased event's RFC 9162 leaf hash: what GET /api/consent-log/inclusion proves.
    row = session.execute(sa.select(log._t).where(log._t.c.seq == seq)).one()
    return ErasureReceipt(subscriber_id, now, seq, log.event_leaf_hash(row).hex(), ended)
