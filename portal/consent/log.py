"""The consent log: append-only events, each a leaf of a Merkle tree (RFC 9162).

Writers append with no global lock (``append_many``); the sequencer
(``portal.consent.tree``) integrates committed events into the tree in ``seq`` order and
signs tree heads; ``portal.consent.tree.verify_log`` checks it all end to end. The events
written before the tree (migration 0018) also keep their SHA-256 hash chain
(``hash``/``prev_hash``), which the verifier still checks as history.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from portal.consent import merkle
from portal.consent.models import ConsentEvent, EventKind
from portal.db import is_postgres
from portal.subscriptions.models import Subscriber

GENESIS = bytes(32)  # the hash chain's prev_hash of its first event
_t = cast(sa.Table, ConsentEvent.__table__)
_s = cast(sa.Table, Subscriber.__table__)


def iso(value: dt.datetime) -> str:
    """The log's spelling of a time (UTC, microseconds, ``Z``): in every event's canonical
    bytes, and wherever an export or a receipt must say the same time."""
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
        "decided_at": iso(decided_at),
        "recorded_at": iso(recorded_at),
        "actor": actor,
        "context": context,
    }


def chain_hash(prev_hash: bytes, fields: Mapping[str, Any]) -> bytes:
    """The hash chain's rule, for the events written before the tree (migration 0018)."""
    return hashlib.sha256(prev_hash + canonical(fields)).digest()


