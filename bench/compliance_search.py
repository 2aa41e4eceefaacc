"""The compliance look-up by the start of an account ID, among ten million people.

    .venv/bin/python bench/compliance_search.py [--people 10000000] [--repeat 5]
                                                [--admin-url URL] [--database NAME] [--keep]

This creates its own database on the server --admin-url names, migrates it and fills
``subscriber`` by set-based SQL with --people account IDs ``user-`` followed by 16 hex
characters (an md5 of the row's number, so an ID's place in the index has nothing to do
with its place in the table), then times, in one run, the look-up's statements
(``portal.compliance.services.search_subscribers``) for:

- a start that every account ID has (``use``), its first page and its 50th;
- a narrow start (``user-abc``, about one person in 4,096);
- one whole account ID, which the look-up reads both exactly and as a start.

Before: the statements as ``search_subscribers`` sent them until this benchmark's commit
(every match counted, then all of them sorted for the page; kept here as the baseline).
After: ``search_subscribers`` as it is (the exact matches read whole, a start counted up to
``PREFIX_LISTED`` + 1 and each page read in the prefix index's order). Both sides must list
the same people on every page both can show; the broad start's 50th page is the last the
new look-up lists.

Each timing is the median of --repeat calls after one untimed call.

Never run by the test suite: it takes minutes and needs a PostgreSQL server.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402

from bench.claims import add_database_arguments, own_database  # noqa: E402
from bench.compliance_pages import _in_request  # noqa: E402
from bench.consent_log import _app  # noqa: E402
from bench.contract import Figure, add_arguments, median_time, write  # noqa: E402

CHUNK = 1_000_000
BROAD, NARROW = "use", "user-abc"
TARGET_SECONDS = 0.05  # a page of the look-up, however many people a start matches


def _people(engine: sa.Engine, people: int) -> None:
    with engine.begin() as conn:
        for first in range(1, people + 1, CHUNK):
            last = min(people, first + CHUNK - 1)
            conn.execute(
                sa.text(
                    "INSERT INTO subscriber (id, external_user_id, created_at, one_a_day) "
                    "SELECT md5('person-' || i)::uuid, "
                    "'user-' || substr(md5(i::text), 1, 16), "
                    "now() - i * interval '1 second', false "
                    "FROM generate_series(:first, :last) AS i"
                ),
                {"first": first, "last": last},
            )
            print(f"  {last:,} people", flush=True)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE subscriber"))


def _old_search(session: Any, query: str, page: int) -> tuple[int, list[Any]]:
    """The count and the page as ``search_subscribers`` read them before this
    benchmark's commit: every match counted, all of them sorted for the page."""
    from portal.compliance import services
    from portal.subscriptions.models import Subscriber

    terms = services._search_terms(session, query, page)
    text = terms.text
    s = cast(sa.Table, Subscriber.__table__)
    exact: list[sa.ColumnElement[bool]] = [s.c.external_user_id == text]
    if terms.subscriber_id is not None:
        exact.append(s.c.id == terms.subscriber_id)
    if terms.reference is not None:
        exact.append(s.c.reference == terms.reference)
    if terms.erased is not None:
        exact.append(s.c.id == terms.erased)
    matches = list(exact)
    if terms.by_prefix:
        matches.append(
            sa.and_(
                s.c.external_user_id.startswith(text, autoescape=True),
                sa.func.substr(s.c.external_user_id, 1, len(text)) == text,
            )
        )
    where = sa.or_(*matches)
    total = int(
        session.execute(sa.select(sa.func.count()).select_from(s).where(where)).scalar_one()
    )
    rank = sa.case((sa.or_(*exact), 0), else_=1)
    rows = session.execute(
        sa.select(s.c.id, s.c.external_user_id)
        .where(where)
        .order_by(rank, sa.func.coalesce(s.c.external_user_id, ""), s.c.id)
        .limit(services.PAGE_SIZE)
        .offset((page - 1) * services.PAGE_SIZE)
    ).all()
    return total, [row.id for row in rows]


def _new_search(session: Any, query: str, page: int) -> tuple[int, list[Any]]:
    from portal.compliance import services

    found = services.search_subscribers(session, query, page, actor=None)
    return found.total, [row.subscriber_id for row in found.results]


