"""Sweep and tombstone throughput on PostgreSQL while browsers keep subscribing.

    .venv/bin/python bench/sweeps.py [--subscriptions 1000000] [--admin-url URL]
                                     [--database NAME] [--keep] [--reuse]

Creates its own database on the server --admin-url names, migrates it, fills it with
set-based SQL (INSERT ... SELECT generate_series) and drops it at the end unless --keep
(with --keep it also keeps an untouched copy, NAME_pristine, which --reuse clones
instead of populating again). The age mix,
relative to now:

  70 %  fresh: seen in the last 20 days                       -> untouched
        (of which 0.1 % past the push service's expirationTime -> expired, one event each)
  20 %  quiet for 40 days                                      -> stale
   5 %  stale since 40 days ago                                -> expired, one event each
   5 %  revoked or expired 10 days ago                         -> tombstoned

A second OS process builds the app and posts /api/push/subscribe with fresh browser
subscriptions through its test client in a loop, timing every request, from a few
seconds before the jobs start until they end. The main process runs ``sweep`` and then
``tombstone`` through the service functions with the real clock; a Progress hook marks
where each batch phase starts, so the subscribe latencies are also split by phase.

Never run by the test suite: it takes minutes and needs a PostgreSQL server.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import sqlalchemy as sa  # noqa: E402

from bench.contract import Figure, add_arguments, write  # noqa: E402
from portal.config import RetentionSettings, normalise_database_url  # noqa: E402
from portal.db import create_engine  # noqa: E402
from portal.migrate import upgrade  # noqa: E402

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
TARGET_MS = 200.0
WARMUP_SECONDS = 8.0
SETTLE_SECONDS = 3.0  # the first requests compile statements and fill pools: not the baseline
CHUNK = 100_000

# Push services by share of rows: a mix like a European consumer site's.
SERVICES = (
    ("fcm", 60, "https://fcm.googleapis.com/fcm/send/"),
    ("autopush", 15, "https://updates.push.services.mozilla.com/wpush/v2/"),
    ("apple", 17, "https://web.push.apple.com/"),
    ("wns", 6, "https://wns2-by3p.notify.windows.com/w/?token="),
    ("other", 2, "https://push.example.net/"),
)


def _psycopg(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def _url_for(admin_url: str, name: str) -> str:
    base, _, _ = _psycopg(normalise_database_url(admin_url)).rpartition("/")
    return normalise_database_url(f"{base}/{name}")


# --------------------------------------------------------------------------- populate


def _case(expression: str, column: int) -> str:
    """A CASE over a 0-99 bucket picking SERVICES' column ``column``."""
    parts, upper = [], 0
    for row in SERVICES:
        upper += row[1]
        parts.append(f"WHEN {expression} < {upper} THEN '{row[column]}'")
    return "CASE " + " ".join(parts) + " END"


# ``b`` is the age bucket (i % 100), ``s`` an independent 0-99 bucket for the service,
# ``ms`` the creation time in epoch milliseconds, spread over the last year so the ids,
# time-ordered like uuid7, are in creation order as in production.
SUBSCRIPTIONS_SQL = f"""
INSERT INTO push_subscription (
    id, endpoint, endpoint_hash, push_service, p256dh, auth_sealed, auth_key_version,
    expiration_time, subscriber_id, user_agent, locale, origin, state,
    created_at, last_seen_at, last_success_at, stale_at, ended_at, revoked_at, end_reason
)
SELECT
    (lpad(to_hex(ms), 12, '0') || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid,
    endpoint,
    sha256(convert_to(endpoint, 'UTF8')),
    service,
    translate(encode('\\x04'::bytea || sha256(('x-' || i)::bytea)
                     || sha256(('y-' || i)::bytea), 'base64'), E'+/=\\n', '-_'),
    sha256(('auth-' || i)::bytea) || substring(sha256(('iv-' || i)::bytea) FROM 1 FOR 12),
    1,
    CASE WHEN i % 1000 = 999 THEN now() - interval '1 day' END,
    md5('subscriber-' || (i % CAST(:subscribers AS bigint)))::uuid,
    'Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 Chrome/131.0 Safari/537.36',
    'en-GB',
    'https://portal.example.test',
    (CASE
        WHEN b < 5 THEN 'stale'
        WHEN b < 8 THEN 'revoked'
        WHEN b < 10 THEN 'expired'
        WHEN b % 3 = 0 THEN 'pending'
        ELSE 'active'
     END)::push_subscription_state,
    to_timestamp(ms / 1000.0),
    CASE
        WHEN b < 5 THEN now() - interval '80 days'
        WHEN b < 10 THEN now() - interval '20 days'
        WHEN b < 30 THEN now() - interval '40 days'
        ELSE now() - (b - 30) * interval '7 hours'
    END,
    CASE
        WHEN b >= 10 AND b < 30 AND b % 3 <> 0 THEN now() - interval '41 days'
        WHEN b >= 30 AND b % 3 <> 0 THEN now() - interval '2 days'
    END,
    CASE WHEN b < 5 THEN now() - interval '40 days' END,
    CASE WHEN b BETWEEN 5 AND 9 THEN now() - interval '10 days' END,
    CASE WHEN b BETWEEN 5 AND 7 THEN now() - interval '10 days' END,
    CASE WHEN b BETWEEN 5 AND 7 THEN 'unsubscribed' WHEN b IN (8, 9) THEN 'expired' END
FROM (
    SELECT i, i % 100 AS b, h, service, url || 'sweep-' || i || '-' || h AS endpoint,
           (extract(epoch FROM now() - interval '365 days') * 1000)::bigint
               + (i * 31536000000 / CAST(:total AS bigint)) AS ms
    FROM (
        SELECT i, md5('sweep-' || i) AS h, get_byte(sha256(('svc-' || i)::bytea), 0) % 100 AS s
        FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) AS i
    ) AS g,
    LATERAL (SELECT {_case("s", 0)} AS service, {_case("s", 2)} AS url) AS pick
) AS rows
"""

