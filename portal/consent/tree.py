"""The consent log's Merkle tree in the database: the sequencer, proofs, heads, verification.

- **The sequencer** (``integrate``, run by the ``consent-log-sequencer`` job). Writers
  commit events on their own with no global lock (``portal.consent.log.append_many``);
  the sequencer takes the state row's lock (SELECT … FOR UPDATE: two sequencers never
  integrate the same leaf), reads the committed events after the tree's size, and
  integrates the **gap-free prefix** of their ``seq`` numbers: leaf ``seq - 1`` is the
  RFC 9162 leaf hash of the event's canonical bytes. It stores the nodes the leaves
  complete (``merkle``'s layout), the new frontier, and a signed tree head, all in one
  transaction: killed half-way, it rolls back and the next run starts from the same
  state, with no leaf lost or doubled.
- **Gaps.** A ``seq`` the sequence gave to a transaction that rolled back never commits.
  The sequencer notes the first hole it waits on; once the hole has been open for the
  grace period it closes it with a ``gap`` event at that ``seq`` (INSERT … ON CONFLICT DO
  NOTHING, under a short lock timeout). An event still in flight holds the number's
  primary key: the insert waits for it, and either it commits (and is integrated in its
  place) or it rolls back (and the gap event takes the number). A gap is a recorded
  event, a leaf like any other: never hidden.
- **Proofs** read at most ``2·⌈log2 n⌉`` stored nodes (``DatabaseNodes``).
- **Verification** (``verify_log``) recomputes every leaf from the rows, the root of the
  latest signed head and its signature, and the hash chain of the events written before
  the tree; it names the first bad event.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric import ed25519
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from portal.consent import merkle
from portal.consent.log import GENESIS, canonical, chain_hash, event_leaf_hash, row_fields
from portal.consent.models import (
    ConsentEvent,
    ConsentLogNode,
    ConsentLogState,
    ConsentTreeHead,
    EventKind,
)
from portal.db import is_postgres

_e = cast(sa.Table, ConsentEvent.__table__)
_n = cast(sa.Table, ConsentLogNode.__table__)
_st = cast(sa.Table, ConsentLogState.__table__)
_h = cast(sa.Table, ConsentTreeHead.__table__)

# The subscriber a gap event names: nobody.
GAP_SUBSCRIBER = uuid.UUID(int=0)
# How long closing a gap waits for a transaction that still holds its number.
_GAP_LOCK_TIMEOUT = "200ms"


def _ms(value: dt.datetime) -> int:
    return int(value.timestamp() * 1000)


class DatabaseNodes:
    """``merkle.NodeSource`` over ``consent_log_node``: one query per batch of nodes."""

    def __init__(self, bind: sa.Connection | Session) -> None:
        self._bind = bind

    def node_hashes(self, nodes: Sequence[merkle.NodeId]) -> list[bytes]:
        if not nodes:
            return []
        found: dict[tuple[int, int], bytes] = {}
        wanted = list(nodes)
        for start in range(0, len(wanted), 500):
            chunk = wanted[start : start + 500]
            rows = self._bind.execute(
                sa.select(_n.c.level, _n.c.idx, _n.c.hash).where(
                    sa.or_(*(sa.and_(_n.c.level == lv, _n.c.idx == ix) for lv, ix in chunk))
                )
            ).all()
            for row in rows:
                found[(row.level, row.idx)] = bytes(row.hash)
        result = []
        for node in wanted:
            value = found.get((node.level, node.index))
            if value is None:
                raise merkle.MissingNode(f"node {tuple(node)} is not stored")
            result.append(value)
        return result


# --- the sequencer ----------------------------------------------------------------------


@dataclass
class Integrated:
    """What one run of the sequencer did."""

    before: int
    after: int
    gaps_closed: list[int]
    waiting_on: int | None  # the seq of a hole still inside its grace period (or in flight)
    head: merkle.TreeHead | None

    @property
    def leaves(self) -> int:
        return self.after - self.before


def signing_key(text: str) -> ed25519.Ed25519PrivateKey:
    """The log key from ``CONSENT_LOG_SIGNING_KEY`` (base64url of the 32 raw bytes)."""
    from portal.config import b64url_decode

    if not text:
        raise RuntimeError("CONSENT_LOG_SIGNING_KEY is not set: tree heads cannot be signed")
    return ed25519.Ed25519PrivateKey.from_private_bytes(b64url_decode(text))


def _lock_state(session: Session) -> Any:
    """The state row, locked until COMMIT (the one sequencer at a time); made when missing
    (the migration makes it; an emptied database has none)."""
    query = sa.select(_st).where(_st.c.id == 1)
    if is_postgres(session):
        query = query.with_for_update()
    row = session.execute(query).one_or_none()
    if row is None:
        insert = (postgresql.insert if is_postgres(session) else sqlite.insert)(_st)
        session.execute(
            insert.values(
                id=1, tree_size=0, frontier=merkle.Frontier().to_bytes()
            ).on_conflict_do_nothing(index_elements=[_st.c.id])
        )
        row = session.execute(query).one()
    return row


def _try_close_gap(session: Session, seq: int, now: dt.datetime) -> bool:
    """Insert the ``gap`` event at ``seq``; False when a transaction still holds it."""
    values = {
        "seq": seq,
        "subscriber_id": GAP_SUBSCRIBER,
        "subscription_id": None,
        "topic_id": None,
        "kind": EventKind.GAP.value,
        "previous_state": None,
        "new_state": None,
        "source": "system",
        "policy_version": None,
        "decided_at": now,
        "recorded_at": now,
        "actor": "sequencer",
        "context": "{}",
    }
    postgres = is_postgres(session)
    statement = (
        (postgresql.insert if postgres else sqlite.insert)(_e)
        .values(**values)
        .on_conflict_do_nothing(index_elements=[_e.c.seq])
    )
    try:
        with session.begin_nested():
            if postgres:
                session.execute(
                    sa.select(sa.func.set_config("lock_timeout", _GAP_LOCK_TIMEOUT, True))
                )
            session.execute(statement)
            if postgres:
                session.execute(sa.select(sa.func.set_config("lock_timeout", "0", True)))
    except sa.exc.OperationalError:
        # lock_timeout: the number's transaction is still open. Try again next run.
        if postgres:
            session.execute(sa.select(sa.func.set_config("lock_timeout", "0", True)))
        return False
    return True


@dataclass
class _Run:
    """The sequencer's working state inside one integration."""

    frontier: merkle.Frontier
    gap_seq: int | None
    gap_seen_at: dt.datetime | None
    closed: list[int]
    nodes: list[merkle.Node]
    waiting: int | None = None


