"""Consent-history exports: a data file, the policy texts it cites, a signed manifest.

The rows are a snapshot: the log is append-only, so the events with ``seq`` up to the
log's head when the export starts, filtered by ``recorded_at`` (and a topic or a
subscriber), never change; the count, the first and last events and the policy versions
are read up front and the data then streams in keyset batches over ``seq`` with flat
memory. On PostgreSQL a CSV batch is written by the database itself (``COPY (SELECT …)
TO STDOUT``): the same query, formatted and neutralised in SQL, so the portable path
(Python's csv module, used on SQLite) and PostgreSQL's write the same cells.

Cells a spreadsheet would read as a formula — starting with ``=``, ``+``, ``-``, ``@``,
a tab or a carriage return — get a leading ``'``; so does a cell that already starts
with ``'``, which makes the escape reversible (:func:`restore`) and lets a verifier
recompute every event's hash from the CSV. NDJSON holds the values as they are.
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import hashlib
import io
import json
import os
import shutil
import uuid
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import psycopg
import sqlalchemy as sa

from portal.clock import LAST_DAY
from portal.compliance.signing import ALGORITHM, SigningKey
from portal.consent import merkle, tree
from portal.consent.log import iso
from portal.consent.merkle import TreeHead
from portal.consent.models import (
    ConsentEvent,
    ConsentLogNode,
    ConsentLogState,
    PolicyVersion,
    Topic,
)

FORMAT = "push-consent-portal/consent-export/3"
MANIFEST = "manifest.json"
POLICY_FOLDER = "policies"
DATA_FILES = {"csv": "consent-events.csv", "ndjson": "consent-events.ndjson"}
# The subset proof that every exported event is a leaf under the bundle's tree head: one
# lowercase hex hash a line, in the order merkle.subset_proof gives them.
PROOF_FILE = "tree-proof.txt"
PROOF_METHOD = (
    "merkle subset proof: walk RFC 9162's MTH recursion from the root, left to right; a "
    "range with no exported event is the next hash of this file, a range of one event is "
    "its leaf_hash, any other range splits; the result is the tree head's root"
)
COLUMNS = (
    "seq",
    "recorded_at",
    "decided_at",
    "subscriber_id",
    "subscription_id",
    "topic_id",
    "topic_slug",
    "topic_label",
    "kind",
    "previous_state",
    "new_state",
    "source",
    "policy_version",
    "actor",
    "context",
    "prev_hash",
    "hash",
    "leaf_hash",
)
# Columns that hold free text (everything else is a number, a time, a UUID or hex).
TEXT_COLUMNS = frozenset(
    {
        "topic_slug",
        "topic_label",
        "kind",
        "previous_state",
        "new_state",
        "source",
        "policy_version",
        "actor",
        "context",
    }
)
RISKY_FIRST = ("=", "+", "-", "@", "\t", "\r")
QUOTE = "'"
ESCAPE_RULE = (
    "a cell starting with = + - @ TAB CR or ' starts with an added '; remove one leading ' "
    "from a cell that starts with ' to get the value back"
)
BATCH_SIZE = 20_000

_e = cast(sa.Table, ConsentEvent.__table__)
_t = cast(sa.Table, Topic.__table__)
_p = cast(sa.Table, PolicyVersion.__table__)
_n = cast(sa.Table, ConsentLogNode.__table__)
_st = cast(sa.Table, ConsentLogState.__table__)
# An event's leaf in the consent log's tree: leaf seq - 1 (portal.consent.tree).
_leaf = _n.alias("leaf")


def neutralise(value: str) -> str:
    """The CSV formula escape (the reference for the SQL in :func:`_neutralised`)."""
    return QUOTE + value if value[:1] in (*RISKY_FIRST, QUOTE) else value


def restore(value: str) -> str:
    return value[1:] if value[:1] == QUOTE else value


def canonical(document: Mapping[str, Any]) -> bytes:
    """Sorted-key compact JSON, ASCII: the bytes a manifest's signature covers."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


class ExportError(Exception):
    """An export that cannot run as asked; the message says why."""