def _ratio(ratio: float) -> str:
    return f"{ratio:.0f}×" if ratio >= 10 else f"{ratio:.2f}×"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--people", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    add_database_arguments(parser, "portal_bench_compliance_search")
    add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.people = min(args.people, 200_000)
        args.repeat = min(args.repeat, 3)

    from portal.compliance import services

    last_page = services.PREFIX_LISTED // services.PAGE_SIZE
    load_before = os.getloadavg()
    started = time.perf_counter()
    with own_database(args) as (url, engine):
        print(f"populating {args.database}")
        _people(engine, args.people)
        with engine.connect() as conn:
            people = conn.execute(sa.text("SELECT count(*) FROM subscriber")).scalar_one()
            whole = conn.execute(
                sa.text("SELECT 'user-' || substr(md5(:i), 1, 16)"), {"i": str(args.people // 2)}
            ).scalar_one()
            narrow = conn.execute(
                sa.text("SELECT count(*) FROM subscriber WHERE external_user_id LIKE :p"),
                {"p": NARROW + "%"},
            ).scalar_one()
            postgres = conn.execute(sa.text("SHOW server_version")).scalar_one()
        engine.dispose()
        cases = [
            (f"“{BROAD}”, page 1: all {people:,} start with it", BROAD, 1),
            (f"“{BROAD}”, page {last_page}", BROAD, last_page),
            (f"“{NARROW}”, page 1: {narrow:,} start with it", NARROW, 1),
            ("one whole account ID (exact, and as a start)", whole, 1),
        ]
        timed = []
        with tempfile.TemporaryDirectory() as instance:
            app = _app(url, instance)
            for name, query, page in cases:
                print(f"timing {name}", flush=True)
                old, (old_total, old_ids) = median_time(
                    _in_request(app, partial(_old_search, query=query, page=page)),
                    args.repeat,
                )
                new, (new_total, new_ids) = median_time(
                    _in_request(app, partial(_new_search, query=query, page=page)),
                    args.repeat,
                )
                if old_ids != new_ids:
                    raise SystemExit(f"{name}: the two look-ups list different people")
                listed = min(old_total, services.PREFIX_LISTED)
                if new_total != listed:
                    raise SystemExit(f"{name}: {new_total} found, expected {listed}")
                timed.append((name, old, new, old_total, new_total, len(new_ids)))
            app.extensions["portal.db"].engine.dispose()
    load_after = os.getloadavg()
    seconds = time.perf_counter() - started

    lines = [
        f"PostgreSQL {postgres}; {people:,} people, each with an account ID `user-` and 16 "
        f"hex characters, made by SQL. Each figure the median of {args.repeat} calls of the "
        f"look-up's statements after one untimed call (after also writes the audit event "
        f"the page writes; before does not); load "
        f"average {load_before[0]:.2f} before, {load_after[0]:.2f} after "
        f"({seconds:.0f} s in all).",
        "",
        "| look-up | before, seconds | after, seconds | ratio | found before → after |",
        "|---|---:|---:|---:|---|",
    ]
    for name, old, new, old_total, new_total, rows in timed:
        lines.append(
            f"| {name} | {old:.4f} | {new:.4f} | {_ratio(old / new)} | {old_total:,} → "
            f"{new_total:,}{' (and more)' if new_total < old_total else ''}, {rows} listed |"
        )
    lines += [
        "",
        "Checked: both sides list the same people in the same order on every page timed; "
        f"after, a start that more than {services.PREFIX_LISTED:,} people have is reported "
        "as the first that many, and the page says that more match.",
    ]
    details = "\n".join(lines)
    print(details)
    worst = max(new for _, _, new, *_ in timed)
    broad_old, broad_new = timed[0][1], timed[0][2]
    figures = [
        Figure(
            figure=f"the compliance look-up, an account-ID start all {people:,} people have, "
            "page 1",
            value=broad_new,
            unit="s",
            baseline=broad_old,
            baseline_name="every match counted and sorted",
            ratio=broad_old / broad_new if broad_new else None,
            target=f"≤ {TARGET_SECONDS} s",
            passed=broad_new <= TARGET_SECONDS,
        ),
        Figure(
            figure=f"the compliance look-up, the slowest of its {len(timed)} cases among "
            f"{people:,} people",
            value=worst,
            unit="s",
            target=f"≤ {TARGET_SECONDS} s",
            passed=worst <= TARGET_SECONDS,
        ),
    ]
    write(
        args.json,
        benchmark="compliance_search",
        title="The compliance look-up by the start of an account ID",
        figures=figures,
        details_markdown=details,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
