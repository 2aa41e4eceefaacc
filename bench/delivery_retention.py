"""Delivery retention at campaign scale on PostgreSQL: a finished campaign's deliveries
folded into counters and deleted, batch by batch, beside a campaign being sent.

    .venv/bin/python bench/delivery_retention.py [--finished-size 1000000]
                                                 [--sending 1000000] [--batch 1000]
                                                 [--admin-url URL] [--database NAME]

Creates its own database, migrates it and fills it as bench/claims.py does (set-based SQL,
never the engine): two finished campaigns of ``--finished-size`` deliveries each, finished
14 months ago, with random ids (their deliveries in the default partition: what the
row-by-row fold takes); a third of the same size made and finished 14 months ago with a
UUIDv7 id, in its month's partition; display receipts for the three (30 % of the accepted
shown, 5 % clicked, some on a button) also made by SQL; and one sending campaign of
``--sending`` queued deliveries.

1. **Idle**: the sending campaign's claim (``Dispatcher.claim()``, 500 rows) timed.
2. **The fold**: campaign 1 folded by the project's own job step
   (``portal.retention.tables.fold_deliveries``, ``--batch`` rows a transaction), each
   batch timed from the job's own progress calls — first tenth against last tenth — while
   a thread claims from the sending campaign every 200 ms (the claims during). The WAL it
   wrote, and the campaign's figures (``outcome.read``, ``funnel.read``) before and after,
   which must be equal. Then campaign 2 with the default pause.
3. **The partition drop**: the job's partition step
   (``portal.retention.tables.delivery_partitions``) counts campaign 3 into its counters,
   deletes its receipts and drops its month's partition, while the claims run beside it:
   its time, its WAL, the claims during, and campaign 3's figures before and after. Also
   the one statement any layout needs to fold a campaign (its counters and funnel rows,
   read without deleting), timed on campaign 2 before its fold.

Never run by the test suite: it takes minutes and needs a PostgreSQL server.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import sqlalchemy as sa  # noqa: E402

from bench.claims import (  # noqa: E402
    CAMPAIGN_SQL,
    CHUNK,
    DELIVERY_SQL,
    Claimer,
    _psycopg,
    _url_for,
    answer,
    populate,
)
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

    d = cast(sa.Table, Delivery.__table__)
    r = cast(sa.Table, DeliveryReceipt.__table__)
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


def old_month_campaign(engine: sa.Engine, size: int) -> tuple[uuid.UUID, str]:
    """A campaign made, sent and finished 14 months ago with ``size`` answered deliveries,
    its id a UUIDv7 of then: its deliveries in that month's partition (made here)."""
    from sqlalchemy.orm import Session

    from portal.db import uuid7
    from portal.delivery import partitions

    age = "434 days"  # 14 months of 31 days
    made = dt.datetime.now(dt.UTC) - dt.timedelta(days=434)
    campaign = uuid7(at=made)
    with Session(engine) as session, session.begin():
        month = partitions.Month.of(made)
        if month not in partitions.months(session):
            partitions.create(session, month, lock_timeout_ms=60_000)
    with engine.begin() as conn:
        topic = conn.execute(sa.text("SELECT id FROM topic ORDER BY id LIMIT 1")).scalar_one()
        conn.execute(
            sa.text(CAMPAIGN_SQL),
            {
                "id": str(campaign),
                "topic": topic,
                "title": "Campaign of a month long gone",
                "age": age,
                "status": "completed",
                "finished_at": made + dt.timedelta(hours=1),
            },
        )
    for lo in range(0, size, CHUNK):
        hi = min(lo + CHUNK, size) - 1
        with engine.begin() as conn:
            conn.execute(sa.text("SET LOCAL session_replication_role = replica"))
            conn.execute(
                sa.text(DELIVERY_SQL),
                {
                    "campaign": str(campaign),
                    "finished": True,
                    "age": age,
                    "lo": lo,
                    "hi": hi,
                    "waiting": 0,
                },
            )
        print(f"  campaign 3 ({month.name}): {hi + 1:,} of {size:,} rows", flush=True)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM (ANALYZE) delivery"))
    return campaign, month.name


@dataclass
class DropRun:
    """A month's partition counted and dropped by the job's step, claims beside it."""

    dropped: int = 0
    seconds: float = 0.0
    wal_bytes: int = 0
    during: list[float] = field(default_factory=list)


def drop_beside(app: Any, settings: Any, claimer: Claimer) -> DropRun:
    """The job's partition step (``delivery_partitions``) while a thread claims from the
    sending campaign; the WAL it wrote."""
    from portal.retention.tables import delivery_partitions

    run = DropRun()
    report, run.seconds, run.wal_bytes = beside_claims(
        claimer,
        run.during,
        lambda now, report: delivery_partitions(app, now, settings, report),
        "the drop did not happen",
    )
    run.dropped = report.changed
    print(
        f"  partition drop: {run.dropped:,} deliveries in {run.seconds:.1f} s; claims beside "
        f"p50 {_ms(run.during, 0.5):.1f} ms, p99 {_ms(run.during, 0.99):.1f} ms",
        flush=True,
    )
    return run


