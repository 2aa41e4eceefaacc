"""The engine's claim while most of a campaign waits for later (local-time delivery).

    .venv/bin/python bench/waiting_claims.py [--sending 3000000] [--waiting 90]
                                             [--finished 5] [--finished-size 1000000]
                                             [--fractions 0,0.5,0.9] [--claims 5]
                                             [--admin-url URL] [--database NAME]

A campaign sent "at 09:00 in each person's time zone" is ``sending`` for about a day while
each zone's deliveries wait, queued, for their hour. The database is bench/claims.py's
(five finished campaigns of 1,000,000 answered deliveries, then one sending campaign of
3,000,000, made by SQL), except that ``--waiting`` percent of the sending campaign's
deliveries, spread evenly over its ids, are due 12 hours from now. At each fraction of the
*due* deliveries sent (the lowest due ids marked accepted, then VACUUM ANALYZE), the claim
is timed ``--claims`` times after one untimed claim, 500 rows each, its batches left in
flight under their lease, with its ``EXPLAIN (ANALYZE, BUFFERS)``.

Both sides in one run, on the same database at the same point:

- *new*: ``Dispatcher.claim()`` as the project has it — the claim asking for
  ``next_attempt_at <= now`` in due order from ``ix_delivery_due`` (on (next_attempt_at,
  id) since migration 0026; on (campaign_id, next_attempt_at, id) since 0033,
  ``bench/paused_claims.py``);
- *0017*: the index as migration 0017 made it (id only) and the claim statement of that
  time (due rows in id order), written out below as it was compiled then.

Never run by the test suite: it takes minutes and needs a PostgreSQL server.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import sqlalchemy as sa  # noqa: E402

from bench.claims import (  # noqa: E402
    ADMIN_URL,
    BATCH,
    DUE_INDEX,
    Claimer,
    Point,
    _admin,
    _ms,
    _psycopg,
    _url_for,
    answer,
    index_definition,
    populate,
)
from bench.contract import Figure, add_arguments, write  # noqa: E402
from portal.config import normalise_database_url  # noqa: E402
from portal.db import create_engine  # noqa: E402
from portal.migrate import upgrade  # noqa: E402

LEASE = dt.timedelta(seconds=60)
INDEX_0017 = (
    f"CREATE INDEX {DUE_INDEX} ON delivery USING btree (id) "
    "WHERE ((status)::text = ANY ((ARRAY['queued'::character varying, "
    "'sending'::character varying])::text[]))"
)
SENDING_CAMPAIGNS = (
    "SELECT campaign.id FROM campaign WHERE campaign.status = 'sending' "
    "ORDER BY campaign.id FOR KEY SHARE SKIP LOCKED"
)
# The claim statement before migration 0026 (engine.py at 0017), as it was compiled for
# PostgreSQL: due rows in id order, the status OR with the due time inside it.
CLAIM_0017 = """
UPDATE delivery SET status = 'sending', lease_expires_at = %(lease)s,
       attempts = (delivery.attempts + 1), updated_at = %(now)s
WHERE delivery.id IN (
    SELECT delivery_1.id FROM delivery AS delivery_1
    JOIN campaign ON campaign.id = delivery_1.campaign_id
    WHERE campaign.status = 'sending'
      AND ((delivery_1.status = 'queued' AND delivery_1.next_attempt_at <= %(now)s)
           OR (delivery_1.status = 'sending' AND delivery_1.lease_expires_at < %(now)s))
      AND delivery_1.campaign_id = ANY (%(sending)s)
    ORDER BY delivery_1.id
    LIMIT %(batch)s
    FOR UPDATE OF delivery_1 SKIP LOCKED)
RETURNING delivery.id, delivery.campaign_id, delivery.subscription_id,
          delivery.push_service, delivery.attempts
"""


class Claimer0017(Claimer):
    """The claim as it was before 0026, on the same connection pool and with the same
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
            self.statement = (CLAIM_0017, parameters)
            cursor.execute(CLAIM_0017, parameters)
            ids = sorted(row[0] for row in cursor.fetchall())
            raw.commit()
        finally:
            raw.close()
        return time.perf_counter() - started, ids