def _settle_hole(session: Session, run: _Run, after: Any, now: dt.datetime, grace: float) -> bool:
    """A hole at the tree's next seq, ``after`` the first committed event beyond it: True
    when it was closed with a gap event (integration goes on), False to wait.

    The hole has been open at least since ``after`` was recorded (its number was taken
    after the hole's), and at least since this sequencer first saw it; past the grace
    period by either, it is closed. Many holes left by one burst of rollbacks are thus
    closed in one run, not one per grace period.
    """
    hole = run.frontier.size + 1
    if run.gap_seq != hole or run.gap_seen_at is None:
        run.gap_seq, run.gap_seen_at = hole, now  # first seen now
    since = min(run.gap_seen_at, after.recorded_at)
    if (now - since).total_seconds() >= grace and _try_close_gap(session, hole, now):
        run.closed.append(hole)
        return True
    run.waiting = hole
    return False


def _extend(
    session: Session, run: _Run, *, batch: int, limit: int, now: dt.datetime, grace: float
) -> None:
    """Append the committed gap-free prefix after the tree's size, closing stale holes."""
    start = run.frontier.size
    while run.frontier.size - start < limit:
        rows = session.execute(
            sa.select(_e).where(_e.c.seq > run.frontier.size).order_by(_e.c.seq).limit(batch)
        ).all()
        taken = 0
        for row in rows:
            if row.seq != run.frontier.size + 1:
                after = row
                break
            run.nodes.extend(run.frontier.append(event_leaf_hash(row)))
            taken += 1
        if taken == len(rows):
            if len(rows) < batch:
                return  # everything committed is in
            continue
        # The number now holds a gap event, or the late event that committed meanwhile:
        # either is read and integrated by the next pass of the loop.
        if not _settle_hole(session, run, after, now, grace):
            return


