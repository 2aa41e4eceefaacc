"""The engine's claim as a campaign is sent, beside finished campaigns, on PostgreSQL.

    .venv/bin/python bench/claims.py [--sending 3000000] [--finished 5] [--finished-size 1000000]
                                     [--fractions 0,0.1,0.5,0.9,0.99] [--claims 7]
                                     [--no-before] [--admin-url URL] [--database NAME]
                                     [--keep] [--reuse]

Creates its own database on the server --admin-url names, migrates it and fills
``delivery`` with set-based SQL (INSERT ... SELECT generate_series), never through the
engine: five finished campaigns of 1,000,000 deliveries each (answered: accepted, some
failed, revoked or skipped), then one sending campaign of 3,000,000 queued deliveries
(8,000,000 rows in all). The secondary indexes are dropped for the load and built again
afterwards from their own definitions, as the migrations made them.

At each fraction sent (the sending campaign's lowest ids marked accepted, then VACUUM
ANALYZE as autovacuum would), the project's own ``Dispatcher.claim()`` (500 rows, real
clock) is timed ``--claims`` times after one untimed warm-up. The batches it takes stay
``sending`` under their lease while the next claims run, as other processes' batches in
flight would, and are marked accepted afterwards. Beside each figure: the claim
statement's ``EXPLAIN (ANALYZE, BUFFERS)`` (in a transaction rolled back), its index and
the shared buffers it touched.

Both sides in one run (unless --no-before): the claim with migration 0017's partial index
``ix_delivery_due``, and then the claim as it was before it (the index dropped; on
PostgreSQL the claim statement is the same), at the same fraction. Target (SPEC §7): the
claim at 99 % sent costs at most 1.5× the claim at 0 %.

Never run by the test suite: it takes minutes and needs a PostgreSQL server.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from bench.contract import Figure, add_arguments, write  # noqa: E402
from portal.config import normalise_database_url  # noqa: E402
from portal.db import create_engine, uuid7  # noqa: E402
from portal.delivery import partitions  # noqa: E402
from portal.migrate import upgrade  # noqa: E402

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
TARGET_RATIO = 1.5
CHUNK = 1_000_000
BATCH = 500
DUE_INDEX = "ix_delivery_due"

# Push services by share of rows, as in bench/sweeps.py.
SERVICES = (("fcm", 60), ("autopush", 15), ("apple", 17), ("wns", 6), ("other", 2))


def _psycopg(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def _url_for(admin_url: str, name: str) -> str:
    base, _, _ = _psycopg(normalise_database_url(admin_url)).rpartition("/")
    return normalise_database_url(f"{base}/{name}")


def add_database_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """--admin-url, --database (``name`` by default) and --keep, for :func:`own_database`."""
    parser.add_argument("--admin-url", default=ADMIN_URL)
    parser.add_argument("--database", default=name)
    parser.add_argument("--keep", action="store_true", help="keep the database")


@contextmanager
def own_database(args: argparse.Namespace) -> Iterator[tuple[str, sa.Engine]]:
    """The benchmark's own database, --database on the server --admin-url names, made
    afresh and migrated: its URL and an engine on it. Dropped afterwards unless --keep."""
    from bench.audience import create_database, drop_database

    admin = _psycopg(normalise_database_url(args.admin_url))
    url = _url_for(args.admin_url, args.database)
    create_database(admin, args.database)
    engine = create_engine(url)
    try:
        upgrade(engine)
        yield url, engine
    finally:
        engine.dispose()
        if not args.keep:
            drop_database(admin, args.database)


def _service_case(expression: str) -> str:
    parts, upper = [], 0
    for name, share in SERVICES:
        upper += share
        parts.append(f"WHEN {expression} < {upper} THEN '{name}'")
    return "CASE " + " ".join(parts) + " END"


# --------------------------------------------------------------------------- populate

CAMPAIGN_SQL = """
INSERT INTO campaign (id, topic_id, title, body, urgency, ttl, send_at, status, created_by,
                      created_at, launched_at, finished_at, materialised_at, is_test)