def mark_due_sent(
    engine: sa.Engine, campaign: uuid.UUID, first_id: int, size: int, fraction: float
) -> int:
    """The sending campaign's due deliveries with the lowest ids, up to ``fraction`` of
    its ids, answered (accepted); those that wait stay queued."""
    boundary = first_id + int(size * fraction)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE delivery SET status = 'accepted', attempts = attempts + 1, "
                "last_status_code = 201, lease_expires_at = NULL, updated_at = now() "
                "WHERE campaign_id = CAST(:c AS uuid) AND id < :b AND status <> 'accepted' "
                "AND next_attempt_at <= now()"
            ),
            {"c": str(campaign), "b": boundary},
        )
    with _admin(engine) as conn:
        conn.execute(sa.text("VACUUM (ANALYZE) delivery"))
        conn.execute(sa.text("CHECKPOINT"))
        sent = conn.execute(
            sa.text(
                "SELECT count(*) FROM delivery WHERE campaign_id = CAST(:c AS uuid) "
                "AND status = 'accepted'"
            ),
            {"c": str(campaign)},
        ).scalar_one()
    return int(sent)


def swap_index(engine: sa.Engine, definition: str) -> None:
    with _admin(engine) as conn:
        conn.execute(sa.text(f"DROP INDEX {DUE_INDEX}"))
        conn.execute(sa.text(definition))
        conn.execute(sa.text("ANALYZE delivery"))


def both_sides(
    engine: sa.Engine,
    new: Claimer,
    old: Claimer,
    fractions: list[float],
    mark: Callable[[float], int],
    *,
    then: str,
    before: str,
    claims: int,
    measure: Callable[[Claimer, str, float, int, int], Point],
) -> list[Point]:
    """At each fraction (``mark`` answers that much and says how many are sent), the new
    claim with ``ix_delivery_due`` as the migrations made it (``then``), then the old
    claim with the index as it was (``before``), which is put back afterwards."""
    points: list[Point] = []
    try:
        for fraction in fractions:
            sent = mark(fraction)
            points.append(measure(new, "new", fraction, sent, claims))
            new.engine.dispose()  # no plan cached with the index about to go
            swap_index(engine, before)
            points.append(measure(old, "before", fraction, sent, claims))
            old.engine.dispose()
            swap_index(engine, then)
    finally:
        new.engine.dispose()
        old.engine.dispose()
    return points


@dataclass
class Run:
    points: list[Point]
    due: int
    waiting: int


def measure(claimer: Claimer, side: str, fraction: float, sent: int, claims: int) -> Point:
    point = Point(side, fraction, sent)
    taken: list[int] = []
    _, ids = claimer.claim()  # warm-up, untimed
    taken += ids
    point.plan = claimer.explain()
    for _ in range(claims):
        seconds, ids = claimer.claim()
        if len(ids) != BATCH:
            raise SystemExit(f"a claim took {len(ids)} rows, not {BATCH}: too few due left")
        point.claims.append(seconds)
        taken += ids
    answer(claimer.engine, taken)
    print(
        f"  {side:>4} at {fraction:4.0%} of the due sent: claim median "
        f"{point.median * 1000:8.1f} ms (min {min(point.claims) * 1000:.1f}, max "
        f"{max(point.claims) * 1000:.1f}); EXPLAIN: {point.plan.index}, "
        f"{point.plan.buffers:,} buffers, choice {point.plan.choice_ms:.1f} ms",
        flush=True,
    )
    return point


_SIDES = {"new": "0033 (by campaign and due time)", "before": "0017 (id order)"}


