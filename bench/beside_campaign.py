"""Dispatch beside the pages (SPEC §7): page requests while a campaign sends through the
same gunicorn workers.

> Keep both p99s within 2× idle … with the campaign still sending at ≥ 1,000 msg/s.

One gunicorn with the project's ``gunicorn.conf.py`` (gthread), ``--workers`` processes of
``--threads`` threads, in production mode with the embedded scheduler on (every worker
ticks the dispatch job, as production's web processes do unless sending is handed to
``portal scheduler`` processes) and every subscription on the fake push service
(``tests/fakepush.py``, a process of its own, not decrypting). For each request kind —
``GET /preferences``, the preference centre's form saved, ``POST /api/push/subscribe`` —
``wrk`` drives it for ``--duration`` seconds idle, then a campaign to
``--campaign-topic`` is launched, and once it is sending in earnest (5,000 answered) the
same load runs again while it sends. The campaign's answers per second over that window
are counted from its deliveries; each kind's campaign is then left to finish before the
next kind starts. All of it runs twice, each time on a new gunicorn: with the web
workers' sender at its share of a CPU (``DISPATCH_WEB_CPU_SHARE``, the default unless
``--env`` sets it), then at ``--contrast-share`` (1: unpaced) for contrast. The data are
``bench/pages.py``'s (``bench/audience.py``), with ``--subscribers`` chosen so the
campaign reaches more than 100,000 people. ``--dedicated N`` adds a third pass: the web
workers' scheduler off and N ``portal scheduler`` processes (at ``--nice``) sending
beside them, as production may hand sending over.

    .venv/bin/python bench/beside_campaign.py           # the default share, then unpaced
    .venv/bin/python bench/beside_campaign.py --env DISPATCH_WEB_CPU_SHARE=0.3 --contrast-share ""
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
from flask import Flask

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.audience import TOPICS, create_database, database_urls, drop_database, populate  # noqa: E402
from bench.contract import Figure, add_arguments, first_row, write  # noqa: E402
from bench.pages import (  # noqa: E402
    Result,
    Subscribes,
    answered,
    browser_keys,
    campaign_counts,
    credential,
    extra_environment,
    gunicorn,
    launch_campaign,
    measure,
    outside_environ,
    portal_environ,
    retarget,
    server_arguments,
    subscriber_ids,
    wait_finished,
    wait_for_jobs,
    warm_up,
)
from portal.config import Settings  # noqa: E402
from portal.identity import preference_link_token  # noqa: E402

# Each of these idle, then while a campaign sends through the same workers.
BESIDE = ("preferences-get", "preferences-post", "subscribe")
# While a campaign sends, a request's p99 stays within this multiple of idle (SPEC §7) ...
BESIDE_P99_TARGET = 2.0
# ... and the campaign still sends at least this fast.
BESIDE_MSG_TARGET = 1000.0


@contextlib.contextmanager
def dedicated_senders(
    environ: dict[str, str], count: int, niceness: int, log: Path
) -> Iterator[None]:
    """``count`` ``flask portal scheduler`` processes beside the web workers (whose own
    scheduler is off), each at ``niceness``: the kernel then gives the pages' workers
    the CPU first and the senders what is left."""
    flask = str(Path(sys.executable).parent / "flask")
    processes = []
    with log.open("ab") as errors:
        for _ in range(count):
            processes.append(
                subprocess.Popen(
                    ["nice", "-n", str(niceness), flask, "--app", "app", "portal", "scheduler"],
                    cwd=ROOT,
                    env=outside_environ() | environ,
                    stdout=subprocess.DEVNULL,
                    stderr=errors,
                    start_new_session=True,
                )
            )
    try:
        yield
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def beside_campaign(
    args: argparse.Namespace,
    environ: dict[str, str],
    pg_url: str,
    folder: Path,
    signer: Flask,
    *,
    dedicated: int = 0,
) -> tuple[list[Result], list[str]]:
    """On one gunicorn whose workers run the scheduler (as production's web processes
    may), or with ``dedicated`` ``portal scheduler`` processes sending beside workers
    that do not: each of ``BESIDE`` idle, then while a campaign to ``--campaign-topic``
    sends, with the campaign's answers per second over the window. Each request kind
    has a campaign of its own, sending before its window opens and left to finish
    after it."""
    from tests.fakepush import FakePushProcess

    results: list[Result] = []
    notes: list[str] = []
    with FakePushProcess(decrypt=False, record=False) as push:
        retarget(pg_url, push.endpoint_base, environ["SUBSCRIPTION_AUTH_KEY_V1"])
        sending = environ | {
            "PORTAL_SCHEDULER": "off" if dedicated else "on",
            # Each subscribe from an address of its own (X-Forwarded-For), as from real
            # browsers: from one address every request updates one rate-limit counter
            # row, and the requests queue on its lock.
            "TRUSTED_PROXIES": "1",
            "PUSH_ALLOWED_HOSTS": push.origin.removeprefix("https://"),
            "PUSH_CA_BUNDLE": push.ca_bundle,
        }
        senders = (
            dedicated_senders(sending, dedicated, args.nice, folder / "gunicorn.log")
            if dedicated
            else contextlib.nullcontext()
        )
        with (
            senders,
            gunicorn(
                "app:app",
                sending,
                workers=args.workers,
                threads=args.threads,
                health="/healthz",
                log=folder / "gunicorn.log",
            ) as base,
        ):
            creds = [
                credential(base, preference_link_token(s, signer))
                for s in subscriber_ids(pg_url, max(2 * args.connections, 2))
            ]
            # The subscribe API's new endpoints on the fake push service too (they join the
            # next kind's campaign and are sent to like the rest), each request from an
            # address of its own.
            subscribes = Subscribes(browser_keys(64), push.endpoint_base, spread_addresses=True)
            notes.append(wait_for_jobs(pg_url))
            time.sleep(2 * 5)  # and two dispatch ticks
            for kind in args.kinds:
                idle = measure(base, kind, args, creds, subscribes)
                idle.phase = "idle"
                started = time.monotonic()
                campaign_id = launch_campaign(pg_url, args.campaign_topic, f"Beside {kind}")
                # Sending in earnest (materialised, past its first batches) before the
                # window opens.
                while True:
                    status, counts = campaign_counts(pg_url, campaign_id)
                    if answered(counts) >= 5_000 or status not in ("scheduled", "sending"):
                        break
                    time.sleep(0.5)
                warm_up(base, kind, args, creds, subscribes)
                _, before = campaign_counts(pg_url, campaign_id)
                opened = time.monotonic()
                during = measure(base, kind, args, creds, subscribes, warm=False)
                status, after = campaign_counts(pg_url, campaign_id)
                window = time.monotonic() - opened
                during.phase = "sending"
                during.msg_per_s = (answered(after) - answered(before)) / window
                if status != "sending":
                    # Finished inside the window: its rate covers part of it only.
                    during.note = f"the campaign was {status} by the window's end"
                    during.msg_per_s = None
                elif not after.get("queued"):
                    # Still sending, but nothing waiting in the queue at the end (all of it
                    # claimed, or the rest not materialised yet): the rate may understate.
                    during.note = "nothing was queued at the window's end"
                rate = "-" if during.msg_per_s is None else f"{during.msg_per_s:,.0f}"
                print(f"    campaign: {rate} msg/s in the window {during.note}", flush=True)
                note = wait_finished(pg_url, campaign_id, started, 1800)
                print(f"    {note}", flush=True)
                notes.append(f"{kind}'s campaign: {note}")
                results += [idle, during]
                time.sleep(2 * 5)  # two dispatch ticks: idle again before the next kind
    return results, notes


def beside_pairs(results: list[Result]) -> list[tuple[Result, Result]]:
    """beside-campaign's (idle, sending) pairs, one per request kind."""
    return [
        (idle, during)
        for idle, during in zip(results[::2], results[1::2], strict=True)
        if idle.scenario == during.scenario
    ]


