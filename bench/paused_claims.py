"""The engine's claim while a large campaign is paused with its deliveries due.

    .venv/bin/python bench/paused_claims.py [--sending 1000000] [--paused 1000000]
                                            [--finished 2] [--finished-size 1000000]
                                            [--fractions 0,0.5,0.9] [--claims 5]
                                            [--admin-url URL] [--database NAME]

Staff pause a campaign of a million people and launch another: the paused campaign's
deliveries stay queued and due (they go when it resumes). The database is
bench/claims.py's (finished campaigns of answered deliveries, one sending campaign, made
by SQL) plus that paused campaign, made just before the sending one: its deliveries have
lower ids and fell due an hour earlier. At each fraction of the sending campaign sent (its
lowest ids marked accepted, then VACUUM ANALYZE), each side's claim is timed ``--claims``
times after one untimed claim, 500 rows each, its batches left in flight under their
lease, with its ``EXPLAIN (ANALYZE, BUFFERS)``.

Both sides in one run, on the same database at the same point:

- *0033*: ``Dispatcher.claim()`` as the project has it: ``ix_delivery_due`` on
  (campaign_id, next_attempt_at, id), the sending campaigns asked one at a time, each
  from its own part of the index, until the batch is full;
- *0026*: the index as migration 0026 made it, on (next_attempt_at, id) for every
  campaign, and the claim statement of that time (the due rows of every campaign in due
  order, those of campaigns not sending dropped), written out below as it was compiled.

Never run by the test suite: it takes minutes and needs a PostgreSQL server.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import sqlalchemy as sa  # noqa: E402

from bench.claims import (  # noqa: E402
    ADMIN_URL,
    BATCH,
    DUE_INDEX,
    TARGET_RATIO,
    Claimer,
    Point,
    _psycopg,
    _url_for,
    index_definition,
    mark_sent,
    measure,
    populate,
)
from bench.contract import Figure, add_arguments, write  # noqa: E402
from bench.waiting_claims import LEASE, SENDING_CAMPAIGNS, both_sides  # noqa: E402
from portal.config import normalise_database_url  # noqa: E402
from portal.db import create_engine  # noqa: E402
from portal.migrate import upgrade  # noqa: E402

INDEX_0026 = (
    f"CREATE INDEX {DUE_INDEX} ON delivery USING btree (next_attempt_at, id) "
    "WHERE ((status)::text = ANY ((ARRAY['queued'::character varying, "
    "'sending'::character varying])::text[]))"
)
# The claim statement before migration 0033 (engine.py at 49b7f94), as it was compiled
# for PostgreSQL: the due rows of the sending campaigns in due order, one index for all.
CLAIM_0026 = """
WITH picked AS MATERIALIZED (
    SELECT delivery.id AS id, delivery.tableoid AS partition, delivery.ctid AS place
    FROM delivery
    WHERE delivery.next_attempt_at <= %(now)s
      AND (delivery.status = 'queued'
           OR delivery.status = 'sending' AND delivery.lease_expires_at < %(now)s)
      AND delivery.campaign_id = ANY (%(sending)s::uuid[])
    ORDER BY delivery.next_attempt_at, delivery.id
    LIMIT %(batch)s
    FOR UPDATE OF delivery SKIP LOCKED)
UPDATE delivery SET status = 'sending', attempts = (delivery.attempts + 1),
       lease_expires_at = %(lease)s, updated_at = %(now)s
FROM picked
WHERE picked.place = delivery.ctid AND picked.partition = delivery.tableoid
  AND delivery.campaign_id = ANY (%(sending)s::uuid[])
RETURNING delivery.id, delivery.campaign_id, delivery.subscription_id,
          delivery.push_service, delivery.attempts, delivery.variant
"""
_SIDES = {"new": "0033 (each campaign's due rows)", "before": "0026 (every campaign's)"}


class Claimer0026(Claimer):
    """The claim as it was before 0033, on the same connection pool and with the same
    EXPLAIN reading as the project's."""

    def claim(self) -> tuple[float, list[int]]:
        started = time.perf_counter()
        now = dt.datetime.now(dt.UTC)
        raw = self.engine.raw_connection()
        try:
            cursor = raw.cursor()
            cursor.execute(SENDING_CAMPAIGNS)
            sending = [row[0] for row in cursor.fetchall()]
            parameters = {"now": now, "lease": now + LEASE, "sending": sending, "batch": BATCH}
            self.statement = (CLAIM_0026, parameters)
            cursor.execute(CLAIM_0026, parameters)
            ids = sorted(row[0] for row in cursor.fetchall())
            raw.commit()
        finally:
            raw.close()
        return time.perf_counter() - started, ids