def beside_claims(
    claimer: Claimer, during: list[float], step: Any, failure: str
) -> tuple[Any, float, int]:
    """Run ``step(now, report)`` (a step of the ``table-retention`` job) while a thread
    claims from the sending campaign (each claim's time into ``during``); its report, its
    seconds and the WAL it wrote. A problem in the report ends the benchmark."""
    from portal.jobreport import JobReport
    from portal.seams import current_portal

    engine = claimer.engine
    with engine.connect() as conn:
        wal_start = conn.execute(sa.text("SELECT pg_current_wal_lsn()")).scalar()
    stop = threading.Event()
    beside = threading.Thread(target=claims_beside, args=(claimer, stop, during))
    beside.start()
    started = time.perf_counter()
    try:
        report = JobReport("table-retention")
        step(current_portal(claimer.app).clock.now(), report)
    finally:
        seconds = time.perf_counter() - started
        stop.set()
        beside.join()
    if report.problems:
        raise SystemExit(f"{failure}: {report.problems}")
    with engine.connect() as conn:
        wal_bytes = int(
            conn.execute(
                sa.text("SELECT pg_current_wal_lsn() - CAST(:s AS pg_lsn)"), {"s": str(wal_start)}
            ).scalar_one()
        )
    return report, seconds, wal_bytes


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


@dataclass
class FoldRun:
    """One campaign folded by the job's step while claims run beside it."""

    label: str
    pause_ms: float
    folded: int = 0
    seconds: float = 0.0
    wal_bytes: int = 0
    batches: Batches = field(default_factory=Batches)
    during: list[float] = field(default_factory=list)

    def rate(self, which: int) -> float:
        rows, seconds = self.batches.tenth(which)
        return rows / seconds