# -- what to export -------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportFilter:
    start: dt.date  # UTC days, both inclusive
    end: dt.date
    topic: str | None = None
    subscriber_id: uuid.UUID | None = None

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ExportError("the end date is before the start date")
        if self.end > LAST_DAY:  # the period ends at the midnight after its last day
            raise ExportError(f"the last day must be on or before {LAST_DAY.isoformat()}")

    @property
    def recorded_from(self) -> dt.datetime:
        return dt.datetime.combine(self.start, dt.time(), tzinfo=dt.UTC)

    @property
    def recorded_before(self) -> dt.datetime:
        return dt.datetime.combine(self.end + dt.timedelta(days=1), dt.time(), tzinfo=dt.UTC)

    def describe(self) -> dict[str, Any]:
        return {
            "from": self.start.isoformat(),
            "to": self.end.isoformat(),
            "recorded_at_from": iso(self.recorded_from),
            "recorded_at_before": iso(self.recorded_before),
            "topic": self.topic,
            "subscriber": str(self.subscriber_id) if self.subscriber_id else None,
        }


@dataclass(frozen=True)
class Endpoint:
    seq: int
    hash: str


@dataclass(frozen=True)
class ExportPlan:
    """The snapshot to export, fixed before the first byte is written."""

    filters: ExportFilter
    topic_id: int | None
    head_seq: int  # the log's last event in its tree when the export started
    rows: int
    first: Endpoint | None
    last: Endpoint | None
    policy_versions: tuple[str, ...]
    # The signed tree head of size head_seq: every exported event is a leaf under it.
    tree_head: TreeHead | None = None
    log_key: bytes | None = None  # the consent log's public key that signed tree_head

    @property
    def after_seq(self) -> int:
        return self.first.seq - 1 if self.first else self.head_seq

    @property
    def last_seq(self) -> int:
        return self.last.seq if self.last else self.head_seq


def _conditions(filters: ExportFilter, topic_id: int | None) -> list[sa.ColumnElement[bool]]:
    conditions = [
        _e.c.recorded_at >= filters.recorded_from,
        _e.c.recorded_at < filters.recorded_before,
    ]
    if topic_id is not None:
        conditions.append(_e.c.topic_id == topic_id)
    if filters.subscriber_id is not None:
        conditions.append(_e.c.subscriber_id == filters.subscriber_id)
    return conditions


def plan_export(connection: sa.Connection, filters: ExportFilter) -> ExportPlan:
    topic_id: int | None = None
    if filters.topic is not None:
        topic_id = connection.execute(
            sa.select(_t.c.id).where(_t.c.slug == filters.topic)
        ).scalar_one_or_none()
        if topic_id is None:
            raise ExportError(f"there is no topic {filters.topic!r}")
    # The snapshot is the log's tree as far as it goes (the caller integrates first:
    # portal.compliance.services.start_export): event seq is leaf seq - 1 of it.
    head = int(connection.execute(sa.select(_st.c.tree_size).where(_st.c.id == 1)).scalar_one())
    signed = tree.head_at(connection, head)
    log_key = tree.head_public_key(connection, head)
    where = [*_conditions(filters, topic_id), _e.c.seq <= head]
    count, low, high = connection.execute(
        sa.select(sa.func.count(), sa.func.min(_e.c.seq), sa.func.max(_e.c.seq)).where(*where)
    ).one()
    if not count:
        return ExportPlan(filters, topic_id, head, 0, None, None, (), signed, log_key)
    ends = {
        int(row.idx) + 1: Endpoint(int(row.idx) + 1, bytes(row.hash).hex())
        for row in connection.execute(
            sa.select(_n.c.idx, _n.c.hash).where(
                _n.c.level == 0, _n.c.idx.in_([int(low) - 1, int(high) - 1])
            )
        )
    }
    versions = connection.execute(
        sa.select(_e.c.policy_version)
        .where(*where, _e.c.policy_version.is_not(None))
        .group_by(_e.c.policy_version)
    ).scalars()
    return ExportPlan(
        filters,
        topic_id,
        int(head),
        int(count),
        ends[low],
        ends[high],
        tuple(sorted(versions)),
        signed,
        log_key,
    )


