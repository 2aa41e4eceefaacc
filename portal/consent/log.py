"""The consent log: append-only, SHA-256 hash-chained, verified end to end.

Each event's hash covers a canonical encoding of its fields and the previous event's
hash, so editing or deleting any event breaks the chain from there on. Appends are
serialised — an advisory lock on PostgreSQL, the write lock SQLite takes at BEGIN
IMMEDIATE — and ``prev_hash`` is UNIQUE, so the chain cannot fork even if a writer
forgot the lock.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from portal.consent.models import ConsentEvent, EventKind
from portal.db import is_postgres

GENESIS = bytes(32)
# Any constant; names the one advisory lock that orders appends to the chain.
_CHAIN_LOCK = 0x636F6E73656E74  # "consent"
_t = cast(sa.Table, ConsentEvent.__table__)


def _iso(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def canonical(fields: Mapping[str, Any]) -> bytes:
    """The bytes an event's hash covers: sorted-key compact JSON of its fields."""
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def event_fields(
    *,
    seq: int,
    subscriber_id: uuid.UUID,
    subscription_id: uuid.UUID | None,
    topic_id: int | None,
    kind: str,
    previous_state: str | None,
    new_state: str | None,
    source: str,
    policy_version: str | None,
    decided_at: dt.datetime,
    recorded_at: dt.datetime,
    actor: str,
    context: str,
) -> dict[str, Any]:
    return {
        "seq": seq,
        "subscriber_id": str(subscriber_id),
        "subscription_id": str(subscription_id) if subscription_id else None,
        "topic_id": topic_id,
        "kind": kind,
        "previous_state": previous_state,
        "new_state": new_state,
        "source": source,
        "policy_version": policy_version,
        "decided_at": _iso(decided_at),
        "recorded_at": _iso(recorded_at),
        "actor": actor,
        "context": context,
    }


def chain_hash(prev_hash: bytes, fields: Mapping[str, Any]) -> bytes:
    return hashlib.sha256(prev_hash + canonical(fields)).digest()


_CHAIN_LOCK_HELD = "portal.chain_lock_held"


def lock_chain(session: Session) -> None:
    """Take the chain's append lock for this transaction.

    Call it before any other write in a transaction that may append, so every such
    transaction takes its locks in the same order and none can deadlock on the chain.
    """
    if not is_postgres(session):
        return
    # Held until the transaction ends: once taken, asking again is a wasted round trip.
    # Keyed by the innermost transaction, as rolling back a savepoint releases it.
    transaction = session.get_nested_transaction() or session.get_transaction()
    if transaction is not None and session.info.get(_CHAIN_LOCK_HELD) is transaction:
        return
    session.execute(sa.select(sa.func.pg_advisory_xact_lock(_CHAIN_LOCK)))
    session.info[_CHAIN_LOCK_HELD] = session.get_nested_transaction() or session.get_transaction()


@dataclass(frozen=True)
class Context:
    """Where a decision was made: the screen and the client family. Never an IP."""

    screen: str | None = None
    client: str | None = None
    extra: Mapping[str, str] | None = None

    def encode(self) -> str:
        values: dict[str, str] = {}
        if self.screen:
            values["screen"] = self.screen
        if self.client:
            values["client"] = self.client
        if self.extra:
            values.update(self.extra)
        return json.dumps(values, sort_keys=True, separators=(",", ":"))


def append(
    session: Session,
    *,
    kind: EventKind,
    subscriber_id: uuid.UUID,
    source: str,
    actor: str,
    recorded_at: dt.datetime,
    decided_at: dt.datetime | None = None,
    subscription_id: uuid.UUID | None = None,
    topic_id: int | None = None,
    previous_state: str | None = None,
    new_state: str | None = None,
    policy_version: str | None = None,
    context: Context | None = None,
) -> int:
    """Append one event in the caller's transaction; returns its sequence number."""
    return append_many(
        session,
        [
            NewEvent(
                kind=kind,
                subscriber_id=subscriber_id,
                source=source,
                actor=actor,
                recorded_at=recorded_at,
                decided_at=decided_at,
                subscription_id=subscription_id,
                topic_id=topic_id,
                previous_state=previous_state,
                new_state=new_state,
                policy_version=policy_version,
                context=context,
            )
        ],
    )[0]


@dataclass(frozen=True)
class NewEvent:
    """One event for ``append_many``: the arguments ``append`` takes."""

    kind: EventKind
    subscriber_id: uuid.UUID
    source: str
    actor: str
    recorded_at: dt.datetime
    decided_at: dt.datetime | None = None
    subscription_id: uuid.UUID | None = None
    topic_id: int | None = None
    previous_state: str | None = None
    new_state: str | None = None
    policy_version: str | None = None
    context: Context | None = None


