"""Audience benchmark (SPEC §6): one topic's recipients among N subscribers in PostgreSQL.

Compares streaming ``portal.consent.recipients.recipients()`` through a real SQLAlchemy
session with the same SQL run directly by psql, in one run on one machine, so the ratio
holds even when absolute times drift. Run by hand, never by the test suite:

    .venv/bin/python bench/audience.py                     # 1,000,000 subscribers
    .venv/bin/python bench/audience.py --subscribers 100000 --reuse

It creates its own database on the server, migrates it with the project's migrations,
fills it with set-based SQL, measures, and drops it (unless --keep or --reuse).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.contract import Figure, add_arguments, first_row, write
from portal.config import normalise_database_url
from portal.consent.recipients import recipient_query, recipients
from portal.db import create_engine
from portal.migrate import upgrade

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_DATABASE = "portal_bench_audience"
TARGET_RATIO = 2.0
# Unaligned, tuples only, output discarded: psql still receives and formats every row.
PSQL = ("psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-o", "/dev/null")
CHUNK = 100_000
FLAT_SLACK_KB = 8 * 1024

# The catalogue: (slug, category, transactional, default, retired,
#                 share of subscribers with an explicit opt_in, opt_out, unset).
# Most people never touch most topics; explicit decisions are a minority.
TOPICS = [
    ("security-alerts", "Your account", True, "opt_in", False, 0.010, 0.030, 0.005),
    ("order-updates", "Your account", True, "opt_in", False, 0.010, 0.050, 0.005),
    ("account-tips", "Your account", True, "opt_out", False, 0.040, 0.020, 0.0),
    ("weekly-digest", "News", False, "opt_in", False, 0.080, 0.070, 0.010),
    ("offers", "Offers", False, "opt_out", False, 0.110, 0.050, 0.010),
    ("new-arrivals", "Offers", False, "opt_out", False, 0.060, 0.030, 0.0),
    ("back-in-stock", "Offers", False, "opt_out", False, 0.030, 0.010, 0.0),
    ("summer-sale-2025", "Offers", False, "opt_out", True, 0.090, 0.020, 0.0),
]
# A marketing opt_out-default topic (opt-ins only, ~N/10) and a transactional
# opt_in-default one (nearly everyone): two audience sizes for the memory check.
MEASURED = ("offers", "security-alerts")

# Deterministic helpers kept in a schema of their own in the throwaway database, so the
# data is the same from run to run and the portal's schema is untouched.
HELPERS = """
CREATE SCHEMA IF NOT EXISTS bench;
-- A uniform number in [0, 1) from (salt, i): repeatable, unlike random().
CREATE OR REPLACE FUNCTION bench.u(salt bigint, i bigint) RETURNS float8
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN (hashint8extended(i, salt) & 4294967295)::float8 / 4294967296.0;
-- A version 7 UUID as the portal makes them (time-ordered), from a millisecond
-- timestamp and a repeatable random part.
CREATE OR REPLACE FUNCTION bench.uuid7(ms bigint, salt text, i bigint) RETURNS uuid
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN (lpad(to_hex(ms), 12, '0') || '7' || substr(md5(salt || i), 1, 3) || '8'
            || substr(md5(salt || i), 4, 15))::uuid;