def table(points: list[Point]) -> str:
    lines = [
        "| side | due sent | claim median ms | min ms | max ms | EXPLAIN index "
        "| buffers (choice) | choice ms | EXPLAIN ANALYZE ms |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for p in points:
        assert p.plan is not None
        lines.append(
            f"| {_SIDES[p.side]} | {p.fraction:.0%} | {p.median * 1000:.1f} "
            f"| {min(p.claims) * 1000:.1f} | {max(p.claims) * 1000:.1f} | `{p.plan.index}` "
            f"| {p.plan.buffers:,} | {p.plan.choice_ms:.1f} | {p.plan.milliseconds:.1f} |"
        )
    return "\n".join(lines)


def figures(points: list[Point], waiting: int) -> list[Figure]:
    out: list[Figure] = []
    for side in ("new", "before"):
        mine = {p.fraction: p for p in points if p.side == side}
        first = mine.get(0.0)
        if first is None:
            continue
        for fraction, point in sorted(mine.items()):
            if fraction == 0.0:
                continue
            ratio = point.median / first.median
            target = "≤ 1.5×" if side == "new" else ""
            out.append(
                Figure(
                    f"claim {_SIDES[side]} with {waiting}% waiting, at {fraction:.0%} of the "
                    "due sent vs at 0%",
                    _ms(point.median),
                    "ms",
                    _ms(first.median),
                    f"claim {_SIDES[side]} at 0%",
                    round(ratio, 2),
                    target,
                    (ratio <= 1.5) if side == "new" else None,
                )
            )
    news = {p.fraction: p for p in points if p.side == "new"}
    for p in points:
        if p.side == "before" and p.fraction in news:
            out.append(
                Figure(
                    f"claim with {waiting}% waiting at {p.fraction:.0%} of the due sent, "
                    "0033 vs 0017",
                    _ms(news[p.fraction].median),
                    "ms",
                    _ms(p.median),
                    "the 0017 claim, same point",
                    round(news[p.fraction].median / p.median, 3),
                )
            )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sending", type=int, default=3_000_000)
    parser.add_argument("--waiting", type=int, default=90, help="percent due 12 h from now")
    parser.add_argument("--finished", type=int, default=5)
    parser.add_argument("--finished-size", type=int, default=1_000_000)
    parser.add_argument("--fractions", default="0,0.5,0.9")
    parser.add_argument("--claims", type=int, default=5, help="timed claims per point")
    parser.add_argument("--admin-url", default=ADMIN_URL)
    parser.add_argument("--database", default="portal_bench_waiting_claims")
    add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        # Enough due rows that both sides still find four full claims at 90% sent.
        args.sending = min(args.sending, 600_000)
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
        total = args.sending + args.finished * args.finished_size
        print(f"populating {args.database} with {total:,} deliveries ({args.waiting}% waiting)")
        population = populate(
            engine, args.sending, args.finished, args.finished_size, waiting=args.waiting
        )
        print(f"  populated in {population.seconds:.0f} s")
        with engine.connect() as conn:
            definition = index_definition(conn, DUE_INDEX)
            postgres = conn.execute(sa.text("SHOW server_version")).scalar_one()
            waiting_rows = conn.execute(
                sa.text(
                    "SELECT count(*) FROM delivery WHERE campaign_id = CAST(:c AS uuid) "
                    "AND next_attempt_at > now()"
                ),
                {"c": str(population.sending)},
            ).scalar_one()
        due_rows = population.size - waiting_rows
        with tempfile.TemporaryDirectory() as instance:
            points = both_sides(
                engine,
                Claimer(url, instance),
                Claimer0017(url, instance),
                fractions,
                lambda fraction: mark_due_sent(
                    engine, population.sending, population.first_id, population.size, fraction
                ),
                then=definition,
                before=INDEX_0017,
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
    found = figures(points, args.waiting)
    for figure in found:
        print(
            f"{figure.figure}: {figure.value} {figure.unit} vs {figure.baseline} "
            f"({figure.ratio}×) {figure.target}"
        )
    details = [
        f"PostgreSQL {postgres}. {population.rows:,} deliveries: {args.finished} finished "
        f"campaigns of {args.finished_size:,} (answered), then one sending campaign of "
        f"{population.size:,} of which {waiting_rows:,} ({args.waiting}%, spread over its "
        f"ids) are due 12 hours later, as a local-time campaign's other zones are, and "
        f"{due_rows:,} due now. At each point the lowest due ids up to that fraction of "
        "the campaign are marked accepted and the table vacuumed; then each side's claim "
        f"({BATCH} rows) is timed {args.claims} times after one untimed claim. *0033*: "
        "`Dispatcher.claim()` with `ix_delivery_due` on (campaign_id, next_attempt_at, id) "
        "(on (next_attempt_at, id) from 0026 to 0033: the same shape here, one sending "
        "campaign). *0017*: the "
        "index on (id) as migration 0017 made it, and the claim statement of that time, "
        "due rows in id order (`bench/waiting_claims.py` `CLAIM_0017`). Load average "
        f"{' / '.join(f'{v:.2f}' for v in load_before)} before, "
        f"{' / '.join(f'{v:.2f}' for v in load_after)} after ({seconds:.0f} s).",
        table(points),
    ]
    ends = (fractions[0], fractions[-1])
    for p in points:
        if p.plan is not None and p.fraction in ends:
            details.append(
                f"EXPLAIN (ANALYZE, BUFFERS), {_SIDES[p.side]}, {p.fraction:.0%} of the due "
                f"sent:\n\n```\n{p.plan.text}\n```"
            )
    write(
        args.json,
        benchmark="waiting_claims",
        title="Claims while most of a campaign waits (local-time delivery)",
        figures=found,
        details_markdown="\n\n".join(details),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
