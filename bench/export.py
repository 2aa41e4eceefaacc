"""Benchmark: the consent-history export against PostgreSQL's own COPY (SPEC §6).

Run by hand, not by the test suite, on a machine with PostgreSQL (a database server
the ``postgres`` role can create databases on)::

    .venv/bin/python bench/export.py                     # 1,000,000 events
    .venv/bin/python bench/export.py --events 200000 --runs 1

In one run it creates a database of its own, migrates it, inserts the events with one
set-based ``INSERT … SELECT`` (their hashes are random-looking bytes: the chain is not
valid, which does not matter here — the export copies hashes, it does not check them, and
the table only refuses UPDATE and DELETE) and runs the sequencer until they are all in the
log's tree (an export is cut at its signed head), then measures, alternately:

(a) the export as a compliance officer gets it: gunicorn (one worker) serving the app, a
    signed-in staff session, ``POST /staff/compliance/export`` for the whole period as
    CSV, the .zip stream read to the end with requests;
(b) ``psql -c "COPY (the same SELECT) TO STDOUT WITH (FORMAT csv)" > /dev/null``.

It prints both times, their ratio (target ≤ 3×) and the peak resident memory of the
gunicorn worker (target < 200 MB), writes them under "Export (consent history)" in
docs/BENCHMARKS.md (other sections are kept), and drops its database.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.contract import Figure, add_arguments, first_row, write  # noqa: E402
from portal.config import Settings, normalise_database_url  # noqa: E402
from portal.seams import current_portal  # noqa: E402

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
EMAIL, PASSWORD = "bench-officer@example.test", "a long bench passphrase"
SECTION = "## Export (consent history)"
START = dt.date(2026, 1, 1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def create_database(admin_url: str) -> tuple[str, str]:
    name = f"bench_export_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name, admin_url.rsplit("/", 1)[0] + "/" + name


def drop_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def seed(url: str, events: int, instance: Path) -> None:
    """Topics, a policy, a compliance officer and ``events`` consent events."""
    from portal import create_app
    from portal.consent import catalogue
    from portal.db import db
    from portal.migrate import upgrade
    from portal.staff import services
    from portal.staff.models import Role

    environ = {"DATABASE_URL": url, "PORTAL_SCHEDULER": "off", "PORTAL_DEMO_DATA": "off"}
    settings = Settings.from_env(environ, str(instance))
    app = create_app(settings)
    upgrade(app.extensions["portal.db"].engine)
    now = dt.datetime.combine(START, dt.time(), tzinfo=dt.UTC)
    with db.begin(app) as session:
        catalogue.publish_policy(session, version="v1", text="We send what you choose.", now=now)
        topic_ids = [
            catalogue.add_topic(session, slug=slug, category="News", label=slug.title(), now=now).id
            for slug in ("alerts", "digest", "offers", "events")
        ]
        services.create_staff(
            session,
            email=EMAIL,
            password=PASSWORD,
            roles=[Role.COMPLIANCE],
            actor=None,
            passwords=current_portal(app).passwords,
            now=current_portal(app).clock.now(),
            via="bench",
            must_replace_password=False,
        )
    started = time.perf_counter()
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        # One statement, computed by the server: 7 seconds between events, so a million
        # events span about 81 days. Hashes: SHA-256 of the row number (not a chain).
        conn.execute(
            """
            INSERT INTO consent_event (
                seq, subscriber_id, subscription_id, topic_id, kind, previous_state,
                new_state, source, policy_version, decided_at, recorded_at, actor,
                context, prev_hash, hash)
            SELECT g,
                   md5('subscriber' || (g %% 200000))::uuid,
                   CASE WHEN g %% 5 = 0 THEN NULL ELSE md5('device' || (g %% 250000))::uuid END,
                   (%(topics)s::int[])[1 + g %% 4],
                   'preference_changed',
                   CASE WHEN g %% 2 = 0 THEN 'unset' ELSE 'opt_out' END,
                   CASE WHEN g %% 3 = 0 THEN 'opt_out' ELSE 'opt_in' END,
                   'preference-centre',
                   'v1',
                   %(start)s::timestamptz + g * interval '7 seconds' - interval '2 seconds',
                   %(start)s::timestamptz + g * interval '7 seconds',
                   'subscriber',
                   '{"client":"Firefox 128","screen":"preference-centre"}',
                   sha256(('prev' || g)::bytea),
                   sha256(('hash' || g)::bytea)
            FROM generate_series(1, %(events)s) AS g
            """,
            {"topics": topic_ids, "start": now, "events": events},
        )
        conn.commit()
    with psycopg.connect(
        url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True
    ) as conn:
        conn.execute("VACUUM (ANALYZE) consent_event")
    print(f"inserted {events:,} events in {time.perf_counter() - started:.1f} s", flush=True)
    # Into the log's tree, as the sequencer would have them: an export is cut at the
    # tree's signed head, and the measured export should not be the one catching it up.
    from portal.consent.jobs import sequence_once

    started = time.perf_counter()
    while sequence_once(app).leaves:
        pass
    print(f"integrated them into the tree in {time.perf_counter() - started:.1f} s", flush=True)
    app.extensions["portal.db"].engine.dispose()


def last_day(events: int) -> dt.date:
    return (dt.datetime.combine(START, dt.time()) + dt.timedelta(seconds=7 * events)).date()


class Server:
    """gunicorn serving the app from this checkout, one worker (as a small deployment)."""

    def __init__(self, url: str, instance: Path) -> None:
        self.port = free_port()
        environ = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PORTAL_", "DATABASE_URL", "SECRET_KEY", "PROMETHEUS_"))
        }
        environ.update(
            DATABASE_URL=url,
            PORTAL_INSTANCE_PATH=str(instance),
            PORTAL_SCHEDULER="off",
            PORTAL_AUTO_MIGRATE="off",
            PORTAL_DEMO_DATA="off",
            PORTAL_BIND=f"127.0.0.1:{self.port}",
            WEB_CONCURRENCY="1",
            PORTAL_THREADS="2",
        )
        self.process = subprocess.Popen(
            [str(Path(sys.executable).parent / "gunicorn"), "-c", "gunicorn.conf.py", "app:app"],
            cwd=ROOT,
            env=environ,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(requests.ConnectionError, requests.Timeout):
                if requests.get(self.base + "/healthz", timeout=2).ok:
                    return
            time.sleep(0.3)
        raise RuntimeError("gunicorn did not start")

    def worker_pid(self) -> int:
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return int(children.read_text().split()[0])

    def memory(self) -> tuple[int, int]:
        """(resident now, peak resident) of the worker, in kB."""
        status = Path(f"/proc/{self.worker_pid()}/status").read_text()
        now = int(_field(r"VmRSS:\s+(\d+)", status))
        peak = int(_field(r"VmHWM:\s+(\d+)", status))
        return now, peak

    def reset_peak(self) -> None:
        Path(f"/proc/{self.worker_pid()}/clear_refs").write_text("5")

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def _field(pattern: str, text: str) -> str:
    """The first group of ``pattern`` in ``text``, which must be there."""
    found = re.search(pattern, text)
    if found is None:
        raise SystemExit(f"not found: {pattern}")
    return found.group(1)


def _token(html: str) -> str:
    return _field(r'name="csrf_token"(?: type="hidden")? value="([^"]+)"', html)


def sign_in(base: str) -> requests.Session:
    session = requests.Session()
    page = session.get(base + "/staff/login")
    answer = session.post(
        base + "/staff/login",
        data={"csrf_token": _token(page.text), "email": EMAIL, "password": PASSWORD},
        allow_redirects=False,
    )
    assert answer.status_code == 303, answer.status_code
    return session


def http_export(
    base: str, session: requests.Session, start: dt.date, end: dt.date
) -> tuple[float, int]:
    form = session.get(base + "/staff/compliance/export")
    began = time.perf_counter()
    response = session.post(
        base + "/staff/compliance/export",
        data={
            "csrf_token": _token(form.text),
            "date_from": start.isoformat(),
            "date_to": end.isoformat(),
            "data_format": "csv",
            "topic": "",
            "subscriber": "",
        },
        stream=True,
    )
    assert response.status_code == 200, response.status_code
    size = 0
    for chunk in response.iter_content(chunk_size=1 << 20):
        size += len(chunk)
    return time.perf_counter() - began, size


def copy_sql(url: str, start: dt.date, end: dt.date) -> str:
    """The export's own SELECT (every cell formatted and neutralised), as one COPY."""
    from portal.compliance.export import ExportFilter, copy_statement, plan_export
    from portal.db import create_engine

    engine = create_engine(url)
    with engine.connect() as conn:
        plan = plan_export(conn, ExportFilter(start, end))
    statement = copy_statement(engine, plan, after=plan.after_seq, through=plan.last_seq)
    engine.dispose()
    return statement