def _sign(
    session: Session, key: ed25519.Ed25519PrivateKey, frontier: merkle.Frontier, now: dt.datetime
) -> merkle.TreeHead | None:
    """Store a signed head for the tree's size, unless one exists (one head per size;
    timestamps never go back)."""
    latest = session.execute(
        sa.select(_h.c.tree_size, _h.c.timestamp_ms).order_by(_h.c.tree_size.desc()).limit(1)
    ).one_or_none()
    if latest is not None and latest.tree_size == frontier.size:
        return None
    timestamp = max(_ms(now), latest.timestamp_ms if latest is not None else 0)
    head = merkle.sign_tree_head(
        key, tree_size=frontier.size, timestamp=timestamp, root_hash=frontier.root()
    )
    session.execute(
        sa.insert(_h).values(
            tree_size=head.tree_size,
            timestamp_ms=head.timestamp,
            root_hash=head.root_hash,
            signature=head.signature,
            public_key=merkle.public_key_bytes(key.public_key()),
        )
    )
    return head


# PostgreSQL takes a run's nodes in one statement per chunk, as two arrays and the hashes
# end to end in one bytea (an array of bytea costs the driver an escape per element): an
# executemany is one INSERT per node, two for each leaf, on the server as on the client.
_NODES_FROM_ARRAYS = sa.text(
    "INSERT INTO consent_log_node (level, idx, hash) "
    "SELECT node.level, node.idx, "
    "substring(CAST(:hashes AS bytea) FROM CAST(node.n AS integer) * 32 - 31 FOR 32) "
    "FROM unnest(CAST(:levels AS smallint[]), CAST(:indexes AS bigint[])) "
    "WITH ORDINALITY AS node(level, idx, n)"
)
_NODE_CHUNK = 10_000


def _store_nodes(session: Session, nodes: Sequence[merkle.Node]) -> None:
    """Insert the nodes a run completed (append-only: none exists yet)."""
    if not nodes:
        return
    if not is_postgres(session):
        session.execute(
            sa.insert(_n), [{"level": n.level, "idx": n.index, "hash": n.hash} for n in nodes]
        )
        return
    for start in range(0, len(nodes), _NODE_CHUNK):
        chunk = nodes[start : start + _NODE_CHUNK]
        session.execute(
            _NODES_FROM_ARRAYS,
            {
                "levels": [n.level for n in chunk],
                "indexes": [n.index for n in chunk],
                "hashes": b"".join(n.hash for n in chunk),
            },
        )


def integrate(
    session: Session,
    key: ed25519.Ed25519PrivateKey,
    *,
    now: dt.datetime,
    gap_grace_seconds: float,
    batch: int = 5000,
    max_leaves: int = 200_000,
) -> Integrated:
    """Integrate the committed gap-free prefix into the tree, in the caller's transaction.

    The caller commits; until then nothing of this run is visible, so a sequencer that
    dies here loses nothing and the next run repeats the same work.
    """
    state = _lock_state(session)
    frontier = merkle.Frontier.from_bytes(bytes(state.frontier))
    before = frontier.size
    if before != state.tree_size:
        raise merkle.MalformedInput("frontier", "the stored frontier disagrees with tree_size")
    run = _Run(frontier, state.gap_seq, state.gap_seen_at, [], [])
    _extend(session, run, batch=batch, limit=max_leaves, now=now, grace=gap_grace_seconds)
    if run.waiting is None:
        run.gap_seq, run.gap_seen_at = None, None
    _store_nodes(session, run.nodes)
    head = _sign(session, key, frontier, now)
    session.execute(
        sa.update(_st)
        .where(_st.c.id == 1)
        .values(
            tree_size=frontier.size,
            frontier=frontier.to_bytes(),
            gap_seq=run.gap_seq,
            gap_seen_at=run.gap_seen_at,
            updated_at=now,
        )
    )
    return Integrated(before, frontier.size, run.closed, run.waiting, head)