-- Subscriber i joined at an even pace over three years.
CREATE OR REPLACE FUNCTION bench.joined(i bigint, n bigint) RETURNS timestamptz
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN timestamptz '2023-01-01 00:00:00+00' + (i * (interval '3 years' / n));
CREATE OR REPLACE FUNCTION bench.ms(t timestamptz) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN (extract(epoch FROM t) * 1000)::bigint;
-- base64url of n bytes, as browsers encode keys (no padding).
CREATE OR REPLACE FUNCTION bench.b64url(b bytea) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN translate(rtrim(replace(encode(b, 'base64'), E'\\n', ''), '='), '+/', '-_');
"""

SUBSCRIBERS = """
INSERT INTO subscriber (id, external_user_id, region_code, locale, created_at, erased_at)
SELECT bench.uuid7(bench.ms(bench.joined(i, :n)), 's', i),
       CASE WHEN bench.u(1, i) < 0.30 THEN 'user-' || i END,
       CASE WHEN r < 0.35 THEN 'EU' WHEN r < 0.70 THEN 'US' WHEN r < 0.80 THEN 'UK'
            WHEN r < 0.85 THEN 'CA'
            WHEN r < 0.95 THEN (ARRAY['AU', 'BR', 'JP', 'IN', 'MX'])[1 + i % 5]
       END,
       CASE WHEN r < 0.35 THEN 'de-DE' WHEN r < 0.70 THEN 'en-US' WHEN r < 0.80 THEN 'en-GB'
            WHEN r < 0.85 THEN 'fr-CA' END,
       bench.joined(i, :n),
       CASE WHEN bench.u(2, i) < 0.003 THEN bench.joined(i, :n) + interval '90 days' END
FROM (SELECT i, bench.u(0, i) AS r
      FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) AS i) AS g
"""

# One current subscription per subscriber, ~90% of them live. The state mix: active,
# pending, stale, revoked (row kept), expired, and tombstones (unsubscribed or erased:
# deleted_at set, credentials emptied, hash kept). Push services weighted like real
# traffic: Chrome/Edge-on-Android on FCM, Safari on Apple, Firefox on autopush, some WNS.
# grant_event_seq has no foreign key (checked below), so it holds a synthetic number.
SUBSCRIPTIONS = """
INSERT INTO push_subscription (
    id, endpoint, endpoint_hash, push_service, p256dh, auth_sealed, auth_key_version,
    expiration_time, subscriber_id, user_agent, locale, origin, state, created_at,
    last_seen_at, last_success_at, last_failure_at, last_status_code, consecutive_failures,
    revoked_at, end_reason, grant_event_seq, deleted_at)
SELECT bench.uuid7(bench.ms(joined) + 1, 'p', i),
       CASE WHEN NOT tomb THEN endpoint END,
       sha256(convert_to(endpoint, 'UTF8')),
       service,
       CASE WHEN NOT tomb THEN bench.b64url('\\x04'::bytea || sha256(convert_to('x' || i, 'UTF8'))
                                            || sha256(convert_to('y' || i, 'UTF8'))) END,
       CASE WHEN NOT tomb THEN substring(sha256(convert_to('a' || i, 'UTF8'))
                                         || sha256(convert_to('b' || i, 'UTF8')) FROM 1 FOR 44)
       END,
       1,
       NULL,
       sid,
       CASE service WHEN 'fcm' THEN 'Chrome 131 / Android' WHEN 'apple' THEN 'Safari 18 / iOS'
                    WHEN 'autopush' THEN 'Firefox 133 / Windows' ELSE 'Edge 131 / Windows'
       END,
       locale,
       'https://shop.example.com',
       state::push_subscription_state,
       joined,
       joined + (bench.u(6, i) * (timestamptz '2026-01-01+00' - joined)),
       CASE WHEN state IN ('active', 'stale') THEN joined + interval '1 day' END,
       CASE WHEN state = 'stale' THEN joined + interval '2 days' END,
       CASE WHEN state = 'stale' THEN 404 END,
       CASE WHEN state = 'stale' THEN 3 ELSE 0 END,
       CASE WHEN state = 'revoked' THEN joined + interval '30 days' END,
       CASE WHEN erased THEN 'erased' WHEN tomb THEN 'unsubscribed'
            WHEN state = 'revoked' THEN 'revoked_by_push_service'
            WHEN state = 'expired' THEN 'expired' END,
       i,
       CASE WHEN tomb THEN joined + interval '60 days' END