def beside_table(results: list[Result]) -> str:
    lines = [
        "| web workers' sender | request | phase | requests | req/s | p50 ms | p99 ms | errors "
        "| p99 vs idle | campaign msg/s in the window |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for idle, during in beside_pairs(results):
        for r in (idle, during):
            ratio = f"{r.p99_ms / idle.p99_ms:.2f}×" if r is during and idle.p99_ms else ""
            rate = "" if r.msg_per_s is None else f"{r.msg_per_s:,.0f}"
            if r is during and r.note:
                rate = f"{rate} ({r.note})" if rate else r.note
            lines.append(
                f"| {r.sender} | {r.scenario} | {r.phase} | {r.requests:,} | {r.rps:,.1f} "
                f"| {r.p50_ms:.1f} | {r.p99_ms:.1f} | {r.errors} | {ratio} | {rate} |"
            )
    return "\n".join(lines)


def beside_figures(results: list[Result], *, contrast: bool = False) -> list[Figure]:
    """The figures with their targets; a contrast run's without (shown, not judged)."""
    found = []
    for idle, during in beside_pairs(results):
        ratio = during.p99_ms / idle.p99_ms if idle.p99_ms else None
        fast = during.msg_per_s is not None and during.msg_per_s >= BESIDE_MSG_TARGET
        found.append(
            Figure(
                f"{during.scenario} while a campaign sends through the same workers "
                f"(sender {during.sender}): p99 ({during.rps:,.0f} req/s against "
                f"{idle.rps:,.0f} idle; {during.errors} errors)",
                round(during.p99_ms, 1),
                "ms",
                round(idle.p99_ms, 1),
                "the same workers idle, just before",
                None if ratio is None else round(ratio, 3),
                "" if contrast else f"≤ {BESIDE_P99_TARGET:g}×",
                None
                if contrast
                else ratio is not None and ratio <= BESIDE_P99_TARGET and during.errors == 0,
            )
        )
        found.append(
            Figure(
                f"{during.scenario} (sender {during.sender}): the campaign's answers per "
                "second in that window",
                0.0 if during.msg_per_s is None else round(during.msg_per_s, 1),
                "msg/s",
                target="" if contrast else f"≥ {BESIDE_MSG_TARGET:,.0f} msg/s",
                passed=None if contrast else fast,
            )
        )
    return found


def main() -> int:
    cpus = os.cpu_count() or 1
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    server_arguments(parser, duration=30)
    # security-alerts reaches 87 % of bench/audience.py's subscribers: 116,000 give a
    # campaign of just over 100,000.
    parser.add_argument("--subscribers", type=int, default=116_000)
    parser.add_argument("--campaign-topic", default="security-alerts")
    parser.add_argument(
        "--contrast-share",
        default="1",
        help="then all again on a new gunicorn with DISPATCH_WEB_CPU_SHARE set to this "
        "(1: the sender unpaced, as before the share); empty to skip",
    )
    parser.add_argument(
        "--kinds",
        default=",".join(BESIDE),
        type=lambda v: [k for k in v.split(",") if k],
        help=f"which request kinds, of {','.join(BESIDE)}",
    )
    parser.add_argument(
        "--dedicated",
        type=int,
        default=0,
        metavar="N",
        help="then all again with the web workers' scheduler off and N `portal scheduler` "
        "processes sending beside them, at --nice",
    )
    parser.add_argument("--nice", type=int, default=10, help="the dedicated senders' niceness")
    parser.add_argument("--keep", action="store_true", help="leave the database in place")
    add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.connections = min(args.connections, 10)
        args.duration, args.warmup = min(args.duration, 5), 1
        args.subscribers = min(args.subscribers, 20_000)
    if not args.kinds or set(args.kinds) - set(BESIDE):
        raise SystemExit(f"--kinds takes some of {','.join(BESIDE)}")
    if shutil.which("wrk") is None:
        raise SystemExit("bench/beside_campaign.py needs wrk: apt-get install wrk (Debian/Ubuntu)")
    extra = extra_environment(args)

    load_before = os.getloadavg()
    name = f"bench_beside_{uuid.uuid4().hex[:10]}"
    pg_url, sa_url = database_urls(args.admin_url, name)
    create_database(args.admin_url, name)
    try:
        populate(sa_url, args.subscribers)
        with psycopg.connect(pg_url) as conn:
            version = first_row(conn.execute("SHOW server_version"))[0].split()[0]
        with tempfile.TemporaryDirectory(prefix="bench-beside-") as folder:
            environ = portal_environ(sa_url, Path(folder) / "instance") | extra
            signer = Flask("bench")
            signer.config["SECRET_KEY"] = environ["SECRET_KEY"]
            default = Settings.__dataclass_fields__["dispatch_web_cpu_share"].default
            share = environ.get("DISPATCH_WEB_CPU_SHARE", f"{default:g} (the default)")
            results, notes = beside_campaign(args, environ, pg_url, Path(folder), signer)
            for r in results:
                r.sender = f"share {share}"
            notes = [f"share {share}: {n}" for n in notes]
            contrast: list[Result] = []
            if args.contrast_share:
                other = environ | {"DISPATCH_WEB_CPU_SHARE": args.contrast_share}
                contrast, more = beside_campaign(args, other, pg_url, Path(folder), signer)
                for r in contrast:
                    r.sender = f"share {args.contrast_share}"
                notes += [f"share {args.contrast_share}: {n}" for n in more]
            if args.dedicated:
                label = f"{args.dedicated} portal scheduler at nice {args.nice}"
                apart, more = beside_campaign(
                    args, environ, pg_url, Path(folder), signer, dedicated=args.dedicated
                )
                for r in apart:
                    r.sender = label
                contrast += apart
                notes += [f"{label}: {n}" for n in more]
            log = Path(folder) / "gunicorn.log"
            problems = log.read_text(errors="replace") if log.exists() else ""
    finally:
        if not args.keep:
            drop_database(args.admin_url, name)
    load_after = os.getloadavg()

    print()
    print(beside_table(results + contrast))
    setup = (
        f"gunicorn `-c gunicorn.conf.py` (gthread), {args.workers} workers × {args.threads} "
        f"threads, production mode, the embedded scheduler on in every worker, its job "
        f"threads at the niceness `DISPATCH_WEB_NICE` sets (10 unless --env sets it) (or, for the "
        f"rows marked `portal scheduler`, off, with {args.dedicated or 'N'} `flask portal "
        f"scheduler` processes at nice {args.nice} sending beside them); wrk "
        f"{args.wrk_threads} threads, {args.connections} keep-alive connections, "
        f"{args.duration} s per window after {args.warmup} s of warm-up; PostgreSQL "
        f"{version}, {args.subscribers:,} subscribers ({len(TOPICS)} topics, "
        f"bench/audience.py's data), every subscription on the fake push service (a process "
        f"of its own, not decrypting). {cpus} CPUs shared by wrk, gunicorn, the fake push "
        f"service and PostgreSQL; load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after. " + " ".join(n[0].upper() + n[1:] + "." for n in notes)
    )
    if extra:
        setup += " Extra environment: " + ", ".join(f"`{k}={v}`" for k, v in extra.items()) + "."
    details = "\n\n".join(
        [
            "> Keep both p99s within 2× idle, with the campaign still sending at ≥ 1,000 "
            "msg/s on this machine. (SPEC §7)",
            setup,
            beside_table(results + contrast),
            "errors: socket errors and timeouts (30 s) plus answers other than the expected "
            "status (200; 303 for the form; 201 for a new subscription). Tracebacks in "
            f"gunicorn's error log: {problems.count('Traceback')}.",
        ]
    )
    print()
    print(details)
    write(
        args.json,
        benchmark="beside_campaign",
        title="Dispatch beside the pages (a campaign sending through the web workers)",
        figures=beside_figures(results) + beside_figures(contrast, contrast=True),
        details_markdown=details,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