def row_fields(row: Any) -> dict[str, Any]:
    """``event_fields`` of a stored event row."""
    return event_fields(
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


def event_leaf_hash(row: Any) -> bytes:
    """The event's leaf in the tree: RFC 9162's SHA-256(0x00 ‖ canonical event bytes)."""
    return merkle.leaf_hash(canonical(row_fields(row)))


# Built once: taken by every consent write. One person (nearly every write) by ``=``;
# several by ``= ANY`` of one array, never an expanding ``IN`` list, which SQLAlchemy
# renders into new SQL text on every execution.
_LOCK_SUBSCRIBER = sa.select(_s.c.id).where(_s.c.id == sa.bindparam("id")).with_for_update()
_LOCK_SUBSCRIBERS = (
    sa.select(_s.c.id)
    .where(_s.c.id == sa.any_(sa.bindparam("ids", type_=postgresql.ARRAY(_s.c.id.type))))
    .order_by(_s.c.id)
    .with_for_update()
)


def lock_subscriber(session: Session, *subscriber_ids: uuid.UUID | None) -> None:
    """Take the row lock of each subscriber whose events this transaction will append.

    The rule it keeps: one event per transition, each event's ``previous_state`` the
    last event's ``new_state`` for that subscriber and topic. Two saves for one person
    take turns (the second reads the state the first committed); saves for different
    people never wait on each other. Taken in id order, so two transactions locking the
    same people cannot deadlock. On SQLite the write lock taken at BEGIN IMMEDIATE
    already serialises writers.
    """
    ids = sorted({value for value in subscriber_ids if value is not None})
    if not ids or not is_postgres(session):
        return
    # On the session's connection, as the driver's text: see _driver_text.
    connection = session.connection()
    parameters: dict[str, Any]
    if len(ids) == 1:
        statement, parameters = _LOCK_SUBSCRIBER, {"id": ids[0]}
    else:
        statement, parameters = _LOCK_SUBSCRIBERS, {"ids": ids}
    connection.exec_driver_sql(_driver_text(connection.dialect, statement), parameters).all()


def subscriber_lock_text(dialect: sa.Dialect) -> str:
    """One person's lock (:func:`lock_subscriber`) as the driver's text, its parameter
    ``id``: for a statement that takes it in its own round trip, with work of its own
    (:func:`portal.ratelimit.count_save_and_lock`)."""
    return _driver_text(dialect, _LOCK_SUBSCRIBER)


def lock_resource(session: Session, name: str, key: bytes) -> None:
    """A transaction-scoped lock on one named thing (an endpoint hash) that has no row to
    lock yet: requests about the same push endpoint take turns, others do not wait."""
    if not is_postgres(session):
        return
    number = int.from_bytes(hashlib.sha256(name.encode() + b"\0" + key).digest()[:8], "big")
    session.execute(sa.select(sa.func.pg_advisory_xact_lock(number - (1 << 63))))


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


@functools.lru_cache(maxsize=64)
def _driver_text(dialect: sa.Dialect, statement: sa.Executable) -> str:
    """A consent write's statement as the text the driver is sent, compiled once.

    Every consent write runs these two statements, the lock and the append: run through
    ``Connection.execute``, SQLAlchemy spent more CPU on each (its execution context,
    parameters compiled and processed) than the driver and the database on it, and eight
    writing processes on two CPUs were bound by it. ``exec_driver_sql`` keeps what matters
    of the execution (its events, the error wrapping that finds a lost database, hidden
    parameters); the values are bound as the columns' types would (:func:`_bound`)."""
    return str(cast(Any, statement).compile(dialect=dialect))


@functools.lru_cache(maxsize=8)
def _bind_processors(dialect: sa.Dialect) -> dict[str, Any]:
    """The columns whose type changes a value on its way to this dialect (the UTC
    datetimes: an aware value required, sent as UTC)."""
    found = {column.key: column.type.bind_processor(dialect) for column in _t.c}
    return {name: processor for name, processor in found.items() if processor is not None}


def _bound(dialect: sa.Dialect, row: dict[str, Any]) -> dict[str, Any]:
    processors = _bind_processors(dialect)
    return {
        name: processors[name](value) if name in processors else value
        for name, value in row.items()
    }


_SEQUENCE = cast(sa.Sequence, _t.c.seq.default).name
# An event with no context: its encoding, made once.
_NO_CONTEXT = Context().encode()


@functools.lru_cache(maxsize=32)
def _insert_in_order(columns: tuple[str, ...], count: int) -> sa.TextClause:
    """One INSERT of ``count`` events setting ``columns`` on PostgreSQL, numbered in the
    order given.

    Given many parameter sets, SQLAlchemy's INSERT … RETURNING sends one statement per
    event when the returned rows must follow the parameters (nothing on the client tells
    its rows apart). Here the rows carry their place (``ord``) and are sorted by it
    before ``nextval`` runs: PostgreSQL evaluates volatile functions of a select list
    after its ORDER BY, so the numbers rise in the events' order, and the caller sorts
    what RETURNING gives back. Parameters are named ``<column>_<place>``.

    Text, not a ``VALUES`` construct: SQLAlchemy cannot cache the compiled form of one,
    and compiling it again for every save cost more than the statement it saved."""
    dialect = postgresql.dialect()
    types = {name: _t.c[name].type.compile(dialect=dialect) for name in columns}
    rows = ", ".join(
        f"({place}, "
        + ", ".join(f"CAST(:{name}_{place} AS {types[name]})" for name in columns)
        + ")"
        for place in range(count)
    )
    names = ", ".join(columns)
    # Only the table's own column names (``_t.c[name]`` refuses any other) and their
    # types are written into the text; every value is a bound parameter.
    return sa.text(
        f"INSERT INTO {_t.name} (seq, {names}) "  # noqa: S608
        f"SELECT nextval('{_SEQUENCE}'), {names} "
        f"FROM (VALUES {rows}) AS appended (ord, {names}) "
        "ORDER BY ord RETURNING seq"
    )


def append_many(session: Session, events: Sequence[NewEvent]) -> list[int]:
    """Append events in order in the caller's transaction; returns their sequence numbers.

    No global lock: on PostgreSQL each event takes its ``seq`` from the sequence
    ``consent_event_seq`` (one INSERT … RETURNING for all of them, numbered in the order
    given: :func:`_insert_in_order`) and commits with the
    caller's transaction; the sequencer integrates it into the tree once every number
    before it is settled. A number taken by a transaction that rolls back is a gap the
    sequencer closes (``portal.consent.tree``). On SQLite, where the transaction holds
    the write lock from BEGIN IMMEDIATE, the next number is ``max(seq) + 1``.

    The caller keeps the per-subscriber rule by locking the subscriber
    (``lock_subscriber``) before it reads the state it derives ``previous_state`` from.
    """
    if not events:
        return []
    rows: list[dict[str, Any]] = []
    for event in events:
        rows.append(
            {
                "subscriber_id": event.subscriber_id,
                "subscription_id": event.subscription_id,
                "topic_id": event.topic_id,
                "kind": event.kind.value,
                "previous_state": event.previous_state,
                "new_state": event.new_state,
                "source": event.source,
                "policy_version": event.policy_version,
                "decided_at": event.decided_at or event.recorded_at,
                "recorded_at": event.recorded_at,
                "actor": event.actor,
                "context": event.context.encode() if event.context else _NO_CONTEXT,
            }
        )
    if is_postgres(session):
        # On the session's connection, as the driver's text (_driver_text).
        connection = session.connection()
        dialect = connection.dialect
        numbered = {
            f"{name}_{index}": value
            for index, row in enumerate(rows)
            for name, value in _bound(dialect, row).items()
        }
        # The columns as append_many's rows name them, in their order.
        statement = _driver_text(dialect, _insert_in_order(tuple(rows[0]), len(rows)))
        return sorted(int(seq) for (seq,) in connection.exec_driver_sql(statement, numbered))
    last = session.execute(sa.select(sa.func.max(_t.c.seq))).scalar_one_or_none() or 0
    for offset, row in enumerate(rows, start=1):
        row["seq"] = last + offset
    session.execute(sa.insert(_t), rows)
    return [row["seq"] for row in rows]