VALUES (CAST(:id AS uuid), :topic, :title, 'Five things this week', 'normal', 86400,
        now() - CAST(:age AS interval), :status, 'bench', now() - CAST(:age AS interval),
        now() - CAST(:age AS interval),
        CAST(:finished_at AS timestamptz),
        now() - CAST(:age AS interval), false)
"""

# ``i`` numbers the campaign's deliveries from 0; ``b`` a 0-999 bucket for the outcome.
DELIVERY_SQL = f"""
INSERT INTO delivery (campaign_id, subscription_id, push_service, status, attempts,
                      next_attempt_at, lease_expires_at, last_status_code, reason,
                      consent_reason, consent_event_seq, updated_at)
SELECT CAST(:campaign AS uuid),
       md5('sub-' || i)::uuid,
       {_service_case("(i * 7919) % 100")},
       CASE WHEN NOT :finished THEN 'queued'
            WHEN i % 1000 < 970 THEN 'accepted'
            WHEN i % 1000 < 985 THEN 'failed'
            WHEN i % 1000 < 995 THEN 'revoked'
            ELSE 'skipped' END,
       CASE WHEN :finished THEN 1 ELSE 0 END,
       -- A local-time campaign's deliveries for zones whose hour has not come: due later.
       CASE WHEN NOT :finished AND i % 100 < :waiting THEN now() + interval '12 hours'
            ELSE now() - CAST(:age AS interval) END,
       NULL,
       CASE WHEN NOT :finished THEN NULL
            WHEN i % 1000 < 970 THEN 201
            WHEN i % 1000 < 985 THEN 400
            WHEN i % 1000 < 995 THEN 410 END,
       CASE WHEN NOT :finished OR i % 1000 < 970 THEN NULL
            WHEN i % 1000 < 985 THEN 'rejected_400'
            WHEN i % 1000 < 995 THEN 'gone'
            ELSE 'subscription_revoked' END,
       CASE WHEN i % 3 = 0 THEN 'explicit_opt_in' ELSE 'default_by_region' END,
       NULL,
       now() - CAST(:age AS interval)
FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) AS i
"""


def every_partition(definition: str) -> str:
    """An index definition as ``pg_indexes`` gives it, to build it again. On a partitioned
    table (``delivery``, migration 0031) it reads ``ON ONLY delivery``, which would make
    the parent's index alone and leave every partition without one."""
    return definition.replace(" ON ONLY ", " ON ", 1)


def index_definition(conn: sa.Connection, name: str) -> str:
    definition = conn.execute(
        sa.text("SELECT indexdef FROM pg_indexes WHERE indexname = :n"), {"n": name}
    ).scalar_one()
    return every_partition(definition)


@dataclass
class Population:
    sending: uuid.UUID
    first_id: int  # the sending campaign's lowest delivery id
    size: int
    seconds: float
    rows: int