def table(points: list[Point]) -> str:
    lines = [
        "| side | sending campaign sent | claim median ms | min ms | max ms "
        "| buffers (choice) | choice ms | EXPLAIN ANALYZE ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        assert p.plan is not None
        lines.append(
            f"| {_SIDES[p.side]} | {p.fraction:.0%} | {p.median * 1000:.1f} "
            f"| {min(p.claims) * 1000:.1f} | {max(p.claims) * 1000:.1f} "
            f"| {p.plan.buffers:,} | {p.plan.choice_ms:.1f} | {p.plan.milliseconds:.1f} |"
        )
    return "\n".join(lines)


def figures(points: list[Point], paused: int) -> list[Figure]:
    out: list[Figure] = []
    news = {p.fraction: p for p in points if p.side == "new"}
    first = news.get(0.0)
    for fraction, point in sorted(news.items()):
        if first is None or fraction == 0.0:
            continue
        ratio = point.median / first.median
        out.append(
            Figure(
                f"claim {_SIDES['new']} beside {paused:,} paused, at {fraction:.0%} sent vs 0%",
                round(point.median * 1000, 1),
                "ms",
                round(first.median * 1000, 1),
                "the same claim at 0% sent",
                round(ratio, 2),
                f"≤ {TARGET_RATIO}×",
                ratio <= TARGET_RATIO,
            )
        )
    for p in points:
        if p.side == "before" and p.fraction in news:
            out.append(
                Figure(
                    f"claim beside {paused:,} paused at {p.fraction:.0%} sent, 0033 vs 0026",
                    round(news[p.fraction].median * 1000, 1),
                    "ms",
                    round(p.median * 1000, 1),
                    "the 0026 claim, same point",
                    round(news[p.fraction].median / p.median, 3),
                )
            )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sending", type=int, default=1_000_000)
    parser.add_argument("--paused", type=int, default=1_000_000)
    parser.add_argument("--finished", type=int, default=2)
    parser.add_argument("--finished-size", type=int, default=1_000_000)
    parser.add_argument("--fractions", default="0,0.5,0.9")
    parser.add_argument("--claims", type=int, default=5, help="timed claims per point")
    parser.add_argument("--admin-url", default=ADMIN_URL)
    parser.add_argument("--database", default="portal_bench_paused_claims")
    add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.sending = min(args.sending, 200_000)
        args.paused = min(args.paused, 200_000)
        args.finished_size = min(args.finished_size, 20_000)
        args.claims = min(args.claims, 3)
    fractions = [float(f) for f in args.fractions.split(",")]
    admin = _psycopg(normalise_database_url(args.admin_url))
    url = _url_for(args.admin_url, args.database)
    load_before = os.getloadavg()
    started = time.perf_counter()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{args.database}"')
    engine = create_engine(url)
    points: list[Point] = []
    try:
        upgrade(engine)
        total = args.sending + args.paused + args.finished * args.finished_size
        print(f"populating {args.database} with {total:,} deliveries ({args.paused:,} paused)")
        population = populate(
            engine, args.sending, args.finished, args.finished_size, paused=args.paused
        )
        print(f"  populated in {population.seconds:.0f} s")
        with engine.connect() as conn:
            definition = index_definition(conn, DUE_INDEX)
            postgres = conn.execute(sa.text("SHOW server_version")).scalar_one()
            held = conn.execute(
                sa.text(
                    "SELECT count(*) FROM delivery JOIN campaign ON campaign.id = campaign_id "
                    "WHERE campaign.status = 'paused' AND delivery.status = 'queued' "
                    "AND next_attempt_at <= now()"
                )
            ).scalar_one()
        if held != args.paused:
            raise SystemExit(f"{held:,} paused deliveries due, not {args.paused:,}")
        with tempfile.TemporaryDirectory() as instance:
            points = both_sides(
                engine,
                Claimer(url, instance),
                Claimer0026(url, instance),
                fractions,
                lambda fraction: mark_sent(engine, population, fraction),
                then=definition,
                before=INDEX_0026,
                claims=args.claims,
                measure=measure,
            )
    finally:
        engine.dispose()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
    load_after = os.getloadavg()
    seconds = time.perf_counter() - started

    print()
    print(table(points))
    found = figures(points, args.paused)
    for figure in found:
        print(
            f"{figure.figure}: {figure.value} {figure.unit} vs {figure.baseline} "
            f"({figure.ratio}×) {figure.target}"
        )
    details = [
        f"PostgreSQL {postgres}. {population.rows:,} deliveries: {args.finished} finished "
        f"campaigns of {args.finished_size:,} (answered), a campaign of {args.paused:,} "
        "paused with every delivery queued and due (made first: lower ids, due an hour "
        f"earlier), then one sending campaign of {population.size:,}, made by SQL. At each "
        "point the sending campaign's lowest ids up to that fraction are marked accepted "
        f"and the table vacuumed; then each side's claim ({BATCH} rows) is timed "
        f"{args.claims} times after one untimed claim. *0033*: `Dispatcher.claim()` with "
        "`ix_delivery_due` on (campaign_id, next_attempt_at, id). *0026*: the index on "
        "(next_attempt_at, id) as migration 0026 made it, and the claim statement of that "
        "time (`bench/paused_claims.py` `CLAIM_0026`). Load average "
        f"{' / '.join(f'{v:.2f}' for v in load_before)} before, "
        f"{' / '.join(f'{v:.2f}' for v in load_after)} after ({seconds:.0f} s).",
        table(points),
        "The shape: the 0026 claim walked the due rows of every campaign in due order and "
        "dropped those of the paused one, which fell due first, so each claim read the "
        "whole paused queue; the 0033 claim reads the sending campaign's own next batch.",
    ]
    for p in points:
        if p.plan is not None and p.fraction == fractions[-1]:
            details.append(
                f"EXPLAIN (ANALYZE, BUFFERS), {_SIDES[p.side]}, {p.fraction:.0%} sent:\n\n"
                "```\n" + p.plan.text + "\n```"
            )
    write(
        args.json,
        benchmark="paused_claims",
        title="Claims beside a paused campaign",
        figures=found,
        details_markdown="\n\n".join(details),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