# --- reading the tree -------------------------------------------------------------------


def _head(row: Any) -> merkle.TreeHead:
    return merkle.TreeHead(
        tree_size=int(row.tree_size),
        timestamp=int(row.timestamp_ms),
        root_hash=bytes(row.root_hash),
        signature=bytes(row.signature),
    )


def latest_head(bind: sa.Connection | Session) -> merkle.TreeHead | None:
    row = bind.execute(sa.select(_h).order_by(_h.c.tree_size.desc()).limit(1)).one_or_none()
    return None if row is None else _head(row)


def head_at(bind: sa.Connection | Session, size: int) -> merkle.TreeHead | None:
    row = bind.execute(sa.select(_h).where(_h.c.tree_size == size)).one_or_none()
    return None if row is None else _head(row)


def head_public_key(bind: sa.Connection | Session, size: int) -> bytes | None:
    """The raw log key stored beside the signed head of ``size`` (the key that signed it)."""
    value = bind.execute(sa.select(_h.c.public_key).where(_h.c.tree_size == size)).scalar()
    return None if value is None else bytes(value)


def leaf_index(bind: sa.Connection | Session, leaf: bytes) -> int | None:
    """The index of the leaf with this hash, or None (leaf hashes are unique: each event's
    canonical bytes carry its own seq)."""
    value = bind.execute(
        sa.select(_n.c.idx).where(_n.c.level == 0, _n.c.hash == leaf).limit(1)
    ).scalar_one_or_none()
    return None if value is None else int(value)


def inclusion(bind: sa.Connection | Session, index: int, size: int) -> merkle.InclusionProof:
    path = merkle.inclusion_proof(DatabaseNodes(bind), index, size)
    return merkle.InclusionProof(index, tuple(path))


def consistency(bind: sa.Connection | Session, first: int, second: int) -> merkle.ConsistencyProof:
    return merkle.ConsistencyProof(
        tuple(merkle.consistency_proof(DatabaseNodes(bind), first, second))
    )


# --- verification -----------------------------------------------------------------------


@dataclass(frozen=True)
class ChainProblem:
    seq: int
    reason: str

    def __str__(self) -> str:
        return f"event {self.seq}: {self.reason}"


@dataclass(frozen=True)
class ChainReport:
    """The verdict of ``verify_log``: how many events were read, the first problem, the
    signed head the tree was checked against (None before the first sequencer run)."""

    events: int
    problem: ChainProblem | None
    last_hash: bytes
    head: merkle.TreeHead | None = None
    pending: int = 0  # committed events the sequencer has not integrated yet

    @property
    def ok(self) -> bool:
        return self.problem is None


def _rows(connection: sa.Connection, batch: int) -> Iterator[Any]:
    last = 0
    while True:
        rows = connection.execute(
            sa.select(_e).where(_e.c.seq > last).order_by(_e.c.seq).limit(batch)
        ).all()
        if not rows:
            return
        yield from rows
        last = rows[-1].seq


def _stored_leaves(connection: sa.Connection, start: int, end: int) -> dict[int, bytes]:
    rows = connection.execute(
        sa.select(_n.c.idx, _n.c.hash).where(_n.c.level == 0, _n.c.idx >= start, _n.c.idx < end)
    ).all()
    return {int(row.idx): bytes(row.hash) for row in rows}