def populate(
    engine: sa.Engine,
    sending_size: int,
    finished: int,
    finished_size: int,
    waiting: int = 0,
    *,
    month_ids: bool = True,
    paused: int = 0,
) -> Population:
    """``waiting``: the percentage of the sending campaign's deliveries due 12 hours from
    now (spread evenly over its ids), as a local-time campaign's other zones are.
    ``paused``: a campaign of that many queued deliveries, paused, made before the sending
    one (lower ids, due an hour earlier).
    ``month_ids``: campaign ids are UUIDv7 of their creation, as the app makes them (each
    campaign's deliveries in its month's partition on PostgreSQL); otherwise random ids,
    whose deliveries the default partition holds."""
    started = time.perf_counter()
    with engine.begin() as conn:
        topic = conn.execute(
            sa.text(
                "INSERT INTO topic (slug, category, label, created_at) "
                "VALUES ('weekly-digest', 'News', 'Weekly digest', now()) RETURNING id"
            )
        ).scalar_one()
        # The secondary indexes and the unique constraint, to be built again after the
        # load exactly as the migrations defined them.
        indexes = conn.execute(
            sa.text(
                "SELECT i.indexname, i.indexdef FROM pg_indexes i "
                "WHERE i.tablename = 'delivery' AND i.indexname NOT IN "
                "(SELECT conname FROM pg_constraint WHERE conrelid = 'delivery'::regclass)"
            )
        ).all()
        unique = conn.execute(
            sa.text(
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE conrelid = 'delivery'::regclass AND contype = 'u'"
            )
        ).all()
        for name, _ in indexes:
            conn.execute(sa.text(f'DROP INDEX "{name}"'))
        for name, _ in unique:
            conn.execute(sa.text(f'ALTER TABLE delivery DROP CONSTRAINT "{name}"'))
    # Campaign ids are UUIDv7 of their creation, as the app makes them: on PostgreSQL
    # each campaign's deliveries are in its month's partition (made here if missing).
    now = dt.datetime.now(dt.UTC)

    def made(at: dt.datetime) -> uuid.UUID:
        return uuid7(at=at) if month_ids else uuid.uuid4()

    campaigns: list[tuple[uuid.UUID, str, int, str]] = [
        (
            made(now - dt.timedelta(days=(finished - n) * 7 + 7)),
            "completed",
            finished_size,
            f"{(finished - n) * 7 + 7} days",
        )
        for n in range(finished)
    ]
    if paused:
        campaigns.append((made(now - dt.timedelta(hours=2)), "paused", paused, "2 hours"))
    sending = made(now - dt.timedelta(hours=1))
    campaigns.append((sending, "sending", sending_size, "1 hour"))
    with Session(engine) as session, session.begin():
        have = set(partitions.months(session))
        finished_months = {
            partitions.Month.of(now - dt.timedelta(days=(finished - n) * 7 + 7))
            for n in range(finished)
        }
        for month in sorted((finished_months | {partitions.Month.of(now)}) - have):
            partitions.create(session, month, lock_timeout_ms=60_000)
    for number, (campaign, status, size, age) in enumerate(campaigns):
        done = status == "completed"
        with engine.begin() as conn:
            finished_at = (
                conn.execute(
                    sa.text("SELECT now() - CAST(:age AS interval) + interval '1 hour'"),
                    {"age": age},
                ).scalar_one()
                if done
                else None
            )
            conn.execute(
                sa.text(CAMPAIGN_SQL),
                {
                    "id": str(campaign),
                    "topic": topic,
                    "title": f"Campaign {number + 1}",
                    "age": age,
                    "status": status,
                    "finished_at": finished_at,
                },
            )
        for lo in range(0, size, CHUNK):
            hi = min(lo + CHUNK, size) - 1
            with engine.begin() as conn:
                # The delivery → campaign foreign key is checked per row by a trigger:
                # the campaign exists, so the load skips it.
                conn.execute(sa.text("SET LOCAL session_replication_role = replica"))
                conn.execute(
                    sa.text(DELIVERY_SQL),
                    {
                        "campaign": str(campaign),
                        "finished": done,
                        "age": age,
                        "lo": lo,
                        "hi": hi,
                        "waiting": waiting if status == "sending" else 0,
                    },
                )
            print(f"  campaign {number + 1}: {hi + 1:,} of {size:,} rows", flush=True)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("SET maintenance_work_mem = '256MB'"))
        for name, definition in unique:
            print(f"  building {name}", flush=True)
            conn.execute(sa.text(f'ALTER TABLE delivery ADD CONSTRAINT "{name}" {definition}'))
        for name, definition in indexes:
            print(f"  building {name}", flush=True)
            conn.execute(sa.text(every_partition(definition)))
        conn.execute(sa.text("VACUUM (ANALYZE) delivery"))
        conn.execute(sa.text("ANALYZE campaign"))
        first_id = conn.execute(
            sa.text("SELECT min(id) FROM delivery WHERE campaign_id = CAST(:c AS uuid)"),
            {"c": str(sending)},
        ).scalar_one()
        rows = conn.execute(sa.text("SELECT count(*) FROM delivery")).scalar_one()
    return Population(sending, first_id, sending_size, time.perf_counter() - started, rows)


