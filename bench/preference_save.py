"""A preference save's own work, in one process on PostgreSQL: ``apply_decisions`` (the
person's row lock, their preferences read under it, one event per change, the changed
rows written, COMMIT) with the rows written by one upsert statement built at import (a
parameter set per changed row) against the unit of work's flush it replaced (kept here as
the baseline: each changed row set on its ORM object and flushed as an UPDATE or
INSERT), in one run, alternating, on one database.

    .venv/bin/python bench/preference_save.py [--saves 2000] [--rounds 3] [--json PATH]

Each save flips two of a person's six topics (200 people in turn), as the preference
centre's form does when two boxes change. Reported: the CPU time of this process per save
(``time.process_time``: the Python side, which bounds saves on a machine of few CPUs;
bench/pages.py measures whole requests under gunicorn) and the wall time per save, for
each round of each side, and the median of the rounds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.contract import Figure, add_arguments, write  # noqa: E402

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
PEOPLE = 200
TOPICS = 6


def _flushed_apply(session: Any, subscriber_id: uuid.UUID, decisions: Any, **kw: Any) -> Any:
    """``apply_decisions`` before the rows were written by one upsert (commit
    b41c3a8): the same lock, read and events, then each changed row set on its ORM object
    and flushed by the unit of work."""
    from portal.consent import log
    from portal.consent.models import EventKind, PreferenceState, TopicPreference
    from portal.consent.preferences import Change, preference_rows

    log.lock_subscriber(session, subscriber_id)
    rows = preference_rows(session, subscriber_id, fresh=True)
    current = {topic_id: row.state for topic_id, row in rows.items()}
    transitions = []
    for decision in decisions:
        previous = current.get(decision.topic.id, PreferenceState.UNSET.value)
        new = decision.state.value
        if previous != new:
            transitions.append((decision, previous, new))
            current[decision.topic.id] = new
    sequence = log.append_many(
        session,
        [
            log.NewEvent(
                kind=EventKind.PREFERENCE_CHANGED,
                subscriber_id=subscriber_id,
                topic_id=decision.topic.id,
                previous_state=previous,
                new_state=new,
                source=kw["source"],
                policy_version=kw["policy_version"],
                decided_at=kw["decided_at"],
                recorded_at=kw["recorded_at"],
                actor="subscriber",
            )
            for decision, previous, new in transitions
        ],
    )
    changes = []
    for (decision, previous, new), seq in zip(transitions, sequence, strict=True):
        row = rows.get(decision.topic.id)
        if row is None:
            row = TopicPreference(subscriber_id=subscriber_id, topic_id=decision.topic.id)
            session.add(row)
            rows[decision.topic.id] = row
        row.state = new
        row.source = kw["source"]
        row.policy_version = kw["policy_version"]
        row.decided_at = kw["decided_at"]
        row.recorded_at = kw["recorded_at"]
        row.event_seq = seq
        changes.append(Change(decision.topic, previous, new, seq))
    session.flush()
    return changes


def _setup(url: str, instance: str) -> tuple[Any, list[uuid.UUID], list[Any]]:
    from portal import create_app
    from portal.config import Settings
    from portal.consent import catalogue
    from portal.db import db, uuid7
    from portal.migrate import upgrade
    from portal.subscriptions.models import Subscriber

    environ = {"DATABASE_URL": url, "PORTAL_SCHEDULER": "off", "PORTAL_DEMO_DATA": "off"}
    app = create_app(Settings.from_env(environ, instance))
    upgrade(app.extensions["portal.db"].engine)
    now = dt.datetime.now(dt.UTC)
    people = [uuid7() for _ in range(PEOPLE)]
    with db.begin(app) as session:
        catalogue.publish_policy(session, version="v1", text="What we send.", now=now)
        for n in range(TOPICS):
            catalogue.add_topic(
                session,
                slug=f"topic-{n}",
                category="news",
                label=f"Topic {n}",
                description="About it.",
                transactional=False,
                default_state="opt_out",
                now=now,
            )
        session.add_all([Subscriber(id=person, created_at=now) for person in people])
    with db.begin(app) as session:
        topics = list(catalogue.active_topics(session))
    return app, people, topics


_turn = itertools.count()  # every save of the run, both sides: each person's topics flip


def _saves(app: Any, people: list[uuid.UUID], topics: list[Any], apply: Callable, n: int) -> int:
    """n saves, each flipping two topics of the next person; returns the changes made."""
    from portal.consent.models import PreferenceState
    from portal.consent.preferences import Decision
    from portal.db import db

    changed = 0
    for _ in range(n):
        turn = next(_turn)
        who = people[turn % len(people)]
        on = (turn // len(people)) % 2 == 0
        state = PreferenceState.OPT_IN if on else PreferenceState.OPT_OUT
        now = dt.datetime.now(dt.UTC)
        with db.begin(app) as session:
            changed += len(
                apply(
                    session,
                    who,
                    [Decision(topics[0], state), Decision(topics[1], state)],
                    source="preference-centre",
                    policy_version="v1",
                    decided_at=now,
                    recorded_at=now,
                )
            )
    return changed


def _consistent(url: str) -> bool:
    """Every stored preference is the last event's new state for its person and topic."""
    with psycopg.connect(url.replace("+psycopg", "")) as conn:
        wrong = conn.execute(
            "SELECT count(*) FROM topic_preference AS p WHERE p.state IS DISTINCT FROM ("
            " SELECT e.new_state FROM consent_event AS e WHERE e.subscriber_id = p.subscriber_id"
            " AND e.topic_id = p.topic_id ORDER BY e.seq DESC LIMIT 1)"
            " OR p.event_seq <> (SELECT max(e.seq) FROM consent_event AS e"
            " WHERE e.subscriber_id = p.subscriber_id AND e.topic_id = p.topic_id)"
        ).fetchone()
    return wrong is not None and wrong[0] == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    parser.add_argument("--admin-url", default=ADMIN_URL)
    parser.add_argument("--saves", type=int, default=2000, help="saves per round and side")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    saves, rounds = (200, 1) if args.quick else (args.saves, args.rounds)
    from portal.consent.preferences import apply_decisions

    name = f"bench_preference_save_{uuid.uuid4().hex[:8]}"
    base = args.admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    with psycopg.connect(args.admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"{base}/{name}"
    try:
        app, people, topics = _setup(url, f"/tmp/{name}")
        sides: dict[str, Callable] = {"upsert": apply_decisions, "flush": _flushed_apply}
        for apply in sides.values():  # warm both: statements cached, plans prepared
            _saves(app, people, topics, apply, PEOPLE * 2)
        cpu: dict[str, list[float]] = {side: [] for side in sides}
        wall: dict[str, list[float]] = {side: [] for side in sides}
        load = os.getloadavg()
        for _ in range(rounds):
            for side in ("flush", "upsert"):
                cpu0, wall0 = time.process_time(), time.perf_counter()
                changed = _saves(app, people, topics, sides[side], saves)
                cpu[side].append((time.process_time() - cpu0) / saves * 1e6)
                wall[side].append((time.perf_counter() - wall0) / saves * 1e6)
                if changed != 2 * saves:
                    raise SystemExit(f"{side}: {changed} changes in {saves} saves, not two each")
                print(side, f"{cpu[side][-1]:.0f} µs CPU", f"{wall[side][-1]:.0f} µs", flush=True)
        load_after = os.getloadavg()
        consistent = _consistent(url)
        app.extensions["portal.db"].engine.dispose()
    finally:
        with psycopg.connect(args.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    if not consistent:
        raise SystemExit("a stored preference is not its last event's state")
    new, old = statistics.median(cpu["upsert"]), statistics.median(cpu["flush"])
    figures = [
        Figure(
            "a preference save's CPU in this process (two topics changed), rows by one upsert",
            round(new),
            "µs",
            baseline=round(old),
            baseline_name="each row flushed by the unit of work (b41c3a8)",
            ratio=round(new / old, 2),
        ),
        Figure(
            "a preference save's wall time (two topics changed), rows by one upsert",
            round(statistics.median(wall["upsert"])),
            "µs",
            baseline=round(statistics.median(wall["flush"])),
            baseline_name="each row flushed by the unit of work (b41c3a8)",
            ratio=round(statistics.median(wall["upsert"]) / statistics.median(wall["flush"]), 2),
        ),
    ]
    lines = [
        f"{saves:,} saves per round and side, {rounds} rounds alternating (flush first), one "
        f"process, one database; {PEOPLE} people, two of {TOPICS} topics flipped each save; "
        f"load average {load[0]:.1f} before, {load_after[0]:.1f} after (2 CPUs). Every stored "
        f"preference is its last event's state afterwards: {consistent}.",
        "",
        "| round | CPU per save, flush | CPU per save, upsert | wall, flush | wall, upsert |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n in range(rounds):
        lines.append(
            f"| {n + 1} | {cpu['flush'][n]:.0f} µs | {cpu['upsert'][n]:.0f} µs | "
            f"{wall['flush'][n]:.0f} µs | {wall['upsert'][n]:.0f} µs |"
        )
    details = "\n".join(lines)
    print(details)
    write(
        args.json,
        benchmark="preference_save",
        title="Preference save (apply_decisions in one process)",
        figures=figures,
        details_markdown=details,
    )


if __name__ == "__main__":
    main()