class _Bad(Exception):
    """The first problem the walk found."""

    def __init__(self, seq: int, reason: str) -> None:
        super().__init__(reason)
        self.seq = seq
        self.reason = reason


class _Walk:
    """``verify_log``'s pass over the rows, one at a time, in seq order."""

    def __init__(self, connection: sa.Connection, size: int, batch: int) -> None:
        self.connection = connection
        self.size = size
        self.batch = batch
        self.expected = 1
        self.prev_hash = GENESIS
        self.chained = True
        self.frontier = merkle.Frontier()
        self.stored: dict[int, bytes] = {}
        self.count = 0
        self.pending = 0
        self.roots: dict[int, bytes] = {}

    def row(self, row: Any, anchors: dict[int, bytes], keep_root_at: int | None) -> None:
        self.count += 1
        if row.seq > self.size:
            self.pending += 1  # committed, not integrated yet
            return
        if row.seq != self.expected:
            raise _Bad(self.expected, "missing (deleted?)")
        fields = row_fields(row)
        self._chain(row, fields)
        leaf = merkle.leaf_hash(canonical(fields))
        index = row.seq - 1
        if index not in self.stored:
            self.stored = _stored_leaves(self.connection, index, index + self.batch)
        if self.stored.get(index) != leaf:
            raise _Bad(row.seq, "leaf hash does not match its content (altered)")
        anchored = anchors.pop(row.seq, None)
        if anchored is not None and anchored not in (leaf, row.hash and bytes(row.hash)):
            raise _Bad(row.seq, "hash differs from the anchor (the log was rewritten)")
        self.frontier.append(leaf)
        if self.frontier.size == keep_root_at:
            self.roots[keep_root_at] = self.frontier.root()
        self.expected += 1

    def _chain(self, row: Any, fields: Mapping[str, Any]) -> None:
        """The hash chain of the events written before the tree: their history."""
        if row.hash is None:
            self.chained = False
            return
        if not self.chained:
            raise _Bad(row.seq, "a chain hash after the chain ended (inserted?)")
        if row.prev_hash is None or bytes(row.prev_hash) != self.prev_hash:
            raise _Bad(row.seq, "prev_hash does not match the previous event")
        if chain_hash(self.prev_hash, fields) != bytes(row.hash):
            raise _Bad(row.seq, "hash does not match its content (altered)")
        self.prev_hash = bytes(row.hash)


def _check_head(
    connection: sa.Connection,
    walk: _Walk,
    head: merkle.TreeHead,
    key: ed25519.Ed25519PublicKey,
) -> None:
    size = head.tree_size
    if walk.frontier.size < size:
        raise _Bad(walk.frontier.size + 1, f"missing: the signed head has {size} leaves")
    if walk.frontier.root() != head.root_hash:
        raise _Bad(size, "the tree's root is not the signed head's (altered?)")
    try:
        merkle.verify_tree_head(key, head)
    except merkle.InvalidTreeHead as error:
        raise _Bad(size, str(error)) from None
    state = connection.execute(sa.select(_st.c.tree_size, _st.c.frontier)).first()
    if (
        state is not None
        and state.tree_size == size
        and merkle.Frontier.from_bytes(bytes(state.frontier)) != walk.frontier
    ):
        raise _Bad(size, "the sequencer's stored frontier is not the tree's")


def _check_saved(
    connection: sa.Connection, walk: _Walk, saved: merkle.TreeHead, head: merkle.TreeHead
) -> None:
    """A head kept from earlier: today's rows give its root, and the stored nodes give a
    consistency proof from it to today's head that verifies."""
    if walk.roots.get(saved.tree_size) != saved.root_hash:
        raise _Bad(
            saved.tree_size,
            "the tree of the saved head's size has another root (history rewritten)",
        )
    try:
        proof = consistency(connection, saved.tree_size, head.tree_size)
        merkle.verify_consistency(
            first=saved.tree_size,
            second=head.tree_size,
            first_root=saved.root_hash,
            second_root=head.root_hash,
            proof=proof.consistency,
        )
    except merkle.MerkleError as error:
        raise _Bad(saved.tree_size, f"no consistency proof from the saved head: {error}") from None