# -- the query ------------------------------------------------------------------------------


def _text(expression: Any) -> Any:
    return sa.type_coerce(expression, sa.Text)


def _time(column: Any, dialect: str) -> Any:
    if dialect == "postgresql":
        return sa.func.to_char(
            sa.func.timezone("UTC", column),
            sa.literal_column("""'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'"""),
        )
    # SQLite holds UTC as 'YYYY-MM-DD HH:MM:SS.ffffff'.
    return _text(sa.func.replace(_text(column), " ", "T")) + "Z"


def _uuid(column: Any, dialect: str) -> Any:
    if dialect == "postgresql":
        return sa.cast(column, sa.Text)
    # SQLite holds a UUID as 32 hex digits.
    raw = _text(column)
    parts = [sa.func.substr(raw, start, length) for start, length in _UUID_PARTS]
    joined = parts[0]
    for part in parts[1:]:
        joined = _text(joined) + "-" + _text(part)
    return sa.func.lower(joined)


_UUID_PARTS = ((1, 8), (9, 4), (13, 4), (17, 4), (21, 12))


def _hex(column: Any, dialect: str) -> Any:
    if dialect == "postgresql":
        return sa.func.encode(column, sa.literal_column("'hex'"))
    # SQLite's hex(NULL) is '': NULL stays NULL, as encode() leaves it on PostgreSQL.
    return sa.case((column.is_(None), sa.null()), else_=sa.func.lower(sa.func.hex(column)))


def _neutralised(column: Any, dialect: str) -> Any:
    """:func:`neutralise` in SQL."""
    first = sa.func.substr(_text(column), 1, 1)
    risky: list[Any] = [sa.literal_column(_sql_char(c, dialect)) for c in (*RISKY_FIRST, QUOTE)]
    return sa.case((first.in_(risky), sa.literal_column("''''") + _text(column)), else_=column)


def _sql_char(char: str, dialect: str) -> str:
    # Literals rather than parameters keep the query printable for psql as it is.
    if not char.isprintable():
        return f"{'chr' if dialect == 'postgresql' else 'char'}({ord(char)})"
    return "'" + char.replace("'", "''") + "'"


def event_query(
    dialect: str,
    plan: ExportPlan,
    *,
    neutralised: bool,
    after: Any,
    through: Any,
    limit: Any = None,
) -> sa.Select[Any]:
    """The export's rows in ``seq`` order, every value already text (but seq, topic_id)."""
    values: dict[str, Any] = {
        "seq": _e.c.seq,
        "recorded_at": _time(_e.c.recorded_at, dialect),
        "decided_at": _time(_e.c.decided_at, dialect),
        "subscriber_id": _uuid(_e.c.subscriber_id, dialect),
        "subscription_id": _uuid(_e.c.subscription_id, dialect),
        "topic_id": _e.c.topic_id,
        "topic_slug": _t.c.slug,
        "topic_label": _t.c.label,
        "kind": _e.c.kind,
        "previous_state": _e.c.previous_state,
        "new_state": _e.c.new_state,
        "source": _e.c.source,
        "policy_version": _e.c.policy_version,
        "actor": _e.c.actor,
        "context": _e.c.context,
        "prev_hash": _hex(_e.c.prev_hash, dialect),
        "hash": _hex(_e.c.hash, dialect),
        "leaf_hash": _hex(_leaf.c.hash, dialect),
    }
    columns = [
        (
            _neutralised(values[name], dialect)
            if neutralised and name in TEXT_COLUMNS
            else values[name]
        )
        for name in COLUMNS
    ]
    query = (
        sa.select(*(column.label(name) for column, name in zip(columns, COLUMNS, strict=True)))
        .select_from(
            _e.outerjoin(_t, _t.c.id == _e.c.topic_id).join(
                _leaf, (_leaf.c.level == 0) & (_leaf.c.idx == _e.c.seq - 1)
            )
        )
        .where(
            *_conditions(plan.filters, plan.topic_id),
            _e.c.seq > after,
            _e.c.seq <= through,
        )
        .order_by(_e.c.seq)
    )
    return query.limit(limit) if limit is not None else query