# --------------------------------------------------------------------------- measure


@dataclass
class Plan:
    index: str
    buffers: int  # read to choose the rows (the Limit node)
    choice_ms: float  # the Limit node's time: finding and locking the batch
    milliseconds: float  # the whole statement, writing the 500 rows included
    text: str


@dataclass
class Point:
    side: str  # "new" or "before"
    fraction: float
    sent: int
    claims: list[float] = field(default_factory=list)
    plan: Plan | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.claims)


class Claimer:
    """The project's own claim: ``Dispatcher.claim()`` of an app on the bench database,
    with the statement it sends captured for EXPLAIN."""

    def __init__(self, url: str, instance: str) -> None:
        from portal import create_app
        from portal.delivery.engine import Dispatcher, EngineSettings
        from tests.conftest import make_settings

        self.app = create_app(make_settings(url, instance))
        self.engine: sa.Engine = self.app.extensions["portal.db"].engine
        self.dispatcher = Dispatcher(
            self.app, _NoTransport(), settings=EngineSettings(batch_size=BATCH)
        )
        self.statement: tuple[str, Any] | None = None

        @sa.event.listens_for(self.engine, "before_cursor_execute")
        def _capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
            # On PostgreSQL: WITH picked AS MATERIALIZED (...) UPDATE delivery ...
            if "UPDATE DELIVERY" in statement.upper():
                self.statement = (statement, parameters)

    def claim(self) -> tuple[float, list[int]]:
        started = time.perf_counter()
        claimed = self.dispatcher.claim()
        return time.perf_counter() - started, [c.delivery_id for c in claimed]

    def explain(self) -> Plan:
        assert self.statement is not None
        statement, parameters = self.statement
        raw = self.engine.raw_connection()
        try:
            cursor = raw.cursor()
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, parameters)
            lines = [row[0] for row in cursor.fetchall()]
            raw.rollback()  # EXPLAIN ANALYZE ran the UPDATE: nothing of it stays
        finally:
            raw.close()
        text = "\n".join(lines)
        # On a partition (migration 0031) an index of the parent's is named after the
        # partition and its columns: delivery_2026_12_next_attempt_at_id_idx.
        copies = {
            DUE_INDEX: "_next_attempt_at_id_idx",
            "ix_delivery_claim": "_campaign_id_status_next_attempt_at_idx",
            "pk_delivery": "_pkey",
        }
        index = next(
            (
                name
                for name, copy in copies.items()
                if f" {name} " in text
                or f" {name}\n" in text
                or text.endswith(name)
                or f"{copy} " in text
            ),
            "none (sequential scan)" if "Seq Scan on delivery" in text else "?",
        )
        # The shared buffers of the choice (the Limit over the locked candidates), not
        # of the whole UPDATE: writing 500 rows and their index entries costs the same
        # wherever the campaign is.
        buffers, limit, choice_ms = 0, False, 0.0
        for line in lines:
            if not limit and "->  Limit" in line and "actual time=" in line:
                choice_ms = float(line.split("actual time=")[1].split("..")[1].split()[0])
            limit = limit or "->  Limit" in line
            if limit and "Buffers: shared" in line:
                for part in line.split("Buffers: shared", 1)[1].split(","):
                    for word in part.split():
                        if "=" in word and word.split("=")[0] in ("hit", "read"):
                            buffers += int(word.split("=")[1])
                break
        milliseconds = next(
            (float(line.split(":")[1].split()[0]) for line in lines if "Execution Time" in line),
            0.0,
        )
        return Plan(index, buffers, choice_ms, milliseconds, text)


class _NoTransport:
    """The claim never sends; the dispatcher only keeps its transport."""

    def send(self, request: Any) -> Any:  # pragma: no cover - never called
        raise AssertionError("the claims bench sends nothing")

    def send_batch(self, requests: Any) -> Any:  # pragma: no cover - never called
        raise AssertionError("the claims bench sends nothing")

    def close(self) -> None:
        pass


def _admin(engine: sa.Engine) -> sa.Connection:
    return engine.connect().execution_options(isolation_level="AUTOCOMMIT")