FROM (
    SELECT i, joined, sid, locale, erased, service, tomb,
           CASE WHEN tomb OR r >= 0.94 AND r < 0.955 THEN 'revoked'
                WHEN r < 0.87 THEN 'active' WHEN r < 0.90 THEN 'pending'
                WHEN r < 0.94 THEN 'stale' ELSE 'expired' END AS state,
           CASE service
               WHEN 'fcm' THEN 'https://fcm.googleapis.com/fcm/send/'
               WHEN 'apple' THEN 'https://web.push.apple.com/'
               WHEN 'autopush' THEN 'https://updates.push.services.mozilla.com/wpush/v2/'
               ELSE 'https://wns2-par02p.notify.windows.com/w/?token='
           END || md5('e' || i) || md5('f' || i) || md5('g' || i) AS endpoint
    FROM (
        SELECT i, joined, s.id AS sid, s.locale, s.erased_at IS NOT NULL AS erased,
               bench.u(3, i) AS r,
               s.erased_at IS NOT NULL OR bench.u(3, i) >= 0.97 AS tomb,
               CASE WHEN bench.u(4, i) < 0.62 THEN 'fcm' WHEN bench.u(4, i) < 0.82 THEN 'apple'
                    WHEN bench.u(4, i) < 0.94 THEN 'autopush' ELSE 'wns' END AS service
        FROM (SELECT i, bench.joined(i, :n) AS joined
              FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) AS i) AS g
        JOIN subscriber AS s ON s.id = bench.uuid7(bench.ms(g.joined), 's', g.i)
    ) AS a
) AS b
"""

# 5% of subscribers also left a tombstone behind when their endpoint rotated.
ROTATED = """
INSERT INTO push_subscription (
    id, endpoint_hash, push_service, auth_key_version, subscriber_id, origin, state,
    created_at, last_seen_at, end_reason, deleted_at)
SELECT bench.uuid7(bench.ms(joined), 'r', i),
       sha256(convert_to('https://fcm.googleapis.com/fcm/send/old-' || md5('r' || i), 'UTF8')),
       'fcm', 1, bench.uuid7(bench.ms(joined), 's', i), 'https://shop.example.com',
       'revoked', joined, joined, 'rotated', joined
FROM (SELECT i, bench.joined(i, :n) AS joined
      FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) AS i) AS g
WHERE bench.u(5, i) < 0.05
"""

# One statement per topic. Explicit decisions only for subscribers not erased (erasure
# removes them). event_seq has no foreign key to consent_event (checked below), so it
# holds a synthetic, unique number pointing at no event: the consent log is hash-chained
# and append-only, and the recipient query never reads it, so its validity is irrelevant
# to this benchmark and consent_event stays empty.
PREFERENCES = """
INSERT INTO topic_preference (subscriber_id, topic_id, state, source, policy_version,
                              decided_at, recorded_at, event_seq)
SELECT bench.uuid7(bench.ms(bench.joined(i, :n)), 's', i), :topic_id,
       CASE WHEN r < :p_in THEN 'opt_in' WHEN r < :p_in + :p_out THEN 'opt_out'
            ELSE 'unset' END,
       CASE WHEN i % 4 = 0 THEN 'subscribe-page' ELSE 'preference-centre' END,
       'v1',
       bench.joined(i, :n) + interval '1 hour',
       bench.joined(i, :n) + interval '1 hour',
       :seq_base + i
FROM (SELECT i, bench.u(100 + :topic_id, i) AS r
      FROM generate_series(1, CAST(:n AS bigint)) AS i) AS g