SUBSCRIBERS_SQL = """
INSERT INTO subscriber (id, locale, created_at)
SELECT md5('subscriber-' || i)::uuid, 'en-GB', now() - interval '365 days'
FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) AS i
"""


def _chunks(total: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + CHUNK, total) - 1) for lo in range(0, total, CHUNK)]


def populate(engine: sa.Engine, total: int) -> float:
    started = time.perf_counter()
    subscribers = max(1, total * 4 // 5)  # some people have two browsers
    for label, sql, count, extra in (
        ("subscribers", SUBSCRIBERS_SQL, subscribers, {}),
        ("subscriptions", SUBSCRIPTIONS_SQL, total, {"subscribers": subscribers, "total": total}),
    ):
        done = 0
        for lo, hi in _chunks(count):
            # One transaction per chunk: progress is real, and WAL stays bounded.
            with engine.begin() as conn:
                conn.execute(sa.text(sql), {"lo": lo, "hi": hi, **extra})
            done = hi + 1
            elapsed = time.perf_counter() - started
            print(f"\r  {label}: {done:>9,} / {count:,}  ({elapsed:5.0f} s)", end="", flush=True)
        print()
    # VACUUM cannot run in a transaction; the visibility map it sets is what a
    # long-running production table would have.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        print("  VACUUM ANALYZE ...", flush=True)
        conn.execute(sa.text("VACUUM ANALYZE subscriber"))
        conn.execute(sa.text("VACUUM ANALYZE push_subscription"))
    return time.perf_counter() - started


# --------------------------------------------------------------------------- subscriber


Sample = tuple[float, float, float]  # (wall-clock start, request seconds, chain-lock wait)


def subscriber_loop(url: str, stop: Any, ready: Any, results: Any) -> None:
    """Runs in its own process: subscribe, time it, repeat until ``stop`` is set."""
    from portal import create_app
    from tests.conftest import make_settings
    from tests.factories import SubscriptionFactory

    with tempfile.TemporaryDirectory() as instance:
        app = create_app(make_settings(url, instance))
        app.config["TESTING"] = True
        engine = app.extensions["portal.db"].engine
        # The wait for the consent-chain lock, apart from the request as a whole: on a
        # busy machine the request's time also holds CPU and I/O queueing.
        lock_wait = [0.0]

        @sa.event.listens_for(engine, "before_cursor_execute")
        def _before(conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            conn.info["bench_started"] = time.perf_counter()

        @sa.event.listens_for(engine, "after_cursor_execute")
        def _after(conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            if "pg_advisory_xact_lock" in statement:
                lock_wait[0] += time.perf_counter() - conn.info["bench_started"]

        client = app.test_client()
        factory = SubscriptionFactory()
        samples: list[Sample] = []
        failures = 0
        ready.set()
        while not stop.is_set():
            body = {"subscription": factory().to_json()}
            lock_wait[0] = 0.0
            wall, started = time.time(), time.perf_counter()
            response = client.post("/api/push/subscribe", json=body)
            elapsed = time.perf_counter() - started
            if response.status_code == 201:
                samples.append((wall, elapsed, lock_wait[0]))
            else:
                failures += 1
        engine.dispose()
    results.put({"samples": samples, "failures": failures})


# --------------------------------------------------------------------------- the jobs


@dataclass
class Phase:
    name: str
    started: float = 0.0  # wall clock
    ended: float = 0.0
    candidates: int = 0
    looked_at: int = 0
    changed: int = 0

    @property
    def seconds(self) -> float:
        return self.ended - self.started


@dataclass
class PhaseClock:
    """A Progress that marks where each batch phase starts and ends (``_batches`` calls
    start() once per phase, then advance() per batch)."""

    names: list[str]
    phases: list[Phase] = field(default_factory=list)

    def start(self, total: int) -> None:
        now = time.time()
        if self.phases:
            self.phases[-1].ended = now
        self.phases.append(Phase(self.names[len(self.phases)], started=now, candidates=total))

    def advance(self, count: int) -> None:
        self.phases[-1].looked_at += count

    def finish(self) -> None:
        self.phases[-1].ended = time.time()


def _count(engine: sa.Engine, sql: str, **params: Any) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar_one()


def run_jobs(url: str, retention: RetentionSettings, event_batch: int | None) -> list[Phase]:
    from portal import create_app
    from portal.retention import services
    from portal.retention.services import sweep, tombstone
    from tests.conftest import make_settings

    if event_batch is not None:
        services.EVENT_BATCH_SIZE = event_batch  # type: ignore[attr-defined]
    print(f"  expire batches of {getattr(services, 'EVENT_BATCH_SIZE', retention.batch_size)}")

    with tempfile.TemporaryDirectory() as instance:
        app = create_app(make_settings(url, instance))
        engine = app.extensions["portal.db"].engine
        phases: list[Phase] = []

        now = dt.datetime.now(dt.UTC)
        events_before = _count(engine, "SELECT count(*) FROM consent_event WHERE kind='expired'")
        clock = PhaseClock(["sweep: -> stale", "sweep: -> expired"])
        started = time.perf_counter()
        report = sweep(app, now=now, retention=retention, progress=clock)
        report.seconds = time.perf_counter() - started
        clock.finish()
        expired = _count(
            engine, "SELECT count(*) FROM push_subscription WHERE ended_at = :now", now=now
        )
        events = (
            _count(engine, "SELECT count(*) FROM consent_event WHERE kind='expired'")
            - events_before
        )
        stale, overdue = clock.phases
        stale.changed, overdue.changed = report.changed - expired, expired
        print(f"  {report.summary()} ({events:,} expired events)")
        phases += clock.phases

        now = dt.datetime.now(dt.UTC)
        clock = PhaseClock(["tombstone"])
        started = time.perf_counter()
        report = tombstone(app, now=now, retention=retention, progress=clock)
        report.seconds = time.perf_counter() - started
        clock.finish()
        clock.phases[0].changed = report.changed
        print(f"  {report.summary()}")
        phases += clock.phases
        engine.dispose()
    return phases


# --------------------------------------------------------------------------- report


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _latency(samples: list[Sample]) -> str:
    ms = [s[1] * 1000 for s in samples]
    lock = [s[2] * 1000 for s in samples]
    if not ms:
        return "| 0 | – | – | – | – | – |"
    return (
        f"| {len(ms):,} | {statistics.median(ms):.1f} | {_pct(ms, 0.99):.1f} | {max(ms):.1f} "
        f"| {_pct(lock, 0.99):.1f} | {max(lock):.1f} |"
    )


def table(phases: list[Phase], samples: list[Sample], warm_start: float) -> str:
    lines = [
        "| phase | candidates | rows looked at | rows changed | seconds | looked at/s "
        "| changed/s | subscribes | p50 ms | p99 ms | max ms | lock wait p99 ms "
        "| lock wait max ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    first = phases[0].started
    baseline = [s for s in samples if warm_start <= s[0] < first]
    lines.append("| idle (before the jobs) | | | | | | | " + _latency(baseline)[2:])
    for p in phases:
        during = [s for s in samples if p.started <= s[0] < p.ended]
        secs = max(p.seconds, 1e-9)
        lines.append(
            f"| {p.name} | {p.candidates:,} | {p.looked_at:,} | {p.changed:,} | {p.seconds:.1f} "
            f"| {p.looked_at / secs:,.0f} | {p.changed / secs:,.0f} " + _latency(during)
        )
    jobs = [s for s in samples if first <= s[0] < phases[-1].ended]
    lines.append("| **all jobs** | | | | | | | " + _latency(jobs)[2:])
    return "\n".join(lines)


def figures(phases: list[Phase], samples: list[Sample], warm_start: float) -> list[Figure]:
    first = phases[0].started
    idle = [s[1] for s in samples if warm_start <= s[0] < first]
    during = [s for s in samples if first <= s[0] < phases[-1].ended]
    p99 = _pct([s[1] for s in during], 0.99)
    idle_p99 = _pct(idle, 0.99) if idle else None
    worst = max((s[1] for s in during), default=0.0)
    lock = max((s[2] for s in during), default=0.0)
    limit = TARGET_MS / 1000
    return [
        Figure(
            "longest chain-lock wait of a subscribe during the jobs",
            round(lock, 4),
            "s",
            target=f"< {limit:g} s",
            passed=lock < limit,
        ),
        Figure(
            "longest subscribe during the jobs",
            round(worst, 4),
            "s",
            target=f"< {limit:g} s",
            passed=worst < limit,
        ),
        Figure(
            "subscribe p99 during the jobs",
            round(p99, 4),
            "s",
            None if idle_p99 is None else round(idle_p99, 4),
            "subscribe p99 with no job running",
            None if not idle_p99 else round(p99 / idle_p99, 2),
        ),
    ]


# --------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscriptions", type=int, default=1_000_000)
    parser.add_argument("--admin-url", default=ADMIN_URL)
    parser.add_argument("--database", default="portal_bench_sweeps")
    parser.add_argument(
        "--event-batch-size", type=int, help="override EVENT_BATCH_SIZE (the expire phase)"
    )
    parser.add_argument("--raw", help="write the phases and every subscribe's timings as JSON")
    parser.add_argument("--batch-size", type=int, default=RetentionSettings.batch_size)
    parser.add_argument(
        "--keep", action="store_true", help="keep the database and an untouched copy of it"
    )
    parser.add_argument(
        "--reuse", action="store_true", help="skip population: clone the copy --keep kept"
    )
    add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.subscriptions = min(args.subscriptions, 20_000)
        if args.database == "portal_bench_sweeps":
            args.database = "portal_bench_sweeps_quick"  # never the copy --keep kept

    admin = _psycopg(normalise_database_url(args.admin_url))
    url = _url_for(args.admin_url, args.database)
    pristine = f"{args.database}_pristine"
    if args.reuse:
        # The jobs change the rows they run over, so a kept database is cloned from its
        # untouched copy: every run starts from the same ages.
        print(f"cloning {args.database} from {pristine}")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{args.database}" TEMPLATE "{pristine}"')
    else:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{args.database}"')
        engine = create_engine(url)
        upgrade(engine)
        print(f"populating {args.database} with {args.subscriptions:,} subscriptions")
        seconds = populate(engine, args.subscriptions)
        print(f"  populated in {seconds:.0f} s")
        engine.dispose()
        if args.keep:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{pristine}" WITH (FORCE)')
                conn.execute(f'CREATE DATABASE "{pristine}" TEMPLATE "{args.database}"')

    retention = RetentionSettings(batch_size=args.batch_size)
    ctx = mp.get_context("spawn")  # a clean interpreter: no engine or socket inherited
    stop, ready, results = ctx.Event(), ctx.Event(), ctx.Queue()
    child = ctx.Process(target=subscriber_loop, args=(url, stop, ready, results))
    child.start()
    try:
        ready.wait(120)
        warm_start = time.time() + SETTLE_SECONDS
        time.sleep(WARMUP_SECONDS)
        print(f"running sweep and tombstone (batch size {retention.batch_size})")
        phases = run_jobs(url, retention, args.event_batch_size)
    finally:
        stop.set()
        outcome = results.get(timeout=120)
        child.join(60)
    samples = outcome["samples"]
    if args.raw:
        # Every figure the table is built from, so it can be rebuilt or split differently.
        Path(args.raw).write_text(
            json.dumps(
                {
                    "warm_start": warm_start,
                    "phases": [dataclasses.asdict(p) for p in phases],
                    "samples": samples,
                }
            )
        )
    print()
    print(table(phases, samples, warm_start))
    print()
    during = [s for s in samples if s[0] >= phases[0].started]
    for label, worst in (
        ("longest subscribe during the jobs", max((s[1] for s in during), default=0.0)),
        ("longest chain-lock wait in one", max((s[2] for s in during), default=0.0)),
    ):
        verdict = "within" if worst * 1000 < TARGET_MS else "OVER"
        print(f"{label}: {worst * 1000:.0f} ms ({verdict} {TARGET_MS:.0f} ms)")
    if outcome["failures"]:
        print(f"subscribe failures (not 201): {outcome['failures']}")
    print(f"load average: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    write(
        args.json,
        benchmark="sweeps",
        title="Sweeps",
        figures=figures(phases, samples, warm_start),
        details_markdown="\n\n".join(
            [
                f"{args.subscriptions:,} subscriptions; sweep then tombstone (batch size "
                f"{retention.batch_size}) while a second process keeps subscribing. Target: a "
                f"subscribe waits < {TARGET_MS:.0f} ms.",
                table(phases, samples, warm_start),
                f"Subscribe failures (not 201): {outcome['failures'] or 'none'}.",
            ]
        ),
    )

    if not args.keep:
        with psycopg.connect(admin, autocommit=True) as conn:
            for name in (args.database, pristine):
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    sys.exit(main())