def mark_sent(engine: sa.Engine, population: Population, fraction: float) -> int:
    """The sending campaign's lowest ids up to ``fraction`` answered (accepted)."""
    boundary = population.first_id + int(population.size * fraction)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE delivery SET status = 'accepted', attempts = attempts + 1, "
                "last_status_code = 201, lease_expires_at = NULL, updated_at = now() "
                "WHERE campaign_id = CAST(:c AS uuid) AND id < :b AND status <> 'accepted'"
            ),
            {"c": str(population.sending), "b": boundary},
        )
    with _admin(engine) as conn:
        conn.execute(sa.text("VACUUM (ANALYZE) delivery"))
        # The bulk update's dirty pages written out now: otherwise the next claims write
        # them while evicting buffers, and are charged for this bench's own UPDATE.
        conn.execute(sa.text("CHECKPOINT"))
        sent = conn.execute(
            sa.text(
                "SELECT count(*) FROM delivery WHERE campaign_id = CAST(:c AS uuid) "
                "AND status = 'accepted'"
            ),
            {"c": str(population.sending)},
        ).scalar_one()
    return int(sent)


def answer(engine: sa.Engine, ids: list[int]) -> None:
    """The claimed batches answered: accepted, as their senders would record them."""
    if not ids:
        return
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE delivery SET status = 'accepted', last_status_code = 201, "
                "lease_expires_at = NULL WHERE id = ANY(:ids)"
            ),
            {"ids": ids},
        )


@contextmanager
def the_claim_as_it_was(engine: sa.Engine, definition: str) -> Iterator[None]:
    """The schema before migration 0017: the same claim statement without the partial
    index (on PostgreSQL the claim names no index; the planner finds it)."""
    with _admin(engine) as conn:
        conn.execute(sa.text(f"DROP INDEX {DUE_INDEX}"))
    try:
        yield
    finally:
        with _admin(engine) as conn:
            conn.execute(sa.text(definition))
            conn.execute(sa.text("ANALYZE delivery"))


def measure(claimer: Claimer, side: str, fraction: float, sent: int, claims: int) -> Point:
    point = Point(side, fraction, sent)
    taken: list[int] = []
    _, ids = claimer.claim()  # warm-up, untimed: the statement compiled, the pool filled
    taken += ids
    point.plan = claimer.explain()  # the next claim's plan (rolled back)
    for _ in range(claims):
        seconds, ids = claimer.claim()
        if len(ids) != BATCH:
            raise SystemExit(f"a claim took {len(ids)} rows, not {BATCH}: too few left")
        point.claims.append(seconds)
        taken += ids
    answer(claimer.engine, taken)
    if os.environ.get("BENCH_CLAIMS_PLANS"):
        print(point.plan.text)
    print(
        f"  {side:>6} at {fraction:6.1%} sent: claim median {point.median * 1000:8.1f} ms "
        f"(min {min(point.claims) * 1000:.1f}, max {max(point.claims) * 1000:.1f}); "
        f"EXPLAIN: {point.plan.index}, {point.plan.buffers:,} buffers, choice "
        f"{point.plan.choice_ms:.1f} ms, statement {point.plan.milliseconds:.1f} ms",
        flush=True,
    )
    return point


# --------------------------------------------------------------------------- report