WHERE r < :p_in + :p_out + :p_unset AND bench.u(2, i) >= 0.003
"""


@dataclass
class Measure:
    topic: str
    rows: int
    project_s: list[float] = field(default_factory=list)
    project_cpu_s: list[float] = field(default_factory=list)
    psql_s: list[float] = field(default_factory=list)
    rss_before_kb: list[int] = field(default_factory=list)
    rss_peak_kb: list[int] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return statistics.median(self.project_s) / statistics.median(self.psql_s)

    @property
    def growth_kb(self) -> int:
        return max(self.rss_peak_kb) - min(self.rss_before_kb)


def database_urls(admin_url: str, name: str) -> tuple[str, str]:
    """(libpq URL for psql and psycopg, SQLAlchemy URL for the portal) of database ``name``."""
    url: URL = make_url(admin_url).set(database=name)
    plain = url.set(drivername="postgresql").render_as_string(hide_password=False)
    return plain, normalise_database_url(plain)


def _admin(admin_url: str) -> psycopg.Connection:
    return psycopg.connect(admin_url, autocommit=True)


def database_exists(admin_url: str, name: str) -> bool:
    with _admin(admin_url) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    return found is not None


def populated_with(pg_url: str) -> int | None:
    """The subscriber count recorded when population finished, or None."""
    with psycopg.connect(pg_url) as conn:
        row = conn.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database "
            "WHERE datname = current_database()"
        ).fetchone()
    comment = row[0] if row else None
    if comment and comment.startswith("bench-audience subscribers="):
        return int(comment.rpartition("=")[2])
    return None


def drop_database(admin_url: str, name: str) -> None:
    with _admin(admin_url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def create_database(admin_url: str, name: str) -> None:
    drop_database(admin_url, name)
    with _admin(admin_url) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')


def _progress(label: str, done: int, total: int, started: float) -> None:
    elapsed = time.perf_counter() - started
    rate = done / elapsed if elapsed else 0.0
    eta = (total - done) / rate if rate else 0.0
    # Redraw one line on a terminal; one line per step in a log.
    end = "" if sys.stdout.isatty() else "\n"
    start = "\r" if sys.stdout.isatty() else ""
    print(
        f"{start}  {label:<14} {done:>10,} / {total:,}  {rate:>9,.0f} /s  eta {eta:5.0f}s",
        end=end,
        flush=True,
    )


def _chunked(conn: sa.Connection, label: str, sql: str, n: int) -> None:
    started = time.perf_counter()
    for lo in range(1, n + 1, CHUNK):
        hi = min(lo + CHUNK - 1, n)
        conn.execute(sa.text(sql), {"n": n, "lo": lo, "hi": hi})
        conn.commit()
        _progress(label, hi, n, started)
    print(f"  done in {time.perf_counter() - started:.1f}s")


def check_no_event_fk(conn: sa.Connection) -> None:
    """Synthetic event numbers (topic_preference.event_seq, push_subscription.grant_event_seq)
    are only acceptable while no foreign key makes them point at a real consent_event."""
    found = conn.execute(
        sa.text(
            "SELECT conname FROM pg_constraint WHERE contype = 'f' "
            "AND confrelid = 'consent_event'::regclass"
        )
    ).all()
    if found:
        raise SystemExit(
            f"consent_event is now referenced by {[r[0] for r in found]}: "
            "insert matching consent_event rows instead of synthetic event numbers"
        )


def populate(sa_url: str, n: int) -> None:
    engine = create_engine(sa_url, poolclass=sa.pool.NullPool)
    started = time.perf_counter()
    print("migrating ...", flush=True)
    upgrade(engine)
    with engine.connect() as conn:
        check_no_event_fk(conn)
        # A throwaway database: losing the tail of it in a crash costs nothing.
        conn.execute(sa.text("SET synchronous_commit = off"))
        conn.execute(sa.text(HELPERS))
        conn.execute(
            sa.text(
                "INSERT INTO policy_version (version, published_at, text, text_sha256) "
                "VALUES ('v1', '2023-01-01+00', 'We send what you choose.', "
                "encode(sha256('We send what you choose.'), 'hex'))"
            )
        )
        for position, (slug, category, tx, default, retired, *_) in enumerate(TOPICS):
            conn.execute(
                sa.text(
                    "INSERT INTO topic (slug, category, label, description, is_transactional, "
                    "default_state, position, created_at, retired_at) VALUES (:slug, :cat, "
                    ":label, :desc, :tx, :default, :pos, '2023-01-01+00', "
                    "CASE WHEN :retired THEN timestamptz '2025-09-01+00' END)"
                ),
                {
                    "slug": slug,
                    "cat": category,
                    "label": slug.replace("-", " ").capitalize(),
                    "desc": f"About {slug}.",
                    "tx": tx,
                    "default": default,
                    "pos": position,
                    "retired": retired,
                },
            )
        conn.commit()
        print(f"populating {n:,} subscribers (chunks of {CHUNK:,}):", flush=True)
        _chunked(conn, "subscriber", SUBSCRIBERS, n)
        _chunked(conn, "subscription", SUBSCRIPTIONS, n)
        _chunked(conn, "rotated", ROTATED, n)
        ids: dict[str, int] = dict(conn.execute(sa.text("SELECT slug, id FROM topic")).all())
        pref_started = time.perf_counter()
        for k, (slug, _, _, _, _, p_in, p_out, p_unset) in enumerate(TOPICS, start=1):
            conn.execute(
                sa.text(PREFERENCES),
                {
                    "n": n,
                    "topic_id": ids[slug],
                    "p_in": p_in,
                    "p_out": p_out,
                    "p_unset": p_unset,
                    "seq_base": k * 10 * n,
                },
            )
            conn.commit()
            _progress("preferences", k, len(TOPICS), pref_started)
        print(f"  done in {time.perf_counter() - pref_started:.1f}s")
        print("VACUUM ANALYZE ...", flush=True)
        # VACUUM as well as ANALYZE: it sets hint bits and the visibility map, which
        # autovacuum would have done on a real database, so the first timed run does not
        # pay for writing them.
        conn.commit()
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(sa.text("VACUUM ANALYZE"))
        conn.execute(
            sa.text(
                f'COMMENT ON DATABASE "{conn.engine.url.database}" IS '
                f"'bench-audience subscribers={n}'"
            )
        )
    engine.dispose()
    print(f"populated in {time.perf_counter() - started:.0f}s")


def describe(pg_url: str) -> None:
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT relname, n_live_tup, pg_size_pretty(pg_total_relation_size(relid)) "
            "FROM pg_stat_user_tables WHERE schemaname = 'public' ORDER BY relname"
        ).fetchall()
    for name, count, size in rows:
        print(f"  {name:<20} {count:>12,} rows  {size:>10}")


def compiled_sql(topic_id: int) -> str:
    return str(
        recipient_query(topic_id).compile(
            dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}
        )
    )


def _proc_status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child(sa_url: str, topic_id: int) -> None:
    """Stream one topic's recipients and report rows, seconds and memory as JSON."""
    engine = create_engine(sa_url)
    rss_before = _proc_status_kb("VmRSS")
    cpu_before = _cpu_s()
    started = time.perf_counter()
    rows = 0
    with Session(engine) as session:
        for _recipient in recipients(session, topic_id):
            rows += 1
    elapsed = time.perf_counter() - started
    cpu = _cpu_s() - cpu_before
    engine.dispose()
    print(
        json.dumps(
            {
                "rows": rows,
                "seconds": elapsed,
                "cpu_seconds": cpu,
                "rss_before_kb": rss_before,
                # The high-water mark of this process alone: the whole streaming run.
                "rss_peak_kb": _proc_status_kb("VmHWM"),
            }
        )
    )


