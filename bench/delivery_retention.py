"""Delivery retention at campaign scale on PostgreSQL: a finished campaign's deliveries
folded into counters and deleted, batch by batch, beside a campaign being sent.

    .venv/bin/python bench/delivery_retention.py [--finished-size 1000000]
                                                 [--sending 1000000] [--batch 1000]
                                                 [--admin-url URL] [--database NAME]

Creates its own database, migrates it and fills it as bench/claims.py does (set-based SQL,
never the engine): two finished campaigns of ``--finished-size`` deliveries each, finished
14 months ago, with display receipts (30 % of the accepted shown, 5 % clicked, some on a
button) also made by SQL; and one sending campaign of ``--sending`` queued deliveries.

1. **Idle**: the sending campaign's claim (``Dispatcher.claim()``, 500 rows) timed.
2. **The fold**: campaign 1 folded by the project's own job step
   (``portal.retention.tables.fold_deliveries``, ``--batch`` rows a transaction), each
   batch timed from the job's own progress calls — first tenth against last tenth — while
   a thread claims from the sending campaign every 200 ms (the claims during). The WAL it
   wrote, and the campaign's figures (``outcome.read``, ``funnel.read``) before and after,
   which must be equal.
3. **What a partition drop would save**: for campaign 2 (same size), the one statement
   any layout needs to fold it (its counters and its funnel rows, read without deleting:
   a partitioned table must count the rows before dropping them too), then a table
   holding exactly campaign 2's rows with ``delivery``'s indexes, and the time to drop it
   (what dropping a month's partition costs).

Never run by the test suite: it takes minutes and needs a PostgreSQL server.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import sqlalchemy as sa  # noqa: E402

from bench.claims import Claimer, _psycopg, _url_for, answer, populate  # noqa: E402
from bench.contract import Figure, add_arguments, write  # noqa: E402
from portal.config import normalise_database_url  # noqa: E402
from portal.db import create_engine  # noqa: E402
from portal.migrate import upgrade  # noqa: E402

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
CLAIM_EVERY = 0.2
STEP_SAMPLES = 20


def fold_steps(app: object, campaign_id: uuid.UUID, ids: list[int]) -> dict[str, float]:
    """The statements of ``tally.fold`` for one batch, each timed, then rolled back."""
    from portal.campaigns import funnel, tally
    from portal.delivery.models import Delivery, DeliveryReceipt

    d, r = Delivery.__table__, DeliveryReceipt.__table__
    chosen = sa.and_(d.c.campaign_id == campaign_id, d.c.id.in_(ids))
    engine = app.extensions["portal.db"].engine  # type: ignore[attr-defined]
    taken: dict[str, float] = {}
    with engine.connect() as conn:
        from sqlalchemy.orm import Session

        session = Session(bind=conn)
        for name, statement in (
            (
                "lock the batch (SELECT … FOR UPDATE SKIP LOCKED)",
                sa.select(d.c.id).where(chosen).with_for_update(skip_locked=True),
            ),
            ("count the groups (tally.groups)", tally.groups(chosen)),
            ("count the funnel (funnel.minute_rows)", funnel.minute_rows(session, chosen)),
            ("delete the receipts", sa.delete(r).where(r.c.delivery_id.in_([str(i) for i in ids]))),
            ("delete the deliveries", sa.delete(d).where(chosen)),
        ):
            started = time.perf_counter()
            session.execute(statement)
            taken[name] = time.perf_counter() - started
        session.rollback()
    return taken


@dataclass
class Batches:
    """The job's progress calls, timed: each ``advance`` ends one committed batch."""

    rows: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    last: float = 0.0

    def start(self, total: int) -> None:
        self.last = time.perf_counter()

    def advance(self, count: int) -> None:
        now = time.perf_counter()
        self.rows.append(count)
        self.seconds.append(now - self.last)
        self.last = now

    def tenth(self, which: int) -> tuple[int, float]:
        n = max(1, len(self.seconds) // 10)
        part = slice(0, n) if which == 0 else slice(len(self.seconds) - n, None)
        return sum(self.rows[part]), sum(self.seconds[part])


def add_receipts(engine: sa.Engine, campaigns: list[uuid.UUID]) -> int:
    """Display receipts as browsers send them, by SQL: 30 % of the accepted shown a
    minute or so after the answer, 5 % clicked (one in five of those on a button)."""
    with engine.begin() as conn:
        for campaign in campaigns:
            conn.execute(
                sa.text(
                    "INSERT INTO delivery_receipt (delivery_id, event, at) "
                    "SELECT id::text, 'shown', updated_at + (id % 120) * interval '1 second' "
                    "FROM delivery WHERE campaign_id = CAST(:c AS uuid) "
                    "AND status = 'accepted' AND id % 10 < 3"
                ),
                {"c": str(campaign)},
            )
            conn.execute(
                sa.text(
                    "INSERT INTO delivery_receipt (delivery_id, event, at) "
                    "SELECT id::text, CASE WHEN id % 5 = 0 THEN 'action-1' ELSE 'clicked' END, "
                    "updated_at + (id % 3600) * interval '1 second' "
                    "FROM delivery WHERE campaign_id = CAST(:c AS uuid) "
                    "AND status = 'accepted' AND id % 100 < 5"
                ),
                {"c": str(campaign)},
            )
        count = conn.execute(sa.text("SELECT count(*) FROM delivery_receipt")).scalar_one()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM (ANALYZE) delivery_receipt"))
    return int(count)


def claims_beside(claimer: Claimer, stop: threading.Event, times: list[float]) -> None:
    taken: list[int] = []
    while not stop.is_set():
        seconds, ids = claimer.claim()
        times.append(seconds)
        taken += ids
        if len(taken) >= 5000:
            answer(claimer.engine, taken)
            taken = []
        stop.wait(CLAIM_EVERY)
    answer(claimer.engine, taken)


def _ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--finished-size", type=int, default=1_000_000)
    parser.add_argument("--sending", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--admin-url", default=ADMIN_URL)
    parser.add_argument("--database", default="portal_bench_delivery_retention")
    add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.finished_size = min(args.finished_size, 20_000)
        args.sending = min(args.sending, 100_000)

    from portal.campaigns import funnel, outcome, tally
    from portal.campaigns.models import Campaign
    from portal.db import db
    from portal.delivery.models import Delivery
    from portal.jobreport import JobReport
    from portal.retention.tables import fold_deliveries
    from portal.seams import current_portal

    admin = _psycopg(normalise_database_url(args.admin_url))
    url = _url_for(args.admin_url, args.database)
    load_before = os.getloadavg()
    started = time.perf_counter()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{args.database}"')
    engine = create_engine(url)
    try:
        upgrade(engine)
        print(f"populating {args.database}", flush=True)
        population = populate(engine, args.sending, 2, args.finished_size)
        with engine.begin() as conn:
            first, second = conn.execute(
                sa.text(
                    "SELECT id FROM campaign WHERE status = 'completed' ORDER BY finished_at, id"
                )
            ).scalars()
            conn.execute(
                sa.text(
                    "UPDATE campaign SET finished_at = now() - interval '14 months', "
                    "send_at = now() - interval '14 months' WHERE status = 'completed'"
                )
            )
            # Only campaign 1 is due for folding in step 2.
            conn.execute(
                sa.text("UPDATE campaign SET finished_at = now() WHERE id = :c"), {"c": second}
            )
            postgres = conn.execute(sa.text("SHOW server_version")).scalar_one()
        receipts = add_receipts(engine, [first, second])
        print(f"  {population.rows:,} deliveries, {receipts:,} receipts", flush=True)

        with tempfile.TemporaryDirectory() as instance:
            claimer = Claimer(url, instance)
            app = claimer.app
            settings = current_portal(app).settings
            settings = settings.with_overrides(
                retention=type(settings.retention)(batch_size=args.batch)
            )
            try:
                claimer.claim()  # warm-up
                idle: list[float] = []
                for _ in range(25):
                    seconds, ids = claimer.claim()
                    idle.append(seconds)
                    answer(claimer.engine, ids)
                    time.sleep(CLAIM_EVERY)

                def figures_of(campaign_id: uuid.UUID) -> tuple[object, object]:
                    with db.begin(app) as session:
                        campaign = session.get(Campaign, campaign_id)
                        assert campaign is not None
                        now = current_portal(app).clock.now()
                        return (
                            outcome.read(session, campaign, now=now).facts.counts,
                            funnel.read(session, campaign, now=now).buckets,
                        )

                before = figures_of(first)
                steps: dict[str, list[float]] = {}
                with engine.connect() as conn:
                    wal_start = conn.execute(sa.text("SELECT pg_current_wal_lsn()")).scalar()
                stop = threading.Event()
                during: list[float] = []
                beside = threading.Thread(target=claims_beside, args=(claimer, stop, during))
                batches = Batches()
                beside.start()
                fold_started = time.perf_counter()
                try:
                    with app.app_context():
                        report = JobReport("table-retention")
                        fold_deliveries(
                            app, current_portal(app).clock.now(), settings, batches, report
                        )
                finally:
                    fold_seconds = time.perf_counter() - fold_started
                    stop.set()
                    beside.join()
                with engine.connect() as conn:
                    wal_bytes = conn.execute(
                        sa.text("SELECT pg_current_wal_lsn() - CAST(:s AS pg_lsn)"),
                        {"s": str(wal_start)},
                    ).scalar_one()
                    left = conn.execute(
                        sa.text("SELECT count(*) FROM delivery WHERE campaign_id = :c"),
                        {"c": first},
                    ).scalar_one()
                    tally_rows = conn.execute(
                        sa.text(
                            "SELECT (SELECT count(*) FROM delivery_tally), "
                            "(SELECT count(*) FROM funnel_tally)"
                        )
                    ).one()
                after = figures_of(first)
                if after != before or left:
                    raise SystemExit("the folded campaign's figures changed, or rows are left")
                folded = report.changed
                print(
                    f"  fold: {folded:,} deliveries in {fold_seconds:.1f} s "
                    f"({folded / fold_seconds:,.0f} /s), {len(batches.seconds)} batches",
                    flush=True,
                )

                # What a partition drop would save, on campaign 2.
                with db.begin(app) as session:
                    of_second = Delivery.__table__.c.campaign_id == second
                    read_started = time.perf_counter()
                    session.execute(tally.groups(of_second)).all()
                    session.execute(funnel.minute_rows(session, of_second)).all()
                    read_seconds = time.perf_counter() - read_started
                # Where a batch's time goes: each step of tally.fold, timed on batches
                # of campaign 2 in transactions rolled back.
                with engine.connect() as conn:
                    second_ids = list(
                        conn.execute(
                            sa.text("SELECT id FROM delivery WHERE campaign_id = :c ORDER BY id"),
                            {"c": second},
                        ).scalars()
                    )
                step = len(second_ids) // STEP_SAMPLES
                for n in range(STEP_SAMPLES):
                    ids = second_ids[n * step : n * step + args.batch]
                    for name, seconds_taken in fold_steps(app, second, ids).items():
                        steps.setdefault(name, []).append(seconds_taken)
                with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                    conn.execute(
                        sa.text(
                            "CREATE TABLE drop_probe AS SELECT * FROM delivery "
                            "WHERE campaign_id = :c"
                        ),
                        {"c": second},
                    )
                    for column in (
                        "campaign_id, status, next_attempt_at",
                        "subscription_id, updated_at",
                        "campaign_id, subscription_id",
                        "id",
                    ):
                        conn.execute(sa.text(f"CREATE INDEX ON drop_probe ({column})"))
                    probe_rows = conn.execute(sa.text("SELECT count(*) FROM drop_probe")).scalar()
                    drop_started = time.perf_counter()
                    conn.execute(sa.text("DROP TABLE drop_probe"))
                    drop_seconds = time.perf_counter() - drop_started
            finally:
                claimer.engine.dispose()
    finally:
        engine.dispose()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
    load_after = os.getloadavg()
    seconds = time.perf_counter() - started

    first_rows, first_seconds = batches.tenth(0)
    last_rows, last_seconds = batches.tenth(1)
    first_rate, last_rate = first_rows / first_seconds, last_rows / last_seconds
    delete_share = 1 - read_seconds / fold_seconds
    found = [
        Figure(
            f"fold of a finished campaign of {folded:,} deliveries: rows/s, last tenth vs "
            "first tenth",
            round(last_rate),
            "rows/s",
            round(first_rate),
            "first tenth of the same fold",
            round(last_rate / first_rate, 2),
            "≥ 0.9×",
            last_rate / first_rate >= 0.9,
        ),
        Figure(
            "claim (500 rows) p99 while the fold runs vs idle",
            round(_ms(during, 0.99), 1),
            "ms",
            round(_ms(idle, 0.99), 1),
            "idle, same run",
            round(_ms(during, 0.99) / _ms(idle, 0.99), 2),
        ),
        Figure(
            f"reading a campaign's counters in one statement ({probe_rows:,} rows, what any "
            "layout must read to fold it) vs the whole fold",
            round(read_seconds, 2),
            "s",
            round(fold_seconds, 2),
            "the fold with its deletes",
            round(read_seconds / fold_seconds, 3),
        ),
        Figure(
            f"DROP of a table of {probe_rows:,} deliveries with the same indexes "
            "(a month's partition)",
            round(drop_seconds * 1000, 1),
            "ms",
        ),
    ]
    table = "\n".join(
        [
            "| | value |",
            "|---|---:|",
            f"| deliveries folded (campaign 1) | {folded:,} |",
            f"| batches of {args.batch:,} | {len(batches.seconds):,} |",
            f"| fold, whole | {fold_seconds:.1f} s ({folded / fold_seconds:,.0f} rows/s) |",
            f"| first tenth | {first_rows:,} rows in {first_seconds:.2f} s "
            f"({first_rate:,.0f} rows/s) |",
            f"| last tenth | {last_rows:,} rows in {last_seconds:.2f} s "
            f"({last_rate:,.0f} rows/s) |",
            f"| batch median / max | {statistics.median(batches.seconds) * 1000:.1f} / "
            f"{max(batches.seconds) * 1000:.1f} ms |",
            f"| WAL written by the fold | {int(wal_bytes) / 2**20:,.0f} MiB |",
            f"| counter rows after compaction (delivery_tally, funnel_tally) | "
            f"{tally_rows[0]:,}, {tally_rows[1]:,} |",
            f"| claims idle: p50 / p99 (n={len(idle)}) | {_ms(idle, 0.5):.1f} / "
            f"{_ms(idle, 0.99):.1f} ms |",
            f"| claims during the fold: p50 / p99 (n={len(during)}) | "
            f"{_ms(during, 0.5):.1f} / {_ms(during, 0.99):.1f} ms |",
            f"| campaign 2: its counters read in one statement | {read_seconds:.2f} s |",
            f"| campaign 2: DROP of a table of its {probe_rows:,} rows and 4 indexes | "
            f"{drop_seconds * 1000:.1f} ms |",
            f"| the fold less one read of its counters (what a partition drop would save) | "
            f"{fold_seconds - read_seconds:.1f} s ({delete_share:.0%}) |",
        ]
    )
    whole_batch = sum(statistics.median(v) for v in steps.values())
    breakdown = "\n".join(
        [
            f"| step of one batch of {args.batch:,} (median of {STEP_SAMPLES}, rolled back) "
            "| ms | share |",
            "|---|---:|---:|",
            *(
                f"| {name} | {statistics.median(values) * 1000:.1f} | "
                f"{statistics.median(values) / whole_batch:.0%} |"
                for name, values in steps.items()
            ),
        ]
    )
    print()
    print(table)
    print()
    print(breakdown)
    details = [
        f"PostgreSQL {postgres}. {population.rows:,} deliveries: two campaigns of "
        f"{args.finished_size:,} finished 14 months ago (answered: 97 % accepted, the rest "
        "failed, revoked or skipped) with "
        f"{receipts:,} display receipts, and one sending campaign of {args.sending:,}, "
        "made by SQL. Campaign 1 folded by `fold_deliveries` (the `table-retention` job's "
        f"step, batches of {args.batch:,}) while a thread claimed 500 rows from the sending "
        f"campaign every {CLAIM_EVERY * 1000:.0f} ms; the campaign's outcome counts and "
        "funnel buckets were compared before and after (equal). Load average "
        f"{' / '.join(f'{v:.2f}' for v in load_before)} before, "
        f"{' / '.join(f'{v:.2f}' for v in load_after)} after ({seconds:.0f} s).",
        table,
        "Where one batch's time goes (each statement of `tally.fold` on batches of campaign "
        "2, timed in transactions rolled back; the counters' own inserts are a few rows):",
        breakdown,
    ]
    write(
        args.json,
        benchmark="delivery_retention",
        title="Delivery retention (folding a finished campaign beside a sending one)",
        figures=found,
        details_markdown="\n\n".join(details),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