def _verdict(passed: bool | None) -> str:
    return {True: "pass", False: "MISS", None: ""}[passed]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def table(points: list[Point]) -> str:
    lines = [
        "| side | sent | claim median ms | min ms | max ms | EXPLAIN index | buffers (choice) "
        "| choice ms | EXPLAIN ANALYZE ms |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for p in points:
        assert p.plan is not None
        lines.append(
            f"| {'new (ix_delivery_due)' if p.side == 'new' else 'before (0016 schema)'} "
            f"| {p.fraction:.0%} ({p.sent:,}) | {p.median * 1000:.1f} "
            f"| {min(p.claims) * 1000:.1f} | {max(p.claims) * 1000:.1f} | `{p.plan.index}` "
            f"| {p.plan.buffers:,} | {p.plan.choice_ms:.1f} | {p.plan.milliseconds:.1f} |"
        )
    return "\n".join(lines)


def figures(points: list[Point]) -> list[Figure]:
    out: list[Figure] = []
    for side, name in (("new", "claim"), ("before", "claim before 0017 (no ix_delivery_due)")):
        mine = {p.fraction: p for p in points if p.side == side}
        if 0.0 not in mine:
            continue
        first = mine[0.0]
        for fraction, point in sorted(mine.items()):
            if fraction == 0.0:
                continue
            ratio = point.median / first.median
            out.append(
                Figure(
                    f"{name} of {BATCH} rows at {fraction:.0%} sent vs at 0% sent",
                    _ms(point.median),
                    "ms",
                    _ms(first.median),
                    f"{name} at 0% sent",
                    round(ratio, 2),
                    f"≤ {TARGET_RATIO}×" if side == "new" and fraction >= 0.99 else "",
                    (ratio <= TARGET_RATIO) if side == "new" and fraction >= 0.99 else None,
                )
            )
    news = {p.fraction: p for p in points if p.side == "new"}
    if 0.0 in news:
        first_plan = news[0.0].plan
        for fraction, point in sorted(news.items()):
            if fraction == 0.0 or point.plan is None or first_plan is None:
                continue
            out.append(
                Figure(
                    f"the claim's choice of {BATCH} rows (EXPLAIN ANALYZE: the Limit node, "
                    f"{point.plan.buffers:,} vs {first_plan.buffers:,} buffers) at "
                    f"{fraction:.0%} sent vs at 0%",
                    round(point.plan.choice_ms, 2),
                    "ms",
                    round(first_plan.choice_ms, 2),
                    "the choice at 0% sent",
                    round(point.plan.choice_ms / max(first_plan.choice_ms, 0.001), 2),
                )
            )
    for p in points:
        if p.side == "before" and p.fraction in news:
            out.append(
                Figure(
                    f"claim at {p.fraction:.0%} sent, new vs before",
                    _ms(news[p.fraction].median),
                    "ms",
                    _ms(p.median),
                    "the claim before 0017, same run",
                    round(news[p.fraction].median / p.median, 3),
                )
            )
    return out


# --------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sending", type=int, default=3_000_000)
    parser.add_argument("--finished", type=int, default=5)
    parser.add_argument("--finished-size", type=int, default=1_000_000)
    parser.add_argument("--fractions", default="0,0.1,0.5,0.9,0.99")
    parser.add_argument("--claims", type=int, default=7, help="timed claims per point")
    parser.add_argument(
        "--no-before", action="store_true", help="time only the new claim, not the old one"
    )
    parser.add_argument("--admin-url", default=ADMIN_URL)
    parser.add_argument("--database", default="portal_bench_claims")
    parser.add_argument(
        "--keep", action="store_true", help="keep the database and an untouched copy of it"
    )
    parser.add_argument(
        "--reuse", action="store_true", help="skip population: clone the copy --keep kept"
    )
    add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.sending = min(args.sending, 400_000)
        args.finished_size = min(args.finished_size, 20_000)
        args.claims = min(args.claims, 3)
        if args.database == "portal_bench_claims":
            args.database = "portal_bench_claims_quick"
    fractions = [float(f) for f in args.fractions.split(",")]

    admin = _psycopg(normalise_database_url(args.admin_url))
    url = _url_for(args.admin_url, args.database)
    pristine = f"{args.database}_pristine"
    load_before = os.getloadavg()
    started = time.perf_counter()
    if args.reuse:
        print(f"cloning {args.database} from {pristine}")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{args.database}" TEMPLATE "{pristine}"')
    else:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{args.database}"')
    engine = create_engine(url)
    try:
        if args.reuse:
            with engine.connect() as conn:
                sending, first_id, size, rows = conn.execute(
                    sa.text(
                        "SELECT campaign_id, min(id), count(*), "
                        "(SELECT count(*) FROM delivery) FROM delivery "
                        "WHERE status = 'queued' GROUP BY campaign_id"
                    )
                ).one()
            population = Population(sending, first_id, size, 0.0, rows)
        else:
            upgrade(engine)
            total = args.sending + args.finished * args.finished_size
            print(f"populating {args.database} with {total:,} deliveries")
            population = populate(engine, args.sending, args.finished, args.finished_size)
            print(f"  populated in {population.seconds:.0f} s")
            if args.keep:
                engine.dispose()
                with psycopg.connect(admin, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{pristine}" WITH (FORCE)')
                    conn.execute(f'CREATE DATABASE "{pristine}" TEMPLATE "{args.database}"')
        with engine.connect() as conn:
            definition = index_definition(conn, DUE_INDEX)
            postgres = conn.execute(sa.text("SHOW server_version")).scalar_one()

        points: list[Point] = []
        with tempfile.TemporaryDirectory() as instance:
            claimer = Claimer(url, instance)
            try:
                for fraction in fractions:
                    sent = mark_sent(engine, population, fraction)
                    points.append(measure(claimer, "new", fraction, sent, args.claims))
                    if not args.no_before:
                        claimer.engine.dispose()  # no plan cached with the dropped index
                        with the_claim_as_it_was(engine, definition):
                            points.append(measure(claimer, "before", fraction, sent, args.claims))
                        claimer.engine.dispose()
            finally:
                claimer.engine.dispose()
    finally:
        engine.dispose()
        if not args.keep:
            with psycopg.connect(admin, autocommit=True) as conn:
                for name in (args.database, pristine):
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    load_after = os.getloadavg()
    seconds = time.perf_counter() - started

    print()
    print(table(points))
    found = figures(points)
    for figure in found:
        print(
            f"{figure.figure}: {figure.value} {figure.unit} vs {figure.baseline} "
            f"({figure.ratio}×) {figure.target} {_verdict(figure.passed)}"
        )
    print(f"load average: {' '.join(f'{v:.2f}' for v in load_after)}")
    ends = (fractions[0], fractions[-1])
    plans = [p for p in points if p.plan is not None and p.fraction in ends]
    details = [
        f"PostgreSQL {postgres}. {population.rows:,} deliveries: {args.finished} finished "
        f"campaigns of {args.finished_size:,} (answered), then one sending campaign of "
        f"{population.size:,} (queued), made by SQL (generate_series). Campaign ids are "
        "UUIDv7 of their creation (7 to 35 days ago, and an hour ago for the sending one), "
        "so their deliveries are in their months' partitions of `delivery` (migration "
        "0031), as the app's would be. At each point the "
        "sending campaign's lowest ids are marked accepted and the table vacuumed "
        f"(VACUUM ANALYZE); then `Dispatcher.claim()` ({BATCH} rows) is timed "
        f"{args.claims} times after one untimed claim, its batches left in flight under "
        "their lease while the next claims run. *before*: migration 0017's index dropped "
        "and the claim statement as it was, at the same point of the same run. Load "
        f"average {' / '.join(f'{v:.2f}' for v in load_before)} before, "
        f"{' / '.join(f'{v:.2f}' for v in load_after)} after ({seconds:.0f} s).",
        table(points),
        "The shape: the new claim reads about one batch of index entries wherever the "
        "campaign is (the buffers and time of its choice stay flat); before, the claim "
        "walked the primary key from the first delivery of the table, reading every row "
        "already answered, of this campaign and the finished ones. The rest of a claim's "
        "time is writing the 500 rows (each non-HOT update adds an entry to every index of "
        "`delivery`), the same wherever the campaign is, but paid in I/O on a loaded disk.",
    ]
    for p in plans:
        assert p.plan is not None
        details.append(
            f"EXPLAIN (ANALYZE, BUFFERS), {p.side}, {p.fraction:.0%} sent:\n\n```\n"
            + p.plan.text
            + "\n```"
        )
    write(
        args.json,
        benchmark="claims",
        title="Claims (the engine's claim as a campaign is sent)",
        figures=found,
        details_markdown="\n\n".join(details),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