def fold_beside(app: Any, settings: Any, claimer: Claimer, run: FoldRun) -> FoldRun:
    """Fold every campaign due (the job's own step, ``fold_deliveries``) while a thread
    claims from the sending campaign; the WAL it wrote."""
    from portal.retention.tables import fold_deliveries

    report, run.seconds, run.wal_bytes = beside_claims(
        claimer,
        run.during,
        lambda now, report: fold_deliveries(app, now, settings, run.batches, report),
        "the fold stopped",
    )
    run.folded = report.changed
    print(
        f"  fold ({run.label}): {run.folded:,} deliveries in {run.seconds:.1f} s "
        f"({run.folded / run.seconds:,.0f} /s), {len(run.batches.seconds)} batches; claims "
        f"beside p50 {_ms(run.during, 0.5):.1f} ms, p99 {_ms(run.during, 0.99):.1f} ms",
        flush=True,
    )
    return run


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
    from portal.config import RetentionSettings
    from portal.db import db
    from portal.delivery.models import Delivery
    from portal.seams import current_portal

    default_pause = RetentionSettings().fold_pause_seconds
    admin = _psycopg(normalise_database_url(args.admin_url))
    url = _url_for(args.admin_url, args.database)
    load_before = os.getloadavg()
    started = time.perf_counter()
    with psycopg.connect(admin, autocommit=True) as server:
        server.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
        server.execute(f'CREATE DATABASE "{args.database}"')
    engine = create_engine(url)
    runs: list[FoldRun] = []
    try:
        upgrade(engine)
        print(f"populating {args.database}", flush=True)
        population = populate(engine, args.sending, 2, args.finished_size, month_ids=False)
        third, third_month = old_month_campaign(engine, args.finished_size)
        with engine.begin() as conn:
            first, second = conn.execute(
                sa.text(
                    "SELECT id FROM campaign WHERE status = 'completed' AND id <> :third "
                    "ORDER BY finished_at, id"
                ),
                {"third": third},
            ).scalars()
            conn.execute(
                sa.text(
                    "UPDATE campaign SET finished_at = now() - interval '14 months', "
                    "send_at = now() - interval '14 months' "
                    "WHERE status = 'completed' AND id <> :third"
                ),
                {"third": third},
            )
            # Only campaign 1 is due for the first fold; campaign 2 for the second.
            conn.execute(
                sa.text("UPDATE campaign SET finished_at = now() WHERE id = :c"), {"c": second}
            )
            postgres = conn.execute(sa.text("SHOW server_version")).scalar_one()
        receipts = add_receipts(engine, [first, second, third])
        print(f"  {population.rows:,} deliveries, {receipts:,} receipts", flush=True)

        with tempfile.TemporaryDirectory() as instance:
            claimer = Claimer(url, instance)
            app = claimer.app
            base = current_portal(app).settings

            def with_pause(seconds: float) -> Any:
                retention = RetentionSettings(batch_size=args.batch, fold_pause_seconds=seconds)
                return base.with_overrides(retention=retention)

            def figures_of(campaign_id: uuid.UUID) -> tuple[object, object]:
                with db.begin(app) as session:
                    campaign = session.get(Campaign, campaign_id)
                    assert campaign is not None
                    now = current_portal(app).clock.now()
                    return (
                        outcome.read(session, campaign, now=now).facts.counts,
                        funnel.read(session, campaign, now=now).buckets,
                    )

            try:
                claimer.claim()  # warm-up
                idle: list[float] = []
                for _ in range(25):
                    seconds, ids = claimer.claim()
                    idle.append(seconds)
                    answer(claimer.engine, ids)
                    time.sleep(CLAIM_EVERY)

                before = figures_of(first)
                runs.append(fold_beside(app, with_pause(0.0), claimer, FoldRun("no pause", 0)))
                if figures_of(first) != before:
                    raise SystemExit("the folded campaign's figures changed")

                # What a partition drop would save, on campaign 2 (not folded yet).
                with db.begin(app) as session:
                    of_second = Delivery.__table__.c.campaign_id == second
                    read_started = time.perf_counter()
                    session.execute(tally.groups(of_second)).all()
                    session.execute(funnel.minute_rows(session, of_second)).all()
                    read_seconds = time.perf_counter() - read_started
                # Where a batch's time goes: each step of tally.fold, timed on batches
                # of campaign 2 in transactions rolled back.
                steps: dict[str, list[float]] = {}
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
                            "UPDATE campaign SET finished_at = now() - interval '14 months' "
                            "WHERE id = :c"
                        ),
                        {"c": second},
                    )
                    conn.execute(sa.text("VACUUM (ANALYZE) delivery"))

                before = figures_of(second)
                label = f"the default pause, {default_pause * 1000:.0f} ms"
                runs.append(
                    fold_beside(
                        app,
                        with_pause(default_pause),
                        claimer,
                        FoldRun(label, default_pause * 1000),
                    )
                )
                if figures_of(second) != before:
                    raise SystemExit("the folded campaign's figures changed")

                before = figures_of(third)
                drop = drop_beside(app, with_pause(default_pause), claimer)
                if figures_of(third) != before:
                    raise SystemExit("the dropped month's campaign's figures changed")
                with engine.connect() as conn:
                    left, tally_rows, funnel_rows = conn.execute(
                        sa.text(
                            "SELECT (SELECT count(*) FROM delivery WHERE status <> 'queued' "
                            "AND campaign_id <> :s) + (SELECT count(*) FROM pg_class "
                            "WHERE relname = :month), (SELECT count(*) FROM delivery_tally), "
                            "(SELECT count(*) FROM funnel_tally)"
                        ),
                        {"s": population.sending, "month": third_month},
                    ).one()
                if left:
                    raise SystemExit(f"{left} deliveries of the finished campaigns are left")
            finally:
                claimer.engine.dispose()
    finally:
        engine.dispose()
        with psycopg.connect(admin, autocommit=True) as server:
            server.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
    load_after = os.getloadavg()
    seconds = time.perf_counter() - started

    found: list[Figure] = []
    for run in runs:
        found.append(
            Figure(
                f"fold of a finished campaign of {run.folded:,} deliveries ({run.label}): "
                "rows/s, last tenth vs first tenth",
                round(run.rate(1)),
                "rows/s",
                round(run.rate(0)),
                "first tenth of the same fold",
                round(run.rate(1) / run.rate(0), 2),
                "≥ 0.9×",
                run.rate(1) / run.rate(0) >= 0.9,
            )
        )
        found.append(
            Figure(
                f"claim (500 rows) p99 while a fold runs ({run.label}) vs idle",
                round(_ms(run.during, 0.99), 1),
                "ms",
                round(_ms(idle, 0.99), 1),
                "idle, same run",
                round(_ms(run.during, 0.99) / _ms(idle, 0.99), 2),
            )
        )
    unpaused = runs[0]
    found += [
        Figure(
            f"reading a campaign's counters in one statement ({args.finished_size:,} rows, "
            "what any layout must read to fold it) vs the whole fold (no pause)",
            round(read_seconds, 2),
            "s",
            round(unpaused.seconds, 2),
            "the fold with its deletes",
            round(read_seconds / unpaused.seconds, 3),
        ),
        Figure(
            f"partition drop of a month with a finished campaign of {drop.dropped:,} "
            "deliveries (counted into its counters, receipts deleted, dropped) vs the "
            "whole row-by-row fold of as many (no pause)",
            round(drop.seconds, 2),
            "s",
            round(unpaused.seconds, 2),
            "the row-by-row fold, same run",
            round(drop.seconds / unpaused.seconds, 3),
        ),
        Figure(
            "WAL written by the partition drop vs by the row-by-row fold (no pause)",
            round(drop.wal_bytes / 2**20, 1),
            "MiB",
            round(unpaused.wal_bytes / 2**20, 1),
            "the row-by-row fold, same run",
            round(drop.wal_bytes / unpaused.wal_bytes, 3),
        ),
        Figure(
            "claim (500 rows) p99 while the partition drop runs vs idle",
            round(_ms(drop.during, 0.99), 1),
            "ms",
            round(_ms(idle, 0.99), 1),
            "idle, same run",
            round(_ms(drop.during, 0.99) / _ms(idle, 0.99), 2),
        ),
    ]
    header = "| | " + " | ".join(run.label for run in runs) + " |"
    rule = "|---|" + "---:|" * len(runs)

    def row(name: str, cell: Any) -> str:
        return f"| {name} | " + " | ".join(cell(run) for run in runs) + " |"

    table = "\n".join(
        [
            header,
            rule,
            row("deliveries folded", lambda r: f"{r.folded:,}"),
            row(f"batches of {args.batch:,}", lambda r: f"{len(r.batches.seconds):,}"),
            row("fold, whole", lambda r: f"{r.seconds:.1f} s ({r.folded / r.seconds:,.0f} rows/s)"),
            row("first tenth", lambda r: f"{r.rate(0):,.0f} rows/s"),
            row("last tenth", lambda r: f"{r.rate(1):,.0f} rows/s"),
            row(
                "batch interval, median / max (the pause included)",
                lambda r: (
                    f"{statistics.median(r.batches.seconds) * 1000:.1f} / "
                    f"{max(r.batches.seconds) * 1000:.1f} ms"
                ),
            ),
            row("WAL written", lambda r: f"{r.wal_bytes / 2**20:,.0f} MiB"),
            row(
                "claims beside it: p50 / p99 (n)",
                lambda r: (
                    f"{_ms(r.during, 0.5):.1f} / {_ms(r.during, 0.99):.1f} ms ({len(r.during)})"
                ),
            ),
        ]
    )
    other = "\n".join(
        [
            "| | value |",
            "|---|---:|",
            f"| claims idle: p50 / p99 (n={len(idle)}) | {_ms(idle, 0.5):.1f} / "
            f"{_ms(idle, 0.99):.1f} ms |",
            f"| counter rows after both folds, compacted (delivery_tally, funnel_tally) | "
            f"{tally_rows:,}, {funnel_rows:,} |",
            f"| campaign 2: its counters read in one statement | {read_seconds:.2f} s |",
            f"| campaign 3: its month's partition counted and dropped ({drop.dropped:,} "
            f"deliveries) | {drop.seconds:.1f} s, {drop.wal_bytes / 2**20:,.1f} MiB of WAL |",
            f"| claims beside the drop: p50 / p99 (n) | {_ms(drop.during, 0.5):.1f} / "
            f"{_ms(drop.during, 0.99):.1f} ms ({len(drop.during)}) |",
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
    for text in (table, other, breakdown):
        print()
        print(text)
    details = [
        f"PostgreSQL {postgres}. {population.rows + args.finished_size:,} deliveries: two "
        f"campaigns of {args.finished_size:,} finished 14 months ago with random ids (in "
        "`delivery_default`: the row-by-row fold's case), one of as many made and finished "
        f"14 months ago with a UUIDv7 id (alone in `{third_month}`), all answered (97 % "
        f"accepted, the rest failed, revoked or skipped), with {receipts:,} display receipts, "
        f"and one sending campaign of {args.sending:,}, made by SQL. Campaigns 1 and 2 "
        "folded by `fold_deliveries` (the `table-retention` job's step, batches of "
        f"{args.batch:,}) while a thread claimed 500 rows from the sending campaign every "
        f"{CLAIM_EVERY * 1000:.0f} ms: campaign 1 with no pause between batches, campaign 2 "
        f"with the default `DELIVERY_FOLD_PAUSE_MS` ({default_pause * 1000:.0f}); then "
        "campaign 3's month by `delivery_partitions` (the job's partition step: counted into "
        "the counters set-wise, receipts deleted, partition dropped, one transaction) with "
        "the same claims beside it. Each campaign's outcome counts and funnel buckets were "
        "compared before and after (equal). Load average "
        f"{' / '.join(f'{v:.2f}' for v in load_before)} before, "
        f"{' / '.join(f'{v:.2f}' for v in load_after)} after ({seconds:.0f} s).",
        table,
        other,
        "Where one batch's time goes (each statement of `tally.fold` on batches of campaign "
        "2 before its fold, timed in transactions rolled back; the counters' own inserts "
        "are a few rows):",
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