def verify_log(
    connection: sa.Connection,
    *,
    batch: int = 5000,
    progress: Any = None,
    anchors: Mapping[int, bytes] | None = None,
    log_keys: Sequence[ed25519.Ed25519PublicKey] = (),
    saved_head: merkle.TreeHead | None = None,
) -> ChainReport:
    """Walk the whole log in order; report the first event that is wrong.

    Checks: the events of the tree are numbered 1…size with none missing; each one's leaf
    hash, recomputed from its row, is the stored leaf; the root recomputed from those
    leaves is the latest signed head's, and the head's signature verifies with one of
    ``log_keys`` (the keys the checker trusts: the log's own and, after a change of it,
    the earlier ones; with none given, the key stored beside the head); the events
    written before the tree still form their hash chain. ``anchors`` (seq → hash kept
    outside the database: the chain hash of an event before the tree, the leaf hash of one
    after) must still be in the log, unchanged. ``saved_head`` (a signed head kept from
    earlier) must be a prefix of today's tree: its root is recomputed from today's rows,
    and the stored nodes' consistency proof from it to today's head must verify.
    """
    anchors = dict(anchors or {})
    head_row = connection.execute(sa.select(_h).order_by(_h.c.tree_size.desc()).limit(1)).first()
    head = _head(head_row) if head_row is not None else None
    size = head.tree_size if head is not None else 0
    walk = _Walk(connection, size, batch)
    keep = saved_head.tree_size if saved_head is not None and saved_head.tree_size else None
    try:
        if saved_head is not None:
            if log_keys and not _signed_by_one(log_keys, saved_head):
                raise _Bad(0, f"the saved tree head: {_unsigned(log_keys)}")
            if saved_head.tree_size > size:
                raise _Bad(
                    size + 1,
                    f"the saved tree head has {saved_head.tree_size} leaves, the log's latest "
                    f"signed head only {size} (entries removed?)",
                )
        for row in _rows(connection, batch):
            if progress is not None:
                progress.advance(1)
            walk.row(row, anchors, keep)
        if head is not None and head_row is not None:
            stored = ed25519.Ed25519PublicKey.from_public_bytes(bytes(head_row.public_key))
            trusted = [
                key
                for key in log_keys
                if merkle.public_key_bytes(key) == merkle.public_key_bytes(stored)
            ]
            if log_keys and not trusted:
                raise _Bad(head.tree_size, f"the latest signed tree head: {_unsigned(log_keys)}")
            _check_head(connection, walk, head, trusted[0] if trusted else stored)
            if saved_head is not None and keep is not None:
                _check_saved(connection, walk, saved_head, head)
        if anchors:
            raise _Bad(
                min(anchors),
                f"missing: the log ends at seq {walk.expected - 1} (newest events deleted?)",
            )
    except _Bad as bad:
        return ChainReport(
            walk.count, ChainProblem(bad.seq, bad.reason), walk.prev_hash, head, walk.pending
        )
    return ChainReport(walk.count, None, walk.prev_hash, head, walk.pending)


def _signed_by_one(keys: Sequence[ed25519.Ed25519PublicKey], head: merkle.TreeHead) -> bool:
    for key in keys:
        try:
            merkle.verify_tree_head(key, head)
            return True
        except merkle.InvalidTreeHead:
            continue
    return False


def _unsigned(keys: Sequence[ed25519.Ed25519PublicKey]) -> str:
    if len(keys) == 1:
        return (
            "the tree head's signature does not verify with the log key (if the log's key "
            "changed since that head was signed, pass the earlier key with --log-key)"
        )
    return "the tree head's signature verifies with none of the log keys given"


# The old name: every caller that verified the chain now verifies the tree.
verify_chain = verify_log