def fetch_batch(
    connection: sa.Connection, plan: ExportPlan, *, after: int, limit: int, neutralised: bool
) -> list[Any]:
    """One keyset batch: the next ``limit`` rows after ``after``."""
    query = event_query(
        connection.dialect.name,
        plan,
        neutralised=neutralised,
        after=sa.bindparam("after", type_=sa.BigInteger),
        through=sa.bindparam("through", type_=sa.BigInteger),
        limit=sa.bindparam("limit", type_=sa.Integer),
    )
    return list(
        connection.execute(query, {"after": after, "through": plan.last_seq, "limit": limit})
    )


def iter_batches(
    engine: sa.Engine, plan: ExportPlan, *, neutralised: bool, batch_size: int = BATCH_SIZE
) -> Iterator[list[Any]]:
    """Rows in keyset batches, each read in a short transaction of its own (so an export
    holds no snapshot, and on SQLite no lock, while the client reads)."""
    after = plan.after_seq
    while after < plan.last_seq:
        with engine.connect() as connection:
            rows = fetch_batch(
                connection, plan, after=after, limit=batch_size, neutralised=neutralised
            )
        if not rows:
            return
        yield rows
        after = rows[-1][0]


# -- writing the data file ------------------------------------------------------------------


class _ListSink:
    def __init__(self) -> None:
        self.parts: list[str] = []
        self.write = self.parts.append

    def take(self) -> str:
        text = "".join(self.parts)
        self.parts.clear()
        return text


def _csv_header() -> bytes:
    return (",".join(COLUMNS) + "\n").encode()


def csv_chunks(
    engine: sa.Engine, plan: ExportPlan, *, batch_size: int = BATCH_SIZE
) -> Iterator[bytes]:
    """The CSV file, a batch at a time."""
    yield _csv_header()
    if plan.rows == 0:
        return
    if engine.dialect.name == "postgresql":
        yield from _copy_chunks(engine, plan, batch_size=batch_size)
        return
    sink = _ListSink()
    writer = csv.writer(sink, lineterminator="\n")
    for rows in iter_batches(engine, plan, neutralised=True, batch_size=batch_size):
        writer.writerows(rows)
        text = sink.take()
        if "\r" in text:
            # The csv module quotes a lone CR only when it is in the line terminator;
            # such rows (rare) are written by hand, quoted as COPY quotes them.
            text = "".join(_csv_line(row) for row in rows)
        yield text.encode("utf-8")


def _csv_line(row: Iterable[Any]) -> str:
    cells = []
    for value in row:
        if value is None:
            cells.append("")
            continue
        text = str(value)
        if text == "" or any(c in text for c in ',"\r\n'):
            text = '"' + text.replace('"', '""') + '"'
        cells.append(text)
    return ",".join(cells) + "\n"


def copy_statement(engine: sa.Engine, plan: ExportPlan, *, after: int, through: int) -> str:
    """The literal ``COPY (…) TO STDOUT`` of one batch (also what the benchmark runs)."""
    query = event_query(
        "postgresql", plan, neutralised=True, after=sa.literal(after), through=sa.literal(through)
    )
    compiled = query.compile(dialect=engine.dialect)
    with engine.connect() as connection:
        sql = psycopg.ClientCursor(_driver(connection)).mogrify(str(compiled), compiled.params)
    return f"COPY ({sql}) TO STDOUT WITH (FORMAT csv)"


def _driver(connection: sa.Connection) -> psycopg.Connection[Any]:
    driver = connection.connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    return driver