def append_many(session: Session, events: Sequence[NewEvent]) -> list[int]:
    """Append events in order in the caller's transaction; returns their sequence numbers.

    One read of the chain's head and one multi-row INSERT, however many events: batch
    jobs hold the chain lock for as little time as their batch needs, not a round trip
    or two per event.
    """
    if not events:
        return []
    lock_chain(session)
    last = session.execute(
        sa.select(_t.c.seq, _t.c.hash).order_by(_t.c.seq.desc()).limit(1)
    ).one_or_none()
    seq, prev_hash = (last.seq, bytes(last.hash)) if last else (0, GENESIS)
    rows: list[dict[str, Any]] = []
    for event in events:
        seq += 1
        decided_at = event.decided_at or event.recorded_at
        fields = event_fields(
            seq=seq,
            subscriber_id=event.subscriber_id,
            subscription_id=event.subscription_id,
            topic_id=event.topic_id,
            kind=event.kind.value,
            previous_state=event.previous_state,
            new_state=event.new_state,
            source=event.source,
            policy_version=event.policy_version,
            decided_at=decided_at,
            recorded_at=event.recorded_at,
            actor=event.actor,
            context=(event.context or Context()).encode(),
        )
        digest = chain_hash(prev_hash, fields)
        rows.append(
            {
                "seq": seq,
                "subscriber_id": event.subscriber_id,
                "subscription_id": event.subscription_id,
                "topic_id": event.topic_id,
                "kind": fields["kind"],
                "previous_state": event.previous_state,
                "new_state": event.new_state,
                "source": event.source,
                "policy_version": event.policy_version,
                "decided_at": decided_at,
                "recorded_at": event.recorded_at,
                "actor": event.actor,
                "context": fields["context"],
                "prev_hash": prev_hash,
                "hash": digest,
            }
        )
        prev_hash = digest
    session.execute(sa.insert(_t), rows)
    return [row["seq"] for row in rows]


@dataclass(frozen=True)
class ChainProblem:
    seq: int
    reason: str

    def __str__(self) -> str:
        return f"event {self.seq}: {self.reason}"


@dataclass(frozen=True)
class ChainReport:
    events: int
    problem: ChainProblem | None
    last_hash: bytes

    @property
    def ok(self) -> bool:
        return self.problem is None


def _rows(connection: sa.Connection, batch: int) -> Iterator[Any]:
    last = 0
    while True:
        rows = connection.execute(
            sa.select(_t).where(_t.c.seq > last).order_by(_t.c.seq).limit(batch)
        ).all()
        if not rows:
            return
        yield from rows
        last = rows[-1].seq


def verify_chain(
    connection: sa.Connection,
    *,
    batch: int = 5000,
    progress: Any = None,
    anchors: Mapping[int, bytes] | None = None,
) -> ChainReport:
    """Walk the whole log in order; report the first event that breaks the chain.

    A chain that verifies proves nothing was changed inside it, but not that its newest
    events are all still there, nor that the whole log was not rebuilt from the start.
    ``anchors`` (seq → hash, kept outside the database: a signed export manifest, a head
    printed by an earlier check) close that gap: each must still be in the log, unchanged.
    """
    anchors = dict(anchors or {})
    expected_seq, prev_hash, count = 1, GENESIS, 0
    for row in _rows(connection, batch):
        count += 1
        if progress is not None:
            progress.advance(1)
        if row.seq != expected_seq:
            return ChainReport(count, ChainProblem(expected_seq, "missing (deleted?)"), prev_hash)
        if bytes(row.prev_hash) != prev_hash:
            return ChainReport(
                count,
                ChainProblem(row.seq, "prev_hash does not match the previous event"),
                prev_hash,
            )
        fields = event_fields(
            seq=row.seq,
            subscriber_id=row.subscriber_id,
            subscription_id=row.subscription_id,
            topic_id=row.topic_id,
            kind=row.kind,
            previous_state=row.previous_state,
            new_state=row.new_state,
            source=row.source,
            policy_version=row.policy_version,
            decided_at=row.decided_at,
            recorded_at=row.recorded_at,
            actor=row.actor,
            context=row.context,
        )
        if chain_hash(prev_hash, fields) != bytes(row.hash):
            return ChainReport(
                count, ChainProblem(row.seq, "hash does not match its content (altered)"), prev_hash
            )
        anchored = anchors.pop(row.seq, None)
        if anchored is not None and anchored != bytes(row.hash):
            return ChainReport(
                count,
                ChainProblem(row.seq, "hash differs from the anchor (the log was rewritten)"),
                prev_hash,
            )
        prev_hash = bytes(row.hash)
        expected_seq += 1
    if anchors:
        return ChainReport(
            count,
            ChainProblem(
                min(anchors),
                f"missing: the log ends at seq {expected_seq - 1} (newest events deleted?)",
            ),
            prev_hash,
        )
    return ChainReport(count, None, prev_hash)
