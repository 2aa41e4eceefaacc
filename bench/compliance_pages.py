"""The compliance officer's pages at scale: a person's deliveries, the dashboard's weeks.

    .venv/bin/python bench/compliance_pages.py [--campaigns 10] [--campaign-size 1000000]
                                               [--events 6000000] [--repeat 5]
                                               [--admin-url URL] [--database NAME] [--keep]

This creates its own database on the server --admin-url names, migrates it, fills
``delivery`` with --campaigns finished campaigns of --campaign-size (``bench/claims.py``'s
``populate``, set-based SQL) and ``consent_event`` with --events preference changes spread
evenly over the dashboard chart's twelve weeks, then times, in one run:

- **a person's history, their deliveries** (``GET /staff/compliance/subscribers/<id>``):
  before, the statement as ``portal.compliance.services._deliveries`` sent it until this
  benchmark's commit (one OR of the person's consent events and their devices, kept here
  as the baseline); after, ``_deliveries`` as it is (a union of two indexed reads). The
  person has a delivery in every campaign, two of them allowed by their own events; both
  sides must list the same deliveries.
- **the dashboard's chart** (``GET /staff/compliance/``): before, the twelve weeks
  counted at each view (``_count_weeks`` over all of them, the statement the chart sent
  until this benchmark's commit); after, ``weekly_decisions`` as it is: its first view
  counts the eleven past weeks once and keeps them, later views count the current week
  alone. Both sides must give the same figures.

Each timing is the median of --repeat calls after one untimed call (the first view of the
chart is timed on its own).

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
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402

from bench.claims import add_database_arguments, own_database, populate  # noqa: E402
from bench.consent_log import _app  # noqa: E402
from bench.contract import Figure, add_arguments, median_time, write  # noqa: E402

# The person whose history is opened: the subscription populate sends every campaign to
# as recipient number PERSON (``md5('sub-' || i)::uuid``).
PERSON = 4242
EVENTS_CHUNK = 1_000_000
MINUTES_IN_CHART = 12 * 7 * 24 * 60
TARGET_HISTORY_SECONDS = 0.05
TARGET_CHART_RATIO = 2.0  # a later view at most half the twelve weeks' count


def _old_deliveries(
    session: Any, subscriber_id: uuid.UUID, subscription_ids: Sequence[uuid.UUID]
) -> list[Any]:
    """The person's deliveries as ``_deliveries`` read them before this benchmark's
    commit: one OR of their consent events and their devices."""
    from portal.campaigns.models import Campaign
    from portal.compliance.services import DELIVERY_LIMIT, DeliveryRow
    from portal.consent.models import ConsentEvent, Topic
    from portal.delivery.models import Delivery

    d, c = Delivery.__table__, Campaign.__table__
    t = Topic.__table__
    own_events = sa.select(ConsentEvent.seq).where(ConsentEvent.subscriber_id == subscriber_id)
    matches = [d.c.consent_event_seq.in_(own_events)]
    if subscription_ids:
        matches.append(d.c.subscription_id.in_(list(subscription_ids)))
    rows = session.execute(
        sa.select(
            d.c.id,
            d.c.campaign_id,
            c.c.title.label("campaign_title"),
            t.c.slug.label("topic_slug"),
            d.c.subscription_id,
            d.c.status,
            d.c.consent_reason,
            d.c.consent_event_seq,
            d.c.attempts,
            d.c.updated_at,
        )
        .select_from(d.join(c, c.c.id == d.c.campaign_id).join(t, t.c.id == c.c.topic_id))
        .where(sa.or_(*matches))
        .order_by(d.c.id.desc())
        .limit(DELIVERY_LIMIT)
    ).all()
    return [DeliveryRow(**row._mapping) for row in rows]


def _events(engine: sa.Engine, events: int, person: uuid.UUID) -> None:
    """``events`` preference changes over the chart's twelve weeks, then the person's own
    two, each allowing one of their deliveries."""
    with engine.begin() as conn:
        for slug in ("security-alerts", "order-updates", "offers"):
            conn.execute(
                sa.text(
                    "INSERT INTO topic (slug, category, label, created_at) "
                    "VALUES (:slug, 'News', :slug, now())"
                ),
                {"slug": slug},
            )
        topics = list(conn.execute(sa.text("SELECT id FROM topic ORDER BY id")).scalars())
    for lo in range(0, events, EVENTS_CHUNK):
        hi = min(lo + EVENTS_CHUNK, events) - 1
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO consent_event (subscriber_id, topic_id, kind, previous_state, "
                    "new_state, source, decided_at, recorded_at, actor, context) "
                    "SELECT md5('person-' || (i % 1000000))::uuid, "
                    "(CAST(:topics AS int[]))[1 + i % cardinality(CAST(:topics AS int[]))], "
                    "'preference_changed', 'unset', "
                    "CASE WHEN i % 3 = 0 THEN 'opt_out' ELSE 'opt_in' END, "
                    "'preference-centre', at, at, 'subscriber', '{}' "
                    "FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) AS i, "
                    "LATERAL (SELECT now() - (i % :minutes) * interval '1 minute' AS at) AS t"
                ),
                {"topics": topics, "lo": lo, "hi": hi, "minutes": MINUTES_IN_CHART},
            )
        print(f"  events: {hi + 1:,} of {events:,}", flush=True)
    with engine.begin() as conn:
        seqs = list(
            conn.execute(
                sa.text(
                    "INSERT INTO consent_event (subscriber_id, topic_id, kind, previous_state, "
                    "new_state, source, decided_at, recorded_at, actor, context) "
                    "SELECT :person, :topic, 'preference_changed', 'unset', 'opt_in', "
                    "'preference-centre', now(), now(), 'subscriber', '{}' "
                    "FROM generate_series(1, 2) RETURNING seq"
                ),
                {"person": person, "topic": topics[0]},
            ).scalars()
        )
        firsts = list(
            conn.execute(
                sa.text(
                    "SELECT min(id) FROM delivery WHERE subscription_id = :s "
                    "GROUP BY campaign_id ORDER BY 1 LIMIT 2"
                ),
                {"s": _subscription()},
            ).scalars()
        )
        for seq, delivery_id in zip(seqs, firsts, strict=True):
            conn.execute(
                sa.text("UPDATE delivery SET consent_event_seq = :seq WHERE id = :id"),
                {"seq": seq, "id": delivery_id},
            )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM (ANALYZE) consent_event"))
        conn.execute(sa.text("ANALYZE delivery"))


def _subscription() -> uuid.UUID:
    import hashlib

    return uuid.UUID(hashlib.md5(f"sub-{PERSON}".encode()).hexdigest())


def _in_request(app: Any, work: Callable[[Any], Any]) -> Callable[[], Any]:
    from portal.db import db

    def run() -> Any:
        with app.test_request_context("/staff/compliance/"):
            answer = work(db.session)
            db.session.commit()
            return answer

    return run


def _figures_of(weeks: list[Any]) -> Counter[tuple[int, dt.date, str]]:
    counts: Counter[tuple[int, dt.date, str]] = Counter()
    for item in weeks:
        for week in item.weeks:
            counts[(item.topic.id, week.week, "opt_in")] += week.opt_in
            counts[(item.topic.id, week.week, "opt_out")] += week.opt_out
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--campaigns", type=int, default=10)
    parser.add_argument("--campaign-size", type=int, default=1_000_000)
    parser.add_argument("--events", type=int, default=6_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    add_database_arguments(parser, "portal_bench_compliance_pages")
    add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.campaigns = min(args.campaigns, 2)
        args.campaign_size = min(args.campaign_size, 50_000)
        args.events = min(args.events, 100_000)

    from portal.compliance import services

    load_before = os.getloadavg()
    started = time.perf_counter()
    person = uuid.uuid5(uuid.NAMESPACE_URL, "bench-person")
    with own_database(args) as (url, engine):
        print(f"populating {args.database}")
        population = populate(engine, 1_000, args.campaigns, args.campaign_size)
        _events(engine, args.events, person)
        with engine.connect() as conn:
            deliveries = conn.execute(sa.text("SELECT count(*) FROM delivery")).scalar_one()
            events = conn.execute(sa.text("SELECT count(*) FROM consent_event")).scalar_one()
            postgres = conn.execute(sa.text("SHOW server_version")).scalar_one()
        engine.dispose()
        with tempfile.TemporaryDirectory() as instance:
            app = _app(url, instance)
            subscriptions = [_subscription()]
            old_history, old_rows = median_time(
                _in_request(app, lambda s: _old_deliveries(s, person, subscriptions)),
                args.repeat,
            )
            new_history, new_rows = median_time(
                _in_request(app, lambda s: services._deliveries(s, person, subscriptions)),
                args.repeat,
            )
            now = dt.datetime.now(dt.UTC)
            first = services.first_week(now)
            end = first + dt.timedelta(weeks=services.WEEKS)
            old_chart, old_counts = median_time(
                _in_request(app, lambda s: services._count_weeks(s, first, end)), args.repeat
            )
            first_view = time.perf_counter()
            first_weeks = _in_request(app, lambda s: services.weekly_decisions(s, now))()
            first_view = time.perf_counter() - first_view
            new_chart, new_weeks = median_time(
                _in_request(app, lambda s: services.weekly_decisions(s, now)), args.repeat
            )
            app.extensions["portal.db"].engine.dispose()
    load_after = os.getloadavg()
    seconds = time.perf_counter() - started

    if [r.id for r in old_rows] != [r.id for r in new_rows] or len(new_rows) != args.campaigns:
        raise SystemExit(f"the two histories differ: {len(old_rows)} and {len(new_rows)} rows")
    allowed = sum(1 for r in new_rows if r.consent_event_seq is not None)
    expected = Counter(
        {
            (topic, week, state): n
            for (week, topic, state), n in old_counts.items()
            if first <= week < end
        }
    )
    for weeks in (first_weeks, new_weeks):
        got = +_figures_of(weeks)
        if got != +expected:
            raise SystemExit("the chart's figures differ from the twelve weeks counted")
    charted = sum(expected.values())

    lines = [
        f"PostgreSQL {postgres}; {deliveries:,} deliveries ({args.campaigns} finished "
        f"campaigns of {args.campaign_size:,} and one of {population.size:,} sending, made by "
        f"SQL: `bench/claims.py`'s `populate`); {events:,} consent events, {charted:,} of "
        f"them opt-ins and opt-outs in the chart's twelve weeks. Each figure the median of "
        f"{args.repeat} calls after one untimed call; load average {load_before[0]:.2f} "
        f"before, {load_after[0]:.2f} after ({seconds:.0f} s in all).",
        "",
        "| page | before, seconds | after, seconds |",
        "|---|---:|---:|",
        f"| a person's history: their {len(new_rows)} deliveries ({allowed} allowed by their "
        f"own consent events) among {deliveries:,} | {old_history:.4f} | {new_history:.4f} |",
        f"| the dashboard's chart: {charted:,} decisions in twelve weeks, first view "
        f"(eleven past weeks counted and kept) | {old_chart:.3f} | {first_view:.3f} |",
        f"| the dashboard's chart, a later view (the current week counted) | {old_chart:.3f} "
        f"| {new_chart:.3f} |",
        "",
        "Checked: both histories list the same deliveries in the same order; the chart's "
        "figures, at its first view and at a later one, are the twelve weeks' counts.",
    ]
    details = "\n".join(lines)
    print(details)
    figures = [
        Figure(
            figure=f"a person's history, their deliveries among {deliveries:,}",
            value=new_history,
            unit="s",
            baseline=old_history,
            baseline_name="one OR of their events and devices",
            ratio=old_history / new_history if new_history else None,
            target=f"≤ {TARGET_HISTORY_SECONDS} s",
            passed=new_history <= TARGET_HISTORY_SECONDS,
        ),
        Figure(
            figure=f"the compliance dashboard's chart, a later view, {charted:,} decisions "
            "in twelve weeks",
            value=new_chart,
            unit="s",
            baseline=old_chart,
            baseline_name="the twelve weeks counted at each view",
            ratio=old_chart / new_chart if new_chart else None,
            target=f"≥ {TARGET_CHART_RATIO}× faster",
            passed=new_chart * TARGET_CHART_RATIO <= old_chart,
        ),
    ]
    write(
        args.json,
        benchmark="compliance_pages",
        title="The compliance officer's pages at scale",
        figures=figures,
        details_markdown=details,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