def _copy_chunks(engine: sa.Engine, plan: ExportPlan, *, batch_size: int) -> Iterator[bytes]:
    after = plan.after_seq
    while after < plan.last_seq:
        with engine.connect() as connection:
            # Keyset: the seq that ends this batch, then the batch up to it.
            boundary = connection.execute(
                sa.select(_e.c.seq)
                .where(*_conditions(plan.filters, plan.topic_id), _e.c.seq > after)
                .where(_e.c.seq <= plan.last_seq)
                .order_by(_e.c.seq)
                .offset(batch_size - 1)
                .limit(1)
            ).scalar_one_or_none()
            through = int(boundary) if boundary is not None else plan.last_seq
            query = event_query(
                "postgresql",
                plan,
                neutralised=True,
                after=sa.bindparam("after", after, type_=sa.BigInteger),
                through=sa.bindparam("through", through, type_=sa.BigInteger),
            )
            compiled = query.compile(dialect=engine.dialect)
            cursor = _driver(connection).cursor()
            try:
                with cursor.copy(
                    f"COPY ({compiled}) TO STDOUT WITH (FORMAT csv)", compiled.params
                ) as copy:
                    buffered: list[bytes] = []
                    size = 0
                    for data in copy:
                        buffered.append(bytes(data))
                        size += len(data)
                        if size >= 1 << 20:  # hand on about 1 MiB at a time
                            yield b"".join(buffered)
                            buffered, size = [], 0
                    if buffered:
                        yield b"".join(buffered)
            finally:
                cursor.close()
            connection.rollback()
        after = through


def ndjson_chunks(
    engine: sa.Engine, plan: ExportPlan, *, batch_size: int = BATCH_SIZE
) -> Iterator[bytes]:
    """One JSON object per line, keys in column order, values as stored."""
    if plan.rows == 0:
        return
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    for rows in iter_batches(engine, plan, neutralised=False, batch_size=batch_size):
        lines = [dumps(dict(zip(COLUMNS, row, strict=True))) for row in rows]
        lines.append("")
        yield "\n".join(lines).encode("utf-8")


def data_chunks(
    engine: sa.Engine, plan: ExportPlan, data_format: str, *, batch_size: int = BATCH_SIZE
) -> Iterator[bytes]:
    if data_format == "csv":
        return csv_chunks(engine, plan, batch_size=batch_size)
    if data_format == "ndjson":
        return ndjson_chunks(engine, plan, batch_size=batch_size)
    raise ExportError(f"unknown format {data_format!r}: csv or ndjson")


# -- the tree proof -------------------------------------------------------------------------


class _EngineNodes:
    """``merkle.NodeSource`` reading each batch in a short transaction of its own, as the
    data batches are read."""

    def __init__(self, engine: sa.Engine) -> None:
        self._engine = engine

    def node_hashes(self, nodes: Any) -> list[bytes]:
        with self._engine.connect() as connection:
            return tree.DatabaseNodes(connection).node_hashes(nodes)


def leaf_indexes(
    engine: sa.Engine, plan: ExportPlan, *, batch_size: int = BATCH_SIZE
) -> Iterator[int]:
    """The exported events' leaf indexes (seq - 1), in order, in keyset batches."""
    after = plan.after_seq
    while after < plan.last_seq:
        with engine.connect() as connection:
            seqs = connection.execute(
                sa.select(_e.c.seq)
                .where(
                    *_conditions(plan.filters, plan.topic_id),
                    _e.c.seq > after,
                    _e.c.seq <= plan.last_seq,
                )
                .order_by(_e.c.seq)
                .limit(batch_size)
            ).scalars()
            batch = [int(seq) for seq in seqs]
        if not batch:
            return
        for seq in batch:
            yield seq - 1
        after = batch[-1]


def proof_chunks(
    engine: sa.Engine, plan: ExportPlan, *, batch_size: int = BATCH_SIZE
) -> Iterator[bytes]:
    """The tree proof file: the subset proof of the exported events under the plan's
    signed tree head (nothing when no event is exported)."""
    if plan.rows == 0:
        return
    lines: list[str] = []
    for value in merkle.subset_proof(
        _EngineNodes(engine), leaf_indexes(engine, plan, batch_size=batch_size), plan.head_seq
    ):
        lines.append(value.hex())
        if len(lines) >= 4096:
            yield ("\n".join(lines) + "\n").encode()
            lines = []
    if lines:
        yield ("\n".join(lines) + "\n").encode()