def run_project(sa_url: str, topic_id: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(topic_id), "--db-url", sa_url],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_psql(pg_url: str, sql: str) -> float:
    """Wall seconds of the whole psql process."""
    started = time.perf_counter()
    subprocess.run([*PSQL, "-d", pg_url, "-c", sql], check=True)
    return time.perf_counter() - started


def measure(pg_url: str, sa_url: str, slugs: list[str], repeats: int) -> list[Measure]:
    with psycopg.connect(pg_url) as conn:
        ids: dict[str, int] = dict(conn.execute("SELECT slug, id FROM topic").fetchall())
        results = []
        for slug in slugs:
            # Also warms the cache, so no side is timed against a cold one.
            count = conn.execute(f"SELECT count(*) FROM ({compiled_sql(ids[slug])}) AS q")
            results.append(Measure(slug, first_row(count)[0]))
    for rep in range(1, repeats + 1):
        # Interleaved, so a slow patch of the machine hits both sides alike.
        for m in results:
            project = run_project(sa_url, ids[m.topic])
            if project["rows"] != m.rows:
                raise SystemExit(f"{m.topic}: project gave {project['rows']} rows, not {m.rows}")
            m.project_s.append(project["seconds"])
            m.project_cpu_s.append(project["cpu_seconds"])
            m.rss_before_kb.append(project["rss_before_kb"])
            m.rss_peak_kb.append(project["rss_peak_kb"])
            m.psql_s.append(run_psql(pg_url, compiled_sql(ids[m.topic])))
            print(
                f"  run {rep}/{repeats} {m.topic:<16} {m.rows:>9,} rows  "
                f"project {m.project_s[-1]:6.3f}s (cpu {m.project_cpu_s[-1]:5.2f}s, "
                f"peak RSS {m.rss_peak_kb[-1] / 1024:5.1f} MiB)  "
                f"psql {m.psql_s[-1]:6.3f}s  "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    return results


def table(results: list[Measure]) -> str:
    lines = [
        "| topic | rows | project s | psql s | ratio | target | result "
        "| project CPU s | RSS before MiB | peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for m in results:
        lines.append(
            f"| {m.topic} | {m.rows:,} | {statistics.median(m.project_s):.3f} "
            f"| {statistics.median(m.psql_s):.3f} | {m.ratio:.2f}× | ≤ {TARGET_RATIO:.1f}× "
            f"| {'pass' if m.ratio <= TARGET_RATIO else 'MISS'} "
            f"| {statistics.median(m.project_cpu_s):.2f} "
            f"| {statistics.median(m.rss_before_kb) / 1024:.1f} "
            f"| {max(m.rss_peak_kb) / 1024:.1f} |"
        )
    return "\n".join(lines)


def memory_verdict(results: list[Measure]) -> str:
    """Flat means the growth over the start does not follow the audience size."""
    small, large = min(results, key=lambda m: m.rows), max(results, key=lambda m: m.rows)
    if small is large:
        return "memory: one audience size only; measure two topics to compare"
    # A few MiB of slack for allocator noise; a loaded audience would add ~100 B a row.
    flat = large.growth_kb <= small.growth_kb + FLAT_SLACK_KB
    return (
        f"memory: peak RSS grew {small.growth_kb / 1024:.1f} MiB for {small.rows:,} rows and "
        f"{large.growth_kb / 1024:.1f} MiB for {large.rows:,} rows "
        f"({large.rows / max(small.rows, 1):.1f}× the audience): "
        + ("flat" if flat else "GROWS WITH THE AUDIENCE")
    )


def machine() -> str:
    mem_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    return f"{os.cpu_count()} CPUs, {mem_kb / 1024 / 1024:.0f} GiB RAM"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--admin-url", default=DEFAULT_ADMIN_URL, help="a database to connect to")
    parser.add_argument("--database", default=DEFAULT_DATABASE, help="the database to create")
    parser.add_argument("--subscribers", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--topics", default=",".join(MEASURED), help="comma-separated slugs")
    parser.add_argument("--keep", action="store_true", help="leave the database in place")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="reuse the database if populated with the same --subscribers (implies --keep)",
    )
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--db-url", help=argparse.SUPPRESS)
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.subscribers, args.repeats = min(args.subscribers, 20_000), 1
        if args.database == DEFAULT_DATABASE:
            # Never replace a full-size database kept for --reuse.
            args.database = f"{DEFAULT_DATABASE}_quick"

    if args.child is not None:
        child(args.db_url, args.child)
        return 0

    total_started = time.perf_counter()
    pg_url, sa_url = database_urls(args.admin_url, args.database)
    reused = (
        args.reuse
        and database_exists(args.admin_url, args.database)
        and populated_with(pg_url) == args.subscribers
    )
    if reused:
        print(f"reusing {args.database} ({args.subscribers:,} subscribers)")
    else:
        create_database(args.admin_url, args.database)
    try:
        if not reused:
            populate(sa_url, args.subscribers)
        describe(pg_url)
        with psycopg.connect(pg_url) as conn:
            version = first_row(conn.execute("SHOW server_version"))[0]
        print(f"machine: {machine()}, PostgreSQL {version}, load {os.getloadavg()[0]:.1f}")
        print(f"measuring {args.topics} × {args.repeats}, interleaved:")
        results = measure(pg_url, sa_url, args.topics.split(","), args.repeats)
    finally:
        if not (args.keep or args.reuse):
            drop_database(args.admin_url, args.database)
            print(f"dropped {args.database}")
    print()
    print(table(results))
    print()
    print(
        "project s: recipients() streamed through a SQLAlchemy session in a child process "
        "(connect included, imports not); psql s: the same SQL compiled with literal binds, "
        "psql -X -A -t -o /dev/null (process wall time, connect included); medians of "
        f"{args.repeats} interleaved runs. project CPU s: user+sys of the child while "
        "streaming. RSS: VmRSS before the query and VmHWM after it, in the child."
    )
    print(memory_verdict(results))
    misses = [m.topic for m in results if m.ratio > TARGET_RATIO]
    print(
        "RESULT:",
        f"MISS (> {TARGET_RATIO:.1f}×) on {', '.join(misses)}" if misses else "all within target",
    )
    print(f"total {time.perf_counter() - total_started:.0f}s")
    write(
        args.json,
        benchmark="audience",
        title="Audience (recipient query)",
        figures=figures(results, args.subscribers),
        details_markdown=details(results, args, version),
    )
    return 0


def figures(results: list[Measure], subscribers: int) -> list[Figure]:
    found = [
        Figure(
            f"recipients of {m.topic} ({m.rows:,} of {subscribers:,} subscribers) streamed",
            round(statistics.median(m.project_s), 3),
            "s",
            round(statistics.median(m.psql_s), 3),
            "the same SQL run by psql",
            round(m.ratio, 3),
            f"≤ {TARGET_RATIO:g}×",
            m.ratio <= TARGET_RATIO,
        )
        for m in results
    ]
    large = max(results, key=lambda m: m.rows)
    small = min(results, key=lambda m: m.rows)
    if small is not large:
        found.append(
            Figure(
                f"peak RSS growth streaming {large.rows:,} rows",
                round(large.growth_kb / 1024, 1),
                "MiB",
                round(small.growth_kb / 1024, 1),
                f"growth streaming {small.rows:,} rows",
                None,
                "flat (within 8 MiB)",
                large.growth_kb <= small.growth_kb + FLAT_SLACK_KB,
            )
        )
    return found


def details(results: list[Measure], args: argparse.Namespace, version: str) -> str:
    return "\n\n".join(
        [
            "> Recipients of one topic among 1,000,000 subscribers in PostgreSQL stream "
            "within 2× the time of the same SQL run directly. (SPEC §6)",
            f"{args.subscribers:,} subscribers, PostgreSQL {version}, medians of "
            f"{args.repeats} interleaved runs.",
            table(results),
            "project s: `recipients()` streamed through a SQLAlchemy session in a child "
            "process (connect included, imports not); psql s: the same SQL compiled with "
            "literal binds, `psql -X -A -t -o /dev/null` (process wall time, connect "
            "included). RSS: VmRSS before the query and VmHWM after it, in the child.",
            memory_verdict(results),
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
