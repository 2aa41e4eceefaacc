"""Consent-log appends from 8 concurrent writers on PostgreSQL: the Merkle-tree log (no
global lock; the sequencer integrating as it goes) against the old single-lock hash chain
(kept here as the baseline: an advisory lock held to COMMIT, the head read, the event
chained), in one run, on fresh databases. The tree's log is verified afterwards.

    .venv/bin/python bench/consent_log.py [--seconds 8] [--writers 8] [--json PATH]

Each writer is a process of its own (as web processes are), committing one transaction
after another, each appending ``--per-commit`` events for one subscriber (1: a single
choice saved; 4: a form of four topics). Reported: events/s over the whole run, and the
first and last tenth of the run.

On a machine of few CPUs the Python writers are bound by their own CPU (the ORM, the
driver, building each event) before the database is: a second part measures the log itself,
the same statements sent by ``pgbench`` (C, 8 clients, no Python): the tree's append
(``SELECT … FOR UPDATE`` of the subscriber, ``INSERT … RETURNING seq``), and the
chain's (the advisory lock held to COMMIT, the head read, the event chained onto it with
``sha256()`` in SQL; its canonical bytes are not the Python ones, so the baseline's chain
is checked for linkage only). The tree's log is integrated and verified afterwards.
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.contract import Figure, add_arguments, first_row, write  # noqa: E402

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"


def _database(prefix: str) -> tuple[str, str]:
    name = f"bench_consent_log_{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name, f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


def _drop(name: str) -> None:
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _app(url: str, instance: str) -> Any:
    from portal import create_app
    from portal.config import Settings

    environ = {
        "DATABASE_URL": url,
        "PORTAL_SCHEDULER": "off",
        "PORTAL_DEMO_DATA": "off",
        # --prepared-statements, for both sides (the writers are spawned with it set).
        "DATABASE_PREPARED_STATEMENTS": os.environ.get("DATABASE_PREPARED_STATEMENTS", "off"),
    }
    return create_app(Settings.from_env(environ, instance))


def _prepare(url: str, instance: str, people: int) -> list[uuid.UUID]:
    from portal.db import db, uuid7
    from portal.migrate import upgrade
    from portal.subscriptions.models import Subscriber

    app = _app(url, instance)
    upgrade(app.extensions["portal.db"].engine)
    ids = [uuid7() for _ in range(people)]
    with db.begin(app) as session:
        now = dt.datetime.now(dt.UTC)
        session.add_all([Subscriber(id=i, created_at=now) for i in ids])
    app.extensions["portal.db"].engine.dispose()
    return ids


def _old_append(session: Any, events: list[Any]) -> None:
    """The append before the tree (commit 0b820a8's ``append_many``): the chain's advisory
    lock, the head read, each event hashed onto the chain."""
    import sqlalchemy as sa

    from portal.consent import log

    session.execute(sa.select(sa.func.pg_advisory_xact_lock(0x636F6E73656E74)))
    t = log._t
    last = session.execute(
        sa.select(t.c.seq, t.c.hash).order_by(t.c.seq.desc()).limit(1)
    ).one_or_none()
    seq, prev = (last.seq, bytes(last.hash)) if last else (0, log.GENESIS)
    rows = []
    for event in events:
        seq += 1
        fields = log.event_fields(
            seq=seq,
            subscriber_id=event.subscriber_id,
            subscription_id=None,
            topic_id=None,
            kind=event.kind.value,
            previous_state=None,
            new_state=None,
            source=event.source,
            policy_version=None,
            decided_at=event.recorded_at,
            recorded_at=event.recorded_at,
            actor=event.actor,
            context="{}",
        )
        digest = log.chain_hash(prev, fields)
        rows.append(
            {
                **fields,
                "subscriber_id": event.subscriber_id,
                "decided_at": event.recorded_at,
                "recorded_at": event.recorded_at,
                "prev_hash": prev,
                "hash": digest,
            }
        )
        prev = digest
    session.execute(sa.insert(t), rows)


def _writer(args: tuple[str, str, str, list[uuid.UUID], int, Any, float, Any]) -> None:
    url, instance, mode, people, per_commit, start_at, seconds, out = args
    from portal.consent import log
    from portal.consent.models import EventKind
    from portal.db import db

    app = _app(url, instance)
    with app.extensions["portal.db"].engine.connect():
        pass  # connected before the start
    stamps: list[float] = []
    ready, go = start_at  # (Barrier-like pair of events from the parent)
    ready.put(os.getpid())
    go.wait()
    begin = time.time()
    end = begin + seconds
    turn = 0
    while time.time() < end:
        who = people[turn % len(people)]
        turn += 1
        now = dt.datetime.now(dt.UTC)
        events = [
            log.NewEvent(
                kind=EventKind.ACCOUNT_LINKED,
                subscriber_id=who,
                source="system",
                actor="bench",
                recorded_at=now,
            )
            for _ in range(per_commit)
        ]
        with db.begin(app) as session:
            if mode == "tree":
                log.lock_subscriber(session, who)
                log.append_many(session, events)
            else:
                _old_append(session, events)
        stamps.append(time.time())
    out.put([(stamp - begin, per_commit) for stamp in stamps])
    app.extensions["portal.db"].engine.dispose()


def _sequencer(args: tuple[str, str, float]) -> None:
    url, instance, stop_at = args
    from portal.consent.jobs import sequence_once

    app = _app(url, instance)
    while time.time() < stop_at:
        sequence_once(app)
        time.sleep(0.2)
    app.extensions["portal.db"].engine.dispose()


def _run(mode: str, writers: int, per_commit: int, seconds: float) -> dict[str, Any]:
    name, url = _database(f"{mode}{per_commit}")
    instance = f"/tmp/{name}"
    try:
        people = _prepare(url, instance, writers * 50)
        spawn = multiprocessing.get_context("spawn")
        queue = spawn.Queue()
        ready = spawn.Queue()
        go = spawn.Event()  # set once every process has imported and connected
        procs = [
            spawn.Process(
                target=_writer,
                args=(
                    (
                        url,
                        instance,
                        mode,
                        people[i::writers],
                        per_commit,
                        (ready, go),
                        seconds,
                        queue,
                    ),
                ),
            )
            for i in range(writers)
        ]
        for proc in procs:
            proc.start()
        for _ in procs:
            ready.get(timeout=600)
        sequencer = None
        if mode == "tree":  # integrating as it goes, as in production
            stop_at = time.time() + seconds
            sequencer = spawn.Process(target=_sequencer, args=((url, instance, stop_at),))
            sequencer.start()
        go.set()
        stamps: list[tuple[float, int]] = []
        for _ in procs:
            stamps.extend(queue.get(timeout=seconds + 120))
        for proc in procs:
            proc.join()
        if sequencer is not None:
            sequencer.join()
        total = sum(n for _, n in stamps)
        tenth = seconds / 10
        first = sum(n for s, n in stamps if s < tenth) / tenth
        last = sum(n for s, n in stamps if s >= seconds - tenth) / tenth
        result: dict[str, Any] = {
            "events": total,
            "rate": total / seconds,
            "first_tenth": first,
            "last_tenth": last,
        }
        if mode == "tree":
            result.update(_verify(url, instance))
        else:
            result.update(_verify_chain(url))
        return result
    finally:
        _drop(name)


def _verify(url: str, instance: str) -> dict[str, Any]:
    from portal.consent import tree
    from portal.consent.jobs import sequence_once
    from portal.seams import current_portal

    app = _app(url, instance)
    started = time.perf_counter()
    while sequence_once(app).leaves:
        pass
    catch_up = time.perf_counter() - started
    key = tree.signing_key(current_portal(app).settings.consent_log_signing_key).public_key()
    started = time.perf_counter()
    with app.extensions["portal.db"].engine.connect() as conn:
        report = tree.verify_log(conn, log_keys=[key])
    seconds = time.perf_counter() - started
    app.extensions["portal.db"].engine.dispose()
    return {
        "verified": report.ok and report.pending == 0,
        "problem": str(report.problem) if report.problem else None,
        "tree_size": report.head.tree_size if report.head else 0,
        "catch_up_seconds": catch_up,
        "verify_seconds": seconds,
    }


def _verify_chain(url: str) -> dict[str, Any]:
    """The baseline's chain, checked by the chain rule alone."""
    import sqlalchemy as sa

    from portal.consent import log

    engine = sa.create_engine(url)
    prev, ok = log.GENESIS, True
    with engine.connect() as conn:
        for row in conn.execute(sa.select(log._t).order_by(log._t.c.seq)):
            if bytes(row.prev_hash) != prev or log.chain_hash(prev, log.row_fields(row)) != bytes(
                row.hash
            ):
                ok = False
                break
            prev = bytes(row.hash)
    engine.dispose()
    return {"verified": ok}


PGBENCH_PEOPLE = 400


def _person_sql() -> str:
    """Subscriber number :n as a UUID, in SQL (the people _pgbench_people made)."""
    return "('00000000-0000-7000-8000-' || lpad(:n::text, 12, '0'))::uuid"


def _pgbench_people(url: str) -> None:
    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO subscriber (id, created_at) SELECT "
            "('00000000-0000-7000-8000-' || lpad(n::text, 12, '0'))::uuid, now() "
            f"FROM generate_series(1, {PGBENCH_PEOPLE}) AS n"
        )