# -- the bundle -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyFile:
    version: str
    name: str
    content: bytes
    sha256: str
    published_at: dt.datetime


def policy_file_name(version: str) -> str:
    return f"{POLICY_FOLDER}/{version}.txt"


def policy_files(connection: sa.Connection, versions: Iterable[str]) -> list[PolicyFile]:
    rows = connection.execute(
        sa.select(_p.c.version, _p.c.text, _p.c.published_at)
        .where(_p.c.version.in_(list(versions)))
        .order_by(_p.c.version)
    ).all()
    files = []
    for version, text, published_at in rows:
        content = text.encode("utf-8")
        files.append(
            PolicyFile(
                version,
                policy_file_name(version),
                content,
                hashlib.sha256(content).hexdigest(),
                published_at,
            )
        )
    return files


@dataclass
class DataDigest:
    """Counts the bytes of the data file as they pass and hashes them."""

    sha256: Any = field(default_factory=hashlib.sha256)
    size: int = 0

    def watch(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            self.sha256.update(chunk)
            self.size += len(chunk)
            yield chunk


def build_manifest(
    *,
    plan: ExportPlan,
    data_format: str,
    digest: DataDigest,
    proof: DataDigest,
    policies: list[PolicyFile],
    exporter: Mapping[str, Any],
    created_at: dt.datetime,
    key: SigningKey,
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "file": DATA_FILES[data_format],
        "format": data_format,
        "columns": list(COLUMNS),
        "rows": plan.rows,
        "bytes": digest.size,
        "sha256": digest.sha256.hexdigest(),
    }
    if data_format == "csv":
        data["escaping"] = ESCAPE_RULE
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "created_at": iso(created_at),
        "exporter": dict(exporter),
        "filters": plan.filters.describe(),
        "log_head_seq": plan.head_seq,
        "tree_head": plan.tree_head.to_json() if plan.tree_head is not None else None,
        "log_key": base64.b64encode(plan.log_key).decode() if plan.log_key else None,
        "tree_proof": {
            "file": PROOF_FILE,
            "method": PROOF_METHOD,
            "hashes": proof.size // (2 * merkle.HASH_SIZE + 1),
            "sha256": proof.sha256.hexdigest(),
        },
        "data": data,
        "events": {
            "first": {"seq": plan.first.seq, "hash": plan.first.hash} if plan.first else None,
            "last": {"seq": plan.last.seq, "hash": plan.last.hash} if plan.last else None,
        },
        "policies": [
            {
                "version": policy.version,
                "file": policy.name,
                "sha256": policy.sha256,
                "published_at": iso(policy.published_at),
            }
            for policy in policies
        ],
        "signature_algorithm": ALGORITHM,
        "public_key": key.public.hex,
    }
    manifest["signature"] = key.sign(canonical(manifest)).hex()
    return manifest


def manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
    # Readable on disk; the signature covers the canonical form, not this layout.
    return (json.dumps(manifest, sort_keys=True, indent=2, ensure_ascii=True) + "\n").encode()