def psql_copy(url: str, statement: str) -> float:
    began = time.perf_counter()
    with Path(os.devnull).open("wb") as sink:
        subprocess.run(
            ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", statement],
            stdout=sink,
            check=True,
        )
    return time.perf_counter() - began


def write_section(figures: str) -> Path:
    path = ROOT / "docs" / "BENCHMARKS.md"
    path.parent.mkdir(exist_ok=True)
    intro = "# Benchmarks\n\nMeasured by the scripts in `bench/`; each writes its own section.\n"
    text = path.read_text() if path.exists() else intro
    section = f"{SECTION}\n\n{figures.strip()}\n"
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text).rstrip() + "\n"
    else:
        text = text.rstrip() + "\n\n" + section
    path.write_text(text)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--admin-url", default=ADMIN_URL)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only")
    add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.events, args.runs = min(args.events, 20_000), 1

    name, raw_url = create_database(args.admin_url)
    url = normalise_database_url(raw_url)
    server = None
    try:
        with tempfile.TemporaryDirectory(prefix="bench-export-") as folder:
            instance = Path(folder)
            seed(url, args.events, instance)
            start, end = START, last_day(args.events)
            statement = copy_sql(url, start, end)
            server = Server(url, instance)
            session = sign_in(server.base)
            # Signing in hashes a password with Argon2id (64 MiB): start the peak afresh.
            server.reset_peak()
            rss_before, _ = server.memory()
            http_times, copy_times, size = [], [], 0
            for run in range(args.runs):
                seconds, size = http_export(server.base, session, start, end)
                http_times.append(seconds)
                copy_times.append(psql_copy(raw_url, statement))
                print(
                    f"run {run + 1}: HTTP export {http_times[-1]:.2f} s "
                    f"({size / 1e6:.0f} MB), psql COPY {copy_times[-1]:.2f} s",
                    flush=True,
                )
            rss_after, peak = server.memory()
    finally:
        if server is not None:
            server.stop()
        drop_database(args.admin_url, name)

    http_s, copy_s = statistics.median(http_times), statistics.median(copy_times)
    ratio = http_s / copy_s
    load = os.getloadavg()
    figures = "\n".join(
        [
            f"`bench/export.py`, {dt.datetime.now(dt.UTC):%d %B %Y}: {args.events:,} consent "
            f"events in PostgreSQL {_pg_version(args.admin_url)}, {os.cpu_count()} CPUs, load "
            f"average {load[0]:.1f} when it finished (other work shared the machine). Median "
            f"of {args.runs} alternating runs.",
            "",
            "| measure | result | target |",
            "|---|---|---|",
            "| (a) `POST /staff/compliance/export`, CSV, whole period, gunicorn (1 worker), "
            f".zip read to the end | {http_s:.2f} s ({size / 1e6:.0f} MB) | |",
            '| (b) `psql -c "COPY (same SELECT) TO STDOUT WITH (FORMAT csv)" > /dev/null` '
            f"| {copy_s:.2f} s | |",
            f"| ratio (a) / (b) | {ratio:.2f}× | ≤ 3× |",
            "| gunicorn worker: peak resident memory during the exports (VmHWM, reset after "
            f"sign-in) | {peak / 1024:.0f} MB | < 200 MB |",
            "| gunicorn worker: resident before / after the exports "
            f"| {rss_before / 1024:.0f} MB / {rss_after / 1024:.0f} MB | flat |",
            "",
            "All runs (a): "
            + ", ".join(f"{t:.2f}" for t in http_times)
            + " s; (b): "
            + ", ".join(f"{t:.2f}" for t in copy_times)
            + " s.",
            "",
            "What (a) does that (b) does not: plan the snapshot (count, first and last events,",
            "the cited policy versions) and write its audit row; one `COPY` per keyset batch of",
            "20,000 rows, after the query that finds the batch's last `seq`; SHA-256 and the",
            "zip's CRC-32 over every byte; the policy text and the signed manifest; HTTP through",
            "gunicorn. The events were inserted set-based with placeholder hashes: the chain is",
            "not valid, which the export does not check.",
        ]
    )
    print(figures)
    ok = ratio <= 3 and peak / 1024 < 200
    write(
        args.json,
        benchmark="export",
        title="Export (consent history)",
        figures=[
            Figure(
                f"CSV export over HTTP, {args.events:,} events",
                round(http_s, 3),
                "s",
                round(copy_s, 3),
                "psql COPY … TO STDOUT",
                round(ratio, 3),
                "≤ 3×",
                ratio <= 3,
            ),
            Figure(
                "gunicorn worker peak resident memory during the exports",
                round(peak / 1024, 1),
                "MiB",
                target="< 200 MiB",
                passed=peak / 1024 < 200,
            ),
        ],
        details_markdown=figures,
    )
    # With --json the runner writes docs/BENCHMARKS.md as a whole.
    if not args.no_write and args.json is None:
        print(f"written to {write_section(figures)}")
    sys.exit(0 if ok else 1)


def _pg_version(admin_url: str) -> str:
    with psycopg.connect(admin_url) as conn:
        return first_row(conn.execute("SHOW server_version"))[0].split()[0]


if __name__ == "__main__":
    main()