def _pgbench_script(mode: str, per_commit: int) -> str:
    person = _person_sql()
    lines = [f"\\set n random(1, {PGBENCH_PEOPLE})", "BEGIN;"]
    if mode == "tree":
        lines.append(f"SELECT id FROM subscriber WHERE id = {person} FOR UPDATE;")
        values = ", ".join(
            f"({person}, 'account_linked', 'system', now(), now(), 'bench', '{{}}')"
            for _ in range(per_commit)
        )
        lines.append(
            "INSERT INTO consent_event (subscriber_id, kind, source, decided_at, recorded_at, "
            f"actor, context) VALUES {values} RETURNING seq;"
        )
    else:
        lines.append(f"SELECT pg_advisory_xact_lock({0x636F6E73656E74});")  # _old_append's
        chained = (
            "WITH head AS (SELECT seq, hash FROM consent_event ORDER BY seq DESC LIMIT 1), "
            "prev AS (SELECT coalesce((SELECT seq FROM head), 0) AS seq, "
            "coalesce((SELECT hash FROM head), '\\x" + "00" * 32 + "'::bytea) AS hash) "
            "INSERT INTO consent_event (seq, subscriber_id, kind, source, decided_at, "
            "recorded_at, actor, context, prev_hash, hash) "
            f"SELECT prev.seq + 1, {person}, 'account_linked', 'system', now(), now(), "
            "'bench', '{}', prev.hash, sha256(prev.hash || convert_to(json_build_object("
            f"'seq', prev.seq + 1, 'subscriber_id', {person}, 'recorded_at', now())::text, "
            "'UTF8')) FROM prev;"
        )
        lines.extend([chained] * per_commit)
    lines.append("END;")
    return "\n".join(lines) + "\n"