def write_bundle(
    directory: Path,
    engine: sa.Engine,
    plan: ExportPlan,
    data_format: str,
    *,
    exporter: Mapping[str, Any],
    created_at: dt.datetime,
    key: SigningKey,
    batch_size: int = BATCH_SIZE,
) -> dict[str, Any]:
    """Write the bundle into ``directory`` (which must not exist yet).

    Files are written into a sibling folder and renamed at the end, so a bundle that is
    there is complete: an interrupted export leaves no half bundle behind.
    """
    if directory.exists():
        raise ExportError(f"{directory} exists already: choose a new folder")
    staging = directory.with_name(f".{directory.name}.partial-{os.getpid()}")
    staging.mkdir(parents=True)
    try:
        digest = DataDigest()
        with (staging / DATA_FILES[data_format]).open("wb") as handle:
            for chunk in digest.watch(
                data_chunks(engine, plan, data_format, batch_size=batch_size)
            ):
                handle.write(chunk)
        proof = DataDigest()
        with (staging / PROOF_FILE).open("wb") as handle:
            for chunk in proof.watch(proof_chunks(engine, plan, batch_size=batch_size)):
                handle.write(chunk)
        with engine.connect() as connection:
            policies = policy_files(connection, plan.policy_versions)
        (staging / POLICY_FOLDER).mkdir()
        for policy in policies:
            (staging / policy.name).write_bytes(policy.content)
        manifest = build_manifest(
            plan=plan,
            data_format=data_format,
            digest=digest,
            proof=proof,
            policies=policies,
            exporter=exporter,
            created_at=created_at,
            key=key,
        )
        (staging / MANIFEST).write_bytes(manifest_bytes(manifest))
        staging.rename(directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


class _ZipSink(io.RawIOBase):
    """A write-only, unseekable stream zipfile writes into; drained after each write."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.position = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self.parts.append(chunk)
        self.position += len(chunk)
        return len(chunk)

    def tell(self) -> int:
        return self.position

    def drain(self) -> bytes:
        data = b"".join(self.parts)
        self.parts.clear()
        return data


def bundle_name(filters: ExportFilter, data_format: str) -> str:
    """The bundle's name, carrying its period and data format: the folder, and the .zip
    the console sends (``consent-export-2026-01-01_2026-01-31-csv``)."""
    if data_format not in DATA_FILES:
        raise ExportError(f"no data format {data_format!r}: choose {' or '.join(DATA_FILES)}")
    return f"consent-export-{filters.start.isoformat()}_{filters.end.isoformat()}-{data_format}"


def stream_zip(
    engine: sa.Engine,
    plan: ExportPlan,
    data_format: str,
    *,
    exporter: Mapping[str, Any],
    created_at: dt.datetime,
    key: SigningKey,
    batch_size: int = BATCH_SIZE,
) -> Iterator[bytes]:
    """The bundle as a .zip, produced while it is sent: the data first, then the policy
    texts it cites, then the manifest with the data's hash. Stored, not compressed: the
    archive is only the envelope, and compressing would cost the server more CPU than
    writing the rows."""
    folder = bundle_name(plan.filters, data_format)
    sink = _ZipSink()
    digest = DataDigest()
    with zipfile.ZipFile(sink, "w", compression=zipfile.ZIP_STORED) as archive:
        with archive.open(
            _member(f"{folder}/{DATA_FILES[data_format]}", created_at), "w", force_zip64=True
        ) as handle:
            for chunk in digest.watch(
                data_chunks(engine, plan, data_format, batch_size=batch_size)
            ):
                handle.write(chunk)
                if sink.parts:
                    yield sink.drain()
        proof = DataDigest()
        with archive.open(
            _member(f"{folder}/{PROOF_FILE}", created_at), "w", force_zip64=True
        ) as handle:
            for chunk in proof.watch(proof_chunks(engine, plan, batch_size=batch_size)):
                handle.write(chunk)
                if sink.parts:
                    yield sink.drain()
        with engine.connect() as connection:
            policies = policy_files(connection, plan.policy_versions)
        for policy in policies:
            archive.writestr(_member(f"{folder}/{policy.name}", created_at), policy.content)
        manifest = build_manifest(
            plan=plan,
            data_format=data_format,
            digest=digest,
            proof=proof,
            policies=policies,
            exporter=exporter,
            created_at=created_at,
            key=key,
        )
        archive.writestr(_member(f"{folder}/{MANIFEST}", created_at), manifest_bytes(manifest))
    yield sink.drain()  # the central directory, written on close


def _member(name: str, when: dt.datetime) -> zipfile.ZipInfo:
    utc = when.astimezone(dt.UTC)
    info = zipfile.ZipInfo(
        name, (max(utc.year, 1980), utc.month, utc.day, utc.hour, utc.minute, utc.second)
    )
    info.compress_type = zipfile.ZIP_STORED
    info.external_attr = 0o644 << 16  # rw-r--r-- when unpacked
    return info