def _pgbench(mode: str, writers: int, per_commit: int, seconds: float) -> dict[str, Any]:
    import re
    import subprocess
    import tempfile

    name, url = _database(f"pgb{mode}{per_commit}")
    instance = f"/tmp/{name}"
    try:
        _prepare(url, instance, 0)
        _pgbench_people(url)
        with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as handle:
            handle.write(_pgbench_script(mode, per_commit))
        sequencer = None
        if mode == "tree":
            spawn = multiprocessing.get_context("spawn")
            sequencer = spawn.Process(
                target=_sequencer, args=((url, instance, time.time() + seconds),)
            )
            sequencer.start()
        done = subprocess.run(
            [
                "pgbench",
                "-n",
                "-M",
                "extended",
                "-c",
                str(writers),
                "-j",
                "2",
                "-T",
                str(int(seconds)),
                "-f",
                handle.name,
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                name,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        Path(handle.name).unlink()
        if sequencer is not None:
            sequencer.join()
        if done.returncode != 0:
            raise RuntimeError(f"pgbench failed: {done.stderr[-2000:]}")
        tps = float(re.search(r"tps = ([0-9.]+)", done.stdout).group(1))  # type: ignore[union-attr]
        result: dict[str, Any] = {"rate": tps * per_commit, "tps": tps}
        if mode == "tree":
            result.update(_verify(url, instance))
        else:
            result.update(_chain_linked(url))
        return result
    finally:
        _drop(name)


def _chain_linked(url: str) -> dict[str, Any]:
    """The SQL baseline's chain: every event's prev_hash is the previous event's hash."""
    with psycopg.connect(url.replace("+psycopg", "")) as conn:
        broken = first_row(
            conn.execute(
                "SELECT count(*) FROM (SELECT prev_hash, lag(hash) OVER (ORDER BY seq) AS "
                "before, seq FROM consent_event) AS t "
                "WHERE seq > 1 AND prev_hash IS DISTINCT FROM before"
            )
        )[0]
        size = first_row(conn.execute("SELECT count(*) FROM consent_event"))[0]
    return {"verified": broken == 0, "tree_size": size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument(
        "--prepared-statements",
        choices=("on", "off"),
        default="off",
        help="DATABASE_PREPARED_STATEMENTS for both logs' writers (on: a direct connection)",
    )
    args = parser.parse_args()
    os.environ["DATABASE_PREPARED_STATEMENTS"] = args.prepared_statements
    seconds = 2.0 if args.quick else args.seconds
    load = os.getloadavg()
    runs = {}
    for per_commit in (1, 4):
        for mode in ("chain", "tree"):
            runs[mode, per_commit] = _run(mode, args.writers, per_commit, seconds)
            print(mode, per_commit, runs[mode, per_commit], flush=True)
    database_side = {}
    for per_commit in (1, 4):
        for mode in ("chain", "tree"):
            database_side[mode, per_commit] = _pgbench(mode, args.writers, per_commit, seconds)
            print("pgbench", mode, per_commit, database_side[mode, per_commit], flush=True)
    load_after = os.getloadavg()
    figures = []
    lines = [  # under the report's own heading for this benchmark (bench/__main__.py)
        f"{args.writers} writer processes, {seconds:g} s each run, fresh databases, "
        f"DATABASE_PREPARED_STATEMENTS={args.prepared_statements} for both logs; load "
        f"average {load[0]:.1f} before, {load_after[0]:.1f} after (2 CPUs, shared).",
        "",
        "| events per commit | log | events/s | first tenth | last tenth | verified |",
        "|---|---|---|---|---|---|",
    ]
    for per_commit in (1, 4):
        chain, merkle_run = runs["chain", per_commit], runs["tree", per_commit]
        ratio = merkle_run["rate"] / chain["rate"] if chain["rate"] else None
        figures.append(
            Figure(
                f"consent-log appends, {args.writers} writers, {per_commit} event(s) per commit, "
                f"prepared statements {args.prepared_statements}",
                round(merkle_run["rate"], 1),
                "events/s",
                baseline=round(chain["rate"], 1),
                baseline_name="single-lock hash chain",
                ratio=round(ratio, 2) if ratio else None,
                target="≥ 5,000 events/s and ≥ 3×",
                passed=bool(merkle_run["rate"] >= 5000 and (ratio or 0) >= 3),
            )
        )
        for label, run in (("hash chain, one lock", chain), ("Merkle tree", merkle_run)):
            lines.append(
                f"| {per_commit} | {label} | {run['rate']:.0f} | {run['first_tenth']:.0f} | "
                f"{run['last_tenth']:.0f} | {run['verified']} |"
            )
        lines.append("")
    lines += [
        "",
        f"The log itself: the same statements from {args.writers} `pgbench` clients (no Python "
        "writers), fresh databases:",
        "",
        "| events per commit | log | events/s | transactions/s | verified |",
        "|---|---|---|---|---|",
    ]
    for per_commit in (1, 4):
        chain, merkle_run = database_side["chain", per_commit], database_side["tree", per_commit]
        ratio = merkle_run["rate"] / chain["rate"] if chain["rate"] else None
        figures.append(
            Figure(
                f"consent-log appends, {args.writers} pgbench writers (the database side), "
                f"{per_commit} event(s) per commit",
                round(merkle_run["rate"], 1),
                "events/s",
                baseline=round(chain["rate"], 1),
                baseline_name="single-lock hash chain, same statements",
                ratio=round(ratio, 2) if ratio else None,
                target="≥ 5,000 events/s and ≥ 3×",
                passed=bool(merkle_run["rate"] >= 5000 and (ratio or 0) >= 3),
            )
        )
        for label, run in (("hash chain, one lock", chain), ("Merkle tree", merkle_run)):
            lines.append(
                f"| {per_commit} | {label} | {run['rate']:.0f} | {run['tps']:.0f} | "
                f"{run['verified']} |"
            )
    lines.append("")
    for per_commit in (1, 4):
        run = runs["tree", per_commit]
        lines.append(
            f"Tree, {per_commit}/commit: {run['tree_size']} leaves; the sequencer caught up "
            f"in {run['catch_up_seconds']:.2f} s after the writers stopped, `verify_log` "
            f"took {run['verify_seconds']:.2f} s ({run['problem'] or 'no problem'})."
        )
    details = "\n".join(lines)
    print(details)
    write(
        args.json,
        benchmark="consent_log",
        title="Consent log appends",
        figures=figures,
        details_markdown=details,
    )


if __name__ == "__main__":
    main()
