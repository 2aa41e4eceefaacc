"""Dispatch benchmark (SPEC §7): a 1,000,000-recipient campaign sent to the end, against pywebpush.

    .venv/bin/python bench/dispatch.py                       # 1,000,000 recipients
    .venv/bin/python bench/dispatch.py --audience 100000     # a smaller campaign
    .venv/bin/python bench/dispatch.py --quick               # a smoke run: 2,000
    .venv/bin/python bench/dispatch.py --json results.json   # also machine-readable results

Run by hand, never by the test suite. Every way sends to the same recipients on the fake
push service (tests/fakepush.py) in a child process, over HTTPS on loopback with a
throwaway CA. The service parses every request in full and checks its headers, its VAPID
header, its token (registered) and its body's aes128gcm framing; it decrypts, with the
recipient's private key, a deterministic sample: the first --decrypt-first (100) messages
it accepts, then every --decrypt-every-th (20th). The same sample rule applies to every
way; a sampled message that does not decrypt is refused and so not counted. Decrypting
costs the service as much CPU as encrypting costs a sender, and on a small machine that
CPU is taken from the sender under test; --decrypt-every 1 decrypts everything.

Throughput, in one run on one machine (ratios hold; absolute rates drift with the load):

  (a)  pywebpush.webpush() per recipient with its defaults: a new TLS connection and a
       new VAPID signature every time. Slow, so by default it sends to a sample of
       --baseline-sample recipients and its rate is extrapolated to the audience.
  (b)  pywebpush.webpush(..., requests_session=session) per recipient: one shared
       requests.Session (connections reused), a VAPID signature per message as
       webpush() makes one. It and (b') send to the first --session-sample (20,000)
       recipients, one message at a time, so their rate too does not depend on the
       audience size and is extrapolated to it.
  (b') pywebpush.WebPusher(...).send(..., requests_session=session) per recipient, with
       the VAPID header signed once and reused: the kindest way to run pywebpush. The
       faster of (b) and (b') is the baseline the target is checked against.
  (c)  the portal's engine end to end: a fresh PostgreSQL database (created, migrated
       with the project's migrations, subscriptions inserted set-based), a campaign
       launched through portal.campaigns.services.create_campaign, then the "dispatch"
       job (portal.jobs.run_job → dispatcher_for(app).tick()) run until every delivery
       is accepted. Timed from launch to the last acceptance: materialisation, consent
       re-check, encryption, sending and recording every answer. Afterwards: the service
       took exactly one message for each of the N recipients, every sampled plaintext is
       exactly the campaign's payload for the delivery id it carries (a delivery of this
       campaign to that recipient, none twice), and all N deliveries are accepted.
       The headline (c) runs the engine as --engine-processes processes (default: the
       CPU count), each building the app and running the dispatch job on the same
       launched campaign, as every web worker and scheduler process does in production;
       they are started and idle before the launch. (c1), the engine in this one
       process, follows in the same run on a second campaign to the same recipients,
       with the same checks. Its sender CPU is summed over its processes, and each
       process's share is reported.

The SPEC §7 targets: (c1) ≥ 6× the faster of (b) and (b'); (c) ≥ 30× (a); for (c) and
(c1), the messages per second of the campaign's last tenth ≥ 0.9× its first (tenths cut
from the deliveries' answer times, see tenths()), and sender CPU a message ≤ 2× the CPU a
message of the engine's encryption alone (portal.push.encryption.encrypt over
--encryption-sample recipients' keys, in the same run); (c)'s engine processes read their
peak memory (VmHWM) every few seconds: the peak at the end < 300 MB and within 16 MiB of
the peak when a tenth was sent. Where the CPU goes besides encryption: a third campaign,
sent by this process for --profile-seconds while py-spy samples it from outside, its
samples divided by part (profile_parts()).

requests, and so pywebpush, takes its CA from REQUESTS_CA_BUNDLE before anything else
(a Session's verify= included), and webpush() has no other way in: this script sets
REQUESTS_CA_BUNDLE to the fake service's CA for the pywebpush ways. The engine trusts
only what its settings say (PUSH_CA_BUNDLE, given the same CA file).

Memory, separately (none by default): for each of --memory-sizes (audience sizes) a
child process launches a campaign to that many recipients in a second fresh database and
runs the dispatch job until the campaign completes (or --memory-seconds runs out, which
the output then says), with the fake service not decrypting (it still checks every
request). The child reports its resident memory before the campaign and its peak (VmHWM)
at the end: flat means the peak does not follow the audience size.

Both databases are created on the server behind --admin-url and dropped at the end. A
server with autovacuum off (a CI machine's setting) never vacuums the campaign's updated
deliveries nor analyses their partition: for the run it is turned on, as production has it,
and reset at the end (--autovacuum server leaves it as it is).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import requests  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from pywebpush import Vapid, WebPusher, webpush  # noqa: E402
from sqlalchemy.engine import URL, make_url  # noqa: E402

from bench.contract import Figure, first_row, write  # noqa: E402
from portal import create_app  # noqa: E402
from portal.campaigns.models import Campaign  # noqa: E402
from portal.campaigns.services import CampaignDraft, create_campaign, payload  # noqa: E402
from portal.config import (  # noqa: E402
    Settings,
    b64url_decode,
    generate_vapid_keys,
    normalise_database_url,
)
from portal.db import create_engine, db  # noqa: E402
from portal.delivery.jobs import close_dispatcher  # noqa: E402
from portal.delivery.models import Delivery  # noqa: E402
from portal.jobs import run_job  # noqa: E402
from portal.migrate import upgrade  # noqa: E402
from portal.push.encryption import encrypt  # noqa: E402
from portal.seams import current_portal  # noqa: E402
from portal.subscriptions.models import PushSubscription  # noqa: E402
from portal.subscriptions.sealing import KeyRing  # noqa: E402
from tests.factories import BrowserSubscription, SubscriptionFactory  # noqa: E402
from tests.fakepush import FakePushProcess, token_of  # noqa: E402

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_DATABASE = "portal_bench_dispatch"
SUBJECT = "mailto:bench@example.test"
# SPEC §7: the engine in one process vs pywebpush with a shared Session, the engine in one
# process per CPU vs pywebpush's plain webpush(), the last tenth of a campaign vs its first,
# a sender's CPU per message vs encryption's alone, and peak memory.
TARGET_VS_SESSION = 6.0
TARGET_VS_WEBPUSH = 30.0
TARGET_TENTHS = 0.9
TARGET_CPU_VS_ENCRYPTION = 2.0
TARGET_PEAK_MB = 300.0
FLAT_SLACK_MB = 16.0
KEY_POOL = 1000  # distinct browser keys shared round-robin by the memory runs' recipients
CHUNK = 100_000
IDLE_PAUSE = 0.02  # seconds an engine process with nothing to claim waits
RSS_EVERY = 2.0  # seconds between an engine process's readings of its peak memory
DRAFT = CampaignDraft(
    topic="security-alerts",
    title="New sign-in to your account",
    body="Someone signed in from a new device. If that was not you, change your password.",
    url="/account/security",
)
TTL = DRAFT.ttl

# Keys the subscriptions are made from: one row per distinct browser key pair.
KEYS_TABLE = """
CREATE SCHEMA IF NOT EXISTS bench;
CREATE TABLE bench.keys (k integer PRIMARY KEY, token text, p256dh text NOT NULL,
                         auth_sealed bytea NOT NULL)
"""

# Subscriber i and its one active subscription, made from key row (i - 1) % keys; the
# endpoint is the key row's token on the fake service, or a token of its own when the
# keys are shared. Version 7 layout UUIDs in insertion order, as the portal makes them.
SUBSCRIBERS = """
INSERT INTO subscriber (id, region_code, locale, created_at)
SELECT (lpad(to_hex(:ms + i), 12, '0') || '7' || substr(md5('s' || i), 1, 3) || '8'
        || substr(md5('s' || i), 4, 15))::uuid, 'US', 'en-US', :now
FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) AS i
"""
SUBSCRIPTIONS = """
INSERT INTO push_subscription (
    id, endpoint, endpoint_hash, push_service, p256dh, auth_sealed, auth_key_version,
    subscriber_id, origin, state, created_at, last_seen_at, grant_event_seq)
SELECT (lpad(to_hex(:ms + i), 12, '0') || '7' || substr(md5('p' || i), 1, 3) || '8'
        || substr(md5('p' || i), 4, 15))::uuid,
       endpoint, sha256(convert_to(endpoint, 'UTF8')), 'other', p256dh, auth_sealed, 1,
       (lpad(to_hex(:ms + i), 12, '0') || '7' || substr(md5('s' || i), 1, 3) || '8'
        || substr(md5('s' || i), 4, 15))::uuid,
       'https://shop.example.com', 'active', :now, :now, i
FROM (SELECT i, k.p256dh, k.auth_sealed,
             :base || coalesce(k.token, 'r' || i || '-' || md5('e' || i)) AS endpoint
      FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) AS i
      JOIN bench.keys AS k ON k.k = (i - 1) % :keys) AS g
"""
# Explicit opt-ins of the first :n subscribers to a marketing topic (opt_out by default).
OPT_INS = """
INSERT INTO topic_preference (subscriber_id, topic_id, state, source, policy_version,
                              decided_at, recorded_at, event_seq)
SELECT (lpad(to_hex(:ms + i), 12, '0') || '7' || substr(md5('s' || i), 1, 3) || '8'
        || substr(md5('s' || i), 4, 15))::uuid,
       :topic_id, 'opt_in', 'preference-centre', 'v1', :now, :now, :seq_base + i
FROM generate_series(1, CAST(:n AS bigint)) AS i
"""


# -- databases -------------------------------------------------------------------------


def database_urls(admin_url: str, name: str) -> tuple[str, str]:
    """(libpq URL, SQLAlchemy URL for the portal) of database ``name``."""
    url: URL = make_url(admin_url).set(database=name)
    plain = url.set(drivername="postgresql").render_as_string(hide_password=False)
    return plain, normalise_database_url(plain)


def drop_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def create_database(admin_url: str, name: str) -> None:
    drop_database(admin_url, name)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')


def check_no_event_fk(conn: sa.Connection) -> None:
    """grant_event_seq and event_seq hold synthetic numbers: acceptable only while no
    foreign key makes them point at a real consent_event."""
    found = conn.execute(
        sa.text(
            "SELECT conname FROM pg_constraint WHERE contype = 'f' "
            "AND confrelid = 'consent_event'::regclass"
        )
    ).all()
    if found:
        raise SystemExit(f"consent_event is now referenced by {[r[0] for r in found]}")


def populate(
    sa_url: str,
    *,
    n: int,
    keys: list[tuple[str | None, str, bytes]],
    endpoint_base: str,
    opt_in_topics: list[int],
) -> None:
    """Migrate, then insert n subscribers with one active subscription each (keys
    (token, p256dh, sealed auth) used round-robin), the transactional topic the throughput
    campaign goes to (opt_in by default: everyone), and a marketing topic per size in
    ``opt_in_topics`` with explicit opt-ins of that many subscribers."""
    engine = create_engine(sa_url, poolclass=sa.pool.NullPool)
    started = time.perf_counter()
    upgrade(engine)
    now = dt.datetime.now(dt.UTC)
    ms = int(now.timestamp() * 1000) - 10 * n
    with engine.connect() as conn:
        check_no_event_fk(conn)
        conn.execute(sa.text("SET synchronous_commit = off"))  # a throwaway database
        conn.execute(sa.text(KEYS_TABLE))
        raw = conn.connection.driver_connection
        assert raw is not None  # a live connection's psycopg one
        with raw.cursor().copy("COPY bench.keys (k, token, p256dh, auth_sealed) FROM STDIN") as cp:
            for k, (token, p256dh, sealed) in enumerate(keys):
                cp.write_row((k, token, p256dh, sealed))
        conn.execute(
            sa.text(
                "INSERT INTO policy_version (version, published_at, text, text_sha256) "
                "VALUES ('v1', :now, 'We send what you choose.', "
                "encode(sha256('We send what you choose.'), 'hex'))"
            ),
            {"now": now},
        )
        topics = [(DRAFT.topic, True, "opt_in")] + [
            (f"offers-{size}", False, "opt_out") for size in opt_in_topics
        ]
        for position, (slug, transactional, default) in enumerate(topics):
            conn.execute(
                sa.text(
                    "INSERT INTO topic (slug, category, label, description, is_transactional, "
                    "default_state, position, created_at) VALUES (:slug, 'Bench', :slug, "
                    "'Benchmark topic.', :tx, :default, :pos, :now)"
                ),
                {"slug": slug, "tx": transactional, "default": default, "pos": position,
                 "now": now},
            )  # fmt: skip
        conn.commit()
        for lo in range(1, n + 1, CHUNK):
            hi = min(lo + CHUNK - 1, n)
            common = {"lo": lo, "hi": hi, "ms": ms, "now": now}
            conn.execute(sa.text(SUBSCRIBERS), common)
            conn.execute(
                sa.text(SUBSCRIPTIONS), {**common, "base": endpoint_base, "keys": len(keys)}
            )
            conn.commit()
            if n > CHUNK:
                print(f"  {hi:>10,} / {n:,} subscriptions", flush=True)
        ids: dict[str, int] = dict(conn.execute(sa.text("SELECT slug, id FROM topic")).all())
        for k, size in enumerate(opt_in_topics, start=1):
            conn.execute(
                sa.text(OPT_INS),
                {"ms": ms, "now": now, "n": size, "topic_id": ids[f"offers-{size}"],
                 "seq_base": 10 * k * n},
            )  # fmt: skip
            conn.commit()
        conn.execute(sa.text("DROP SCHEMA bench CASCADE"))
        conn.commit()
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(sa.text("VACUUM ANALYZE"))
    engine.dispose()
    print(f"  populated {n:,} subscriptions in {time.perf_counter() - started:.1f}s", flush=True)


# -- measuring -------------------------------------------------------------------------


def _process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def load() -> float:
    return os.getloadavg()[0]


@dataclass
class Way:
    key: str
    name: str
    messages: int
    seconds: float
    sender_cpu: float
    service_cpu: float
    load: float
    audience: int

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    @property
    def sampled(self) -> bool:
        return self.messages < self.audience


def sampled_count(lo: int, hi: int, sample: tuple[int, int]) -> int:
    """How many of the service's accepted messages lo+1 … hi it decrypts under
    ``decrypt_sample`` (the first ``first``, then every ``every``-th)."""
    first, every = sample

    def upto(n: int) -> int:  # messages 1 … n
        return min(n, first) + max(n // every - min(n, first) // every, 0)

    return upto(hi) - upto(lo)


def measure(
    key: str,
    name: str,
    service: FakePushProcess,
    count: int,
    audience: int,
    run: Callable[[], int],
    sample: tuple[int, int],
) -> Way:
    before = service.stats()
    sender0, service0 = time.process_time(), _process_cpu(service.pid)
    started = time.perf_counter()
    answered = run()
    seconds = time.perf_counter() - started
    sender = time.process_time() - sender0
    served = _process_cpu(service.pid) - service0
    after = service.stats()
    accepted = after["accepted"] - before["accepted"]
    decrypted = after["decrypted"] - before["decrypted"]
    expected = sampled_count(before["accepted"], after["accepted"], sample)
    if answered != count or accepted != count or decrypted != expected:
        raise SystemExit(
            f"{name}: {answered} answered 201, the service accepted {accepted} and decrypted "
            f"{decrypted} (sample {expected}), of {count}"
        )
    way = Way(key, name, count, seconds, sender, served, load(), audience)
    print(
        f"  {name:<52} {count:>7,} msgs {seconds:7.2f}s {way.rate:8.0f} msg/s  load {way.load:.1f}",
        flush=True,
    )
    return way


def way_a(infos: list[dict[str, Any]], text: str, private_key: str) -> int:
    ok = 0
    for info in infos:
        response = webpush(
            info, data=text, vapid_private_key=private_key, vapid_claims={"sub": SUBJECT},
            ttl=TTL, timeout=10,
        )  # fmt: skip
        ok += response.status_code == 201  # type: ignore[union-attr]
    return ok


def way_b(infos: list[dict[str, Any]], text: str, private_key: str) -> int:
    vapid = Vapid.from_string(private_key)
    ok = 0
    with requests.Session() as session:
        for info in infos:
            response = webpush(
                info, data=text, vapid_private_key=vapid, vapid_claims={"sub": SUBJECT},
                ttl=TTL, timeout=10, requests_session=session,
            )  # fmt: skip
            ok += response.status_code == 201  # type: ignore[union-attr]
    return ok


def way_b_kind(infos: list[dict[str, Any]], text: str, private_key: str, origin: str) -> int:
    headers = Vapid.from_string(private_key).sign(
        {"sub": SUBJECT, "aud": origin, "exp": int(time.time()) + 12 * 3600}
    )
    ok = 0
    with requests.Session() as session:
        for info in infos:
            response = WebPusher(info, requests_session=session).send(
                text, dict(headers), ttl=TTL, timeout=10
            )
            ok += response.status_code == 201  # type: ignore[union-attr]
    return ok


def portal_settings(
    sa_url: str,
    instance: str,
    *,
    ca_bundle: str,
    origin: str,
    keys: KeyRing,
    auth_key: bytes,
    vapid: tuple[str, str] | None = None,
) -> Settings:
    # Every process of one deployment signs with the same application-server key.
    private, public = vapid or generate_vapid_keys()
    return Settings(
        env="development",
        instance_path=instance,
        database_url=sa_url,
        secret_key=os.urandom(24).hex(),
        vapid_private_key=private,
        vapid_public_key=public,
        vapid_subject=SUBJECT,
        auth_keys={1: auth_key},
        auth_key_version=keys.current_version,
        push_allowed_hosts=(urlsplit(origin).netloc,),
        push_ca_bundle=ca_bundle,
        scheduler=False,
        auto_migrate=False,
    )


@dataclass
class CampaignRun:
    campaign_id: uuid.UUID
    seconds: float
    deliveries: dict[str, int]
    status: str
    ticks: int
    materialised: int
    complete: bool


def run_campaign(app: Any, topic: str, *, deadline: float | None = None) -> CampaignRun:
    """Launch a campaign to ``topic`` and run the dispatch job until it completes."""
    campaign_id = launch(app, topic)
    # The job stops between batches when the process is asked to stop: how a time limit
    # ends a campaign part-way.
    stop = threading.Event()
    app.extensions["portal.stop"] = stop
    timer = None
    started = time.perf_counter()
    if deadline is not None:
        timer = threading.Timer(max(deadline - started, 0.0), stop.set)
        timer.start()
    ticks = 0
    status = "scheduled"
    while True:
        run_job(app, "dispatch")
        ticks += 1
        with db.begin(app) as session:
            status = session.scalars(
                sa.select(Campaign.status).where(Campaign.id == campaign_id)
            ).one()
        if status not in ("sending", "scheduled") or stop.is_set():
            break
    seconds = time.perf_counter() - started
    if timer is not None:
        timer.cancel()
    return outcome(app, campaign_id, seconds, ticks)


def launch(app: Any, topic: str) -> uuid.UUID:
    clock = current_portal(app).clock
    with db.begin(app) as session:
        return create_campaign(
            session, CampaignDraft(**{**DRAFT.__dict__, "topic": topic}),
            created_by="bench@example.test", now=clock.now(),
        ).id  # fmt: skip


def outcome(app: Any, campaign_id: uuid.UUID, seconds: float, ticks: int) -> CampaignRun:
    """The campaign's state and its deliveries counted by status, from the database."""
    d = Delivery.__table__
    with db.begin(app) as session:
        status = session.scalars(sa.select(Campaign.status).where(Campaign.id == campaign_id)).one()
        counts: dict[str, int] = dict(
            session.execute(
                sa.select(d.c.status, sa.func.count())
                .where(d.c.campaign_id == campaign_id)
                .group_by(d.c.status)
            ).all()
        )
        materialised = session.scalars(
            sa.select(Campaign.materialised_at).where(Campaign.id == campaign_id)
        ).one()
    return CampaignRun(
        campaign_id, seconds, counts, status, ticks, sum(counts.values()),
        materialised is not None and status == "completed",
    )  # fmt: skip


def engine_child() -> None:
    """One of (c)'s engine processes. Reads its spec (JSON) from stdin, builds the app,
    runs the dispatch job once (nothing to do: imports and connections warm), says
    ``ready``, then reads the launched campaign's id and runs the dispatch job, as a
    scheduler tick would, until the campaign is no longer sending. Prints JSON."""
    spec = json.loads(sys.stdin.readline())
    auth_key = bytes.fromhex(spec["auth_key"])
    with tempfile.TemporaryDirectory(prefix="bench-dispatch-") as instance:
        settings = portal_settings(
            spec["sa_url"], instance, ca_bundle=spec["ca_bundle"], origin=spec["origin"],
            keys=KeyRing({1: auth_key}, 1), auth_key=auth_key,
            vapid=(spec["vapid_private"], spec["vapid_public"]),
        )  # fmt: skip
        app = create_app(settings)
        run_job(app, "dispatch")
        print("ready", flush=True)
        campaign_id = uuid.UUID(sys.stdin.readline().strip())
        rss_ready = _status_kb("VmRSS")
        # (wall time, VmHWM) every few seconds: the peak by any point of the campaign. Read
        # by a thread of its own: one dispatch run may last the whole campaign.
        peaks: list[tuple[float, int]] = [(time.time(), _status_kb("VmHWM"))]
        sampled = threading.Event()

        def sample() -> None:
            while not sampled.wait(RSS_EVERY):
                peaks.append((time.time(), _status_kb("VmHWM")))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        cpu0 = time.process_time()
        runs = claimed = answered = 0
        while True:
            report = run_job(app, "dispatch")
            runs += 1
            claimed += report.processed
            answered += report.changed
            with db.begin(app) as session:
                status = session.scalars(
                    sa.select(Campaign.status).where(Campaign.id == campaign_id)
                ).one()
            if status not in ("sending", "scheduled"):
                break
            if report.processed == 0:
                # The rest is claimed by the other processes: wait as a scheduler would
                # between ticks (much shorter than its tick), without spinning on the database.
                time.sleep(IDLE_PAUSE)
        finished = time.monotonic()
        cpu = time.process_time() - cpu0
        sampled.set()
        sampler.join()
        app.extensions["portal.db"].engine.dispose()
        close_dispatcher(app)
    peaks.append((time.time(), _status_kb("VmHWM")))
    print(json.dumps({
        "pid": os.getpid(), "finished": finished, "cpu_seconds": cpu, "runs": runs,
        "claimed": claimed, "answered": answered, "status": status,
        "rss_ready_kb": rss_ready, "rss_peaks": peaks,
    }))  # fmt: skip


def run_campaign_processes(
    app: Any, topic: str, spec: dict[str, Any], processes: int
) -> tuple[CampaignRun, list[dict[str, Any]]]:
    """Start ``processes`` engine processes (each ready and idle), launch a campaign to
    ``topic`` and let them all dispatch it. Timed from launch until the first process
    sees the campaign completed (the one that recorded the last answers, right after)."""
    children = [
        subprocess.Popen(
            [sys.executable, __file__, "--engine-child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for _ in range(processes)
    ]
    try:
        for child in children:
            assert child.stdin is not None
            child.stdin.write(json.dumps(spec) + "\n")
            child.stdin.flush()
        for child in children:
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                raise SystemExit(f"engine process {child.pid} did not start")
        campaign_id = launch(app, topic)
        started = time.monotonic()
        for child in children:
            assert child.stdin is not None
            child.stdin.write(f"{campaign_id}\n")
            child.stdin.flush()
        results = []
        for child in children:
            out, _ = child.communicate(timeout=3600)
            if child.returncode != 0:
                raise SystemExit(f"engine process {child.pid} exited with {child.returncode}")
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    seconds = min(r["finished"] for r in results) - started
    return outcome(app, campaign_id, seconds, sum(r["runs"] for r in results)), results


def verify_engine(
    key: str,
    app: Any,
    run: CampaignRun,
    n: int,
    before: dict[str, int],
    after: dict[str, int],
    samples: list[tuple[str, bytes]],
    sample: tuple[int, int],
) -> str:
    """Every check on one engine run; stops the benchmark if any fails. Returns what
    was verified, in words."""
    received = after["requests"] - before["requests"]
    accepted = after["accepted"] - before["accepted"]
    decrypted = after["decrypted"] - before["decrypted"]
    expected = sampled_count(before["accepted"], after["accepted"], sample)
    problems = []
    if run.status != "completed":
        problems.append(f"campaign is {run.status}, not completed")
    if run.deliveries != {"accepted": n}:
        problems.append(f"deliveries {run.deliveries}, not {n:,} accepted")
    # The service's total for the run equals N and every recipient had one: a delivery
    # sent twice (by two processes, or twice by one) would show in both counts.
    if not received == accepted == after["distinct_tokens"] == n:
        problems.append(
            f"service received {received}, accepted {accepted} for "
            f"{after['distinct_tokens']} distinct recipients, not {n} each"
        )
    if decrypted != expected:
        problems.append(f"service decrypted {decrypted}, not the {expected} sampled")
    checked = check_samples(app, run.campaign_id, samples)
    if checked != expected:
        problems.append(f"{checked} sampled plaintexts checked, not {expected}")
    if problems:
        raise SystemExit(f"({key}) engine: " + "; ".join(problems))
    return (
        f"({key}): the service received exactly {received:,} requests for the campaign "
        f"and accepted all {accepted:,}, one for each of {after['distinct_tokens']:,} "
        f"distinct recipients; it decrypted the {decrypted:,} sampled ones, each exactly the "
        "campaign's payload for the delivery id it carries, a delivery of this campaign to "
        "that recipient, no delivery id twice; the campaign is completed with "
        f"{run.deliveries.get('accepted', 0):,} of {n:,} deliveries accepted"
    )


def describe_sample(sample: tuple[int, int]) -> str:
    first, every = sample
    if every == 1:
        return "every message"
    return f"a sample: the first {first:,} messages it accepts, then every {every}th"


def check_samples(app: Any, campaign_id: uuid.UUID, samples: list[tuple[str, bytes]]) -> int:
    """Each sampled plaintext must be exactly the campaign's payload for the delivery id
    it names, and that delivery must be this campaign's, to the recipient it reached."""
    d, s = Delivery.__table__, PushSubscription.__table__
    with db.begin(app) as session:
        campaign = session.get(Campaign, campaign_id)
        assert campaign is not None
        ids = {int(json.loads(plaintext)["deliveryId"]) for _, plaintext in samples}
        endpoints = dict(
            session.execute(
                sa.select(d.c.id, s.c.endpoint)
                .join(s, s.c.id == d.c.subscription_id)
                .where(d.c.campaign_id == campaign_id, d.c.id.in_(ids))
            ).all()
        )
        seen: set[int] = set()
        for token, plaintext in samples:
            delivery_id = int(json.loads(plaintext)["deliveryId"])
            endpoint = endpoints.get(delivery_id)
            if endpoint is None or not endpoint.endswith("/" + token):
                raise SystemExit(f"(c): delivery {delivery_id} reached the wrong recipient")
            if plaintext != payload(campaign, delivery_id):
                raise SystemExit(f"(c): delivery {delivery_id} decrypts to something else")
            if delivery_id in seen:
                raise SystemExit(f"(c): delivery {delivery_id} arrived twice")
            seen.add(delivery_id)
    return len(samples)


def tenths(app: Any, campaign_id: uuid.UUID) -> list[dict[str, Any]]:
    """The campaign's accepted deliveries in ten equal parts, in the order their answers
    were recorded (``updated_at``: the clock reading of the batch that sent them), and
    each part's messages per second, from the end of the part before it (the first part
    from the first answer, so materialisation's head start is not counted against it)."""
    d = Delivery.__table__
    ranked = (
        sa.select(
            d.c.updated_at,
            sa.func.ntile(10).over(order_by=(d.c.updated_at, d.c.id)).label("part"),
        )
        .where(d.c.campaign_id == campaign_id, d.c.status == "accepted")
        .subquery()
    )
    with db.begin(app) as session:
        rows = session.execute(
            sa.select(
                ranked.c.part,
                sa.func.count(),
                sa.func.min(ranked.c.updated_at),
                sa.func.max(ranked.c.updated_at),
            )
            .group_by(ranked.c.part)
            .order_by(ranked.c.part)
        ).all()
    parts = []
    end = rows[0][2] if rows else None
    for part, count, _first, last in rows:
        seconds = (last - end).total_seconds()
        parts.append({
            "part": part, "messages": count, "seconds": seconds,
            "rate": count / seconds if seconds > 0 else None, "ended_at": last.timestamp(),
        })  # fmt: skip
        end = last
    return parts


def encryption_cpu(subs: list[BrowserSubscription], text: str, count: int) -> tuple[int, float]:
    """(messages, CPU seconds) of RFC 8291 encryption alone: the engine's own
    ``encrypt`` for ``count`` distinct recipients' keys, the campaign's payload, fresh
    salt and ephemeral key each (as the engine sends), in this thread."""
    body = text.encode()
    keys = [(b64url_decode(s.p256dh), s.auth) for s in subs[:count]]
    cpu0 = time.thread_time()
    for p256dh, auth in keys:
        encrypt(body, p256dh, auth)
    return len(keys), time.thread_time() - cpu0


# Where a sending process's CPU goes, from py-spy's samples of it: a sample of the sending
# (main) thread belongs to the innermost of these functions on its stack, in this order of
# precedence from the innermost frame out; (key, file, function).
PROFILE_FUNCTIONS = (
    ("encrypt", "portal/push/encryption.py", "encrypt"),
    ("open", "portal/subscriptions/sealing.py", "open"),
    ("render", "portal/campaigns/services.py", "render"),
    ("requests", "portal/delivery/engine.py", "requests"),
    ("send_all", "portal/delivery/engine.py", "_send_all"),
    ("encrypt_and_send", "portal/delivery/engine.py", "_encrypt_and_send"),
    ("claim", "portal/delivery/engine.py", "claim"),
    ("advance", "portal/delivery/engine.py", "advance_campaigns"),
    # The same work inside the sending loop: a sender whose claim came back short or empty.
    ("advance", "portal/delivery/engine.py", "_advance"),
    ("advance", "portal/delivery/engine.py", "_materialise"),
)
PROFILE_LABELS = {
    "encrypt": "encryption (RFC 8291: ECDH, HKDF, AES-GCM; `encrypt`)",
    "open": "opening the sealed auth secret (AES-GCM; `KeyRing.open`)",
    "render": "the payload (`PayloadTemplate.render`)",
    "requests": "the rest of each request: the endpoint's check, the request object "
    "(the `requests` generator)",
    "send_all": "HTTP through libcurl: transfers, TLS, headers, VAPID, answers (`_send_all`)",
    "encrypt_and_send": "re-checking consent, reading the subscriptions, caps and quiet "
    "hours (`_encrypt_and_send`)",
    "claim": "claiming (`claim`)",
    "advance": "advancing campaigns: materialisation, completion (`advance_campaigns`, "
    "and `_materialise` in the sending loop)",
    "other": "the rest of the sending thread (the job, planning the writes, scheduling)",
    "threads": "the process's other threads (recording the answers, renewing leases)",
}
_FRAME = re.compile(r"(?P<function>[^;]*) \((?P<file>[^;]*):\d+\)")


def profile_parts(raw: str, main_thread: int) -> dict[str, int]:
    """py-spy's raw samples (``--threads``) counted by part."""
    counts = dict.fromkeys(PROFILE_LABELS, 0)
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        thread = re.match(r"thread \((\d+)\)", stack)
        if thread is None or int(thread.group(1)) != main_thread:
            counts["threads"] += int(count)
            continue
        frames = [(m["function"].rsplit(".", 1)[-1], m["file"]) for m in _FRAME.finditer(stack)]
        part = "other"
        for function, file in reversed(frames):
            found = next(
                (key for key, suffix, name in PROFILE_FUNCTIONS
                 if function == name and file.endswith(suffix)),
                None,
            )  # fmt: skip
            if found is not None:
                part = found
                break
        counts[part] += int(count)
    return counts


def profile_pass(app: Any, seconds: float, path: str | None) -> dict[str, Any]:
    """A third campaign to the same recipients for ``seconds``, this process sampled from
    outside by py-spy (on-CPU samples of every thread, 200 a second, the process not
    paused) while it sends; the parts' shares of the samples, and the process's CPU."""
    spy = Path(sys.executable).with_name("py-spy")
    with tempfile.TemporaryDirectory(prefix="bench-dispatch-profile-") as folder:
        output = Path(path) if path else Path(folder) / "samples.txt"
        sampler = subprocess.Popen(
            [str(spy), "record", "--pid", str(os.getpid()), "--duration", str(round(seconds)),
             "--rate", "200", "--format", "raw", "--threads", "--nonblocking",
             "--output", str(output)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(1.0)  # attached and sampling before the campaign starts
        process0 = time.process_time()
        run = run_campaign(app, DRAFT.topic, deadline=time.perf_counter() + seconds - 1.0)
        process_cpu = time.process_time() - process0
        _, errors = sampler.communicate(timeout=seconds + 60)
        if sampler.returncode != 0 or not output.exists():
            raise SystemExit(f"py-spy failed ({sampler.returncode}): {errors.strip()}")
        counts = profile_parts(output.read_text(), os.getpid())
    return {
        "seconds": run.seconds,
        "accepted": run.deliveries.get("accepted", 0),
        "process_cpu": process_cpu,
        "samples": counts,
    }


def throughput(args: argparse.Namespace) -> tuple[list[Way], dict[str, Any]]:
    n, few = args.recipients, min(args.baseline_sample, args.recipients)
    shared = min(args.session_sample, n)
    pg_url, sa_url = database_urls(args.admin_url, args.database)
    vapid = generate_vapid_keys()
    private_key = vapid[0]
    auth_key = os.urandom(32)
    keys = KeyRing({1: auth_key}, 1)
    notes: dict[str, Any] = {}
    sample = (args.decrypt_first, args.decrypt_every)
    with FakePushProcess(decrypt=True, decrypt_sample=sample, record=False) as service:
        print(
            f"fake push service {service.origin} (pid {service.pid}), decrypting "
            + describe_sample(sample),
            flush=True,
        )
        factory = SubscriptionFactory()
        subs: list[BrowserSubscription] = [factory(base=service.endpoint_base) for _ in range(n)]
        service.register_many(subs)
        infos = [s.to_json() for s in subs]
        create_database(args.admin_url, args.database)
        try:
            print(f"database {args.database}: migrate and populate {n:,} subscriptions")
            populate(
                sa_url, n=n, endpoint_base=service.endpoint_base, opt_in_topics=[],
                keys=[(token_of(s), s.p256dh, keys.seal(s.auth).sealed) for s in subs],
            )  # fmt: skip
            with tempfile.TemporaryDirectory(prefix="bench-dispatch-") as instance:
                settings = portal_settings(
                    sa_url, instance, ca_bundle=service.ca_bundle, origin=service.origin,
                    keys=keys, auth_key=auth_key, vapid=vapid,
                )  # fmt: skip
                app = create_app(settings)
                # The same message the engine sends, for the pywebpush ways too.
                probe = Campaign(id=uuid.uuid4(), title=DRAFT.title, body=DRAFT.body,
                                 url=DRAFT.url, icon=None)  # fmt: skip
                text = payload(probe, 10 * n).decode()
                notes["payload_bytes"] = len(text.encode())
                # requests ignores a Session's verify= when REQUESTS_CA_BUNDLE is set, and
                # webpush() takes no CA: the environment is the only way to trust the fake CA.
                os.environ["REQUESTS_CA_BUNDLE"] = service.ca_bundle
                print(f"{len(text)}-byte payloads; {os.cpu_count()} CPUs; load {load():.1f}")
                ways = [] if args.engine_only else [
                    measure("a", "(a) pywebpush webpush() per recipient", service, few, n,
                            lambda: way_a(infos[:few], text, private_key), sample),
                    measure("b", "(b) pywebpush webpush(requests_session=shared)", service,
                            shared, n, lambda: way_b(infos[:shared], text, private_key),
                            sample),
                    measure("b'", "(b') pywebpush WebPusher.send(), shared Session + VAPID",
                            service, shared, n,
                            lambda: way_b_kind(infos[:shared], text, private_key,
                                               service.origin),
                            sample),
                ]  # fmt: skip
                notes["sample"] = describe_sample(sample)
                notes["verified"] = []
                encrypted, encryption_seconds = encryption_cpu(subs, text, args.encryption_sample)
                notes["encryption"] = {"messages": encrypted, "cpu_seconds": encryption_seconds}
                print(
                    f"  encryption alone: {encryption_seconds / encrypted * 1e6:.0f} µs CPU "
                    f"a message ({encrypted:,} messages)",
                    flush=True,
                )
                processes = args.engine_processes
                if processes > 1:
                    spec = {
                        "sa_url": sa_url, "ca_bundle": service.ca_bundle,
                        "origin": service.origin, "auth_key": auth_key.hex(),
                        "vapid_private": vapid[0], "vapid_public": vapid[1],
                    }  # fmt: skip
                    service.forget_tokens()
                    before = service.stats()
                    samples_before = len(service.samples())
                    service0 = _process_cpu(service.pid)
                    run, shares = run_campaign_processes(app, DRAFT.topic, spec, processes)
                    served = _process_cpu(service.pid) - service0
                    after = service.stats()
                    notes["verified"].append(
                        verify_engine("c", app, run, n, before, after,
                                      service.samples()[samples_before:], sample)
                    )  # fmt: skip
                    if sum(r["answered"] for r in shares) != n:
                        raise SystemExit(f"(c) engine processes answered {shares}, not {n}")
                    c = Way("c", f"(c) portal engine, {processes} processes: launched "
                            "campaign, dispatch job", n, run.seconds,
                            sum(r["cpu_seconds"] for r in shares), served, load(), n)  # fmt: skip
                    print(
                        f"  {c.name:<52} {n:>7,} msgs {c.seconds:7.2f}s {c.rate:8.0f} msg/s  "
                        f"load {c.load:.1f}  ({run.ticks} dispatch job runs)",
                        flush=True,
                    )
                    for r in shares:
                        print(
                            f"    process {r['pid']}: {r['answered']:,} answers recorded "
                            f"({r['answered'] / n:.0%}), {r['cpu_seconds']:.1f} s CPU, "
                            f"{r['runs']} job runs",
                            flush=True,
                        )
                    ways.append(c)
                    notes["shares"] = shares
                    notes["tenths"] = {"c": tenths(app, run.campaign_id)}
                service.forget_tokens()
                before = service.stats()
                samples_before = len(service.samples())
                sender0, service0 = time.process_time(), _process_cpu(service.pid)
                run = run_campaign(app, DRAFT.topic)
                sender = time.process_time() - sender0
                served = _process_cpu(service.pid) - service0
                after = service.stats()
                key = "c1" if processes > 1 else "c"
                notes["verified"].append(
                    verify_engine(key, app, run, n, before, after,
                                  service.samples()[samples_before:], sample)
                )  # fmt: skip
                c1 = Way(key, f"({key}) portal engine, 1 process: launched campaign, "
                         "dispatch job", n, run.seconds, sender, served, load(), n)  # fmt: skip
                print(
                    f"  {c1.name:<52} {n:>7,} msgs {c1.seconds:7.2f}s {c1.rate:8.0f} msg/s  "
                    f"load {c1.load:.1f}  ({run.ticks} dispatch job runs)",
                    flush=True,
                )
                ways.append(c1)
                notes.setdefault("tenths", {})[key] = tenths(app, run.campaign_id)
                notes["service_totals"] = after
                if args.profile_seconds > 0:
                    service.forget_tokens()
                    print(f"  profile: a third campaign for {args.profile_seconds:.0f} s, "
                          "sampled by py-spy", flush=True)  # fmt: skip
                    notes["profile"] = profile_pass(app, args.profile_seconds, args.profile)
                app.extensions["portal.db"].engine.dispose()
                close_dispatcher(app)
        finally:
            drop_database(args.admin_url, args.database)
            print(f"dropped {args.database}", flush=True)
    del pg_url
    return ways, notes


# -- memory ----------------------------------------------------------------------------


def memory_child(spec: dict[str, Any]) -> None:
    """One campaign of ``spec['size']`` recipients in this fresh process; prints JSON."""
    keys = KeyRing({1: bytes.fromhex(spec["auth_key"])}, 1)
    with tempfile.TemporaryDirectory(prefix="bench-dispatch-") as instance:
        settings = portal_settings(
            spec["sa_url"], instance, ca_bundle=spec["ca_bundle"], origin=spec["origin"],
            keys=keys, auth_key=bytes.fromhex(spec["auth_key"]),
        )  # fmt: skip
        app = create_app(settings)
        # Warm: connect and import everything the dispatch job uses, so "before" is the
        # process as it sits idle between campaigns.
        run_job(app, "dispatch")
        rss_before = _status_kb("VmRSS")
        cpu0 = time.process_time()
        limit = spec.get("seconds")
        deadline = time.perf_counter() + limit if limit else None
        run = run_campaign(app, spec["topic"], deadline=deadline)
        cpu = time.process_time() - cpu0
        result = {
            "size": spec["size"],
            "seconds": run.seconds,
            "cpu_seconds": cpu,
            "deliveries": run.deliveries,
            "status": run.status,
            "complete": run.complete,
            "ticks": run.ticks,
            "rss_before_kb": rss_before,
            "rss_peak_kb": _status_kb("VmHWM"),
        }
        app.extensions["portal.db"].engine.dispose()
    print(json.dumps(result))


def memory(args: argparse.Namespace) -> list[dict[str, Any]]:
    sizes = sorted(args.memory_sizes)
    largest = sizes[-1]
    pg_url, sa_url = database_urls(args.admin_url, args.database + "_memory")
    auth_key = os.urandom(32)
    keys = KeyRing({1: auth_key}, 1)
    factory = SubscriptionFactory()
    pool = [factory() for _ in range(min(KEY_POOL, largest))]
    results = []
    # No decryption: memory is the question here, and the service's CPU is better left to
    # the sender. It still checks every request's headers and VAPID token.
    with FakePushProcess(decrypt=False, record=False) as service:
        name = args.database + "_memory"
        create_database(args.admin_url, name)
        try:
            print(f"database {name}: migrate and populate {largest:,} subscriptions")
            populate(
                sa_url, n=largest, endpoint_base=service.endpoint_base,
                keys=[(None, s.p256dh, keys.seal(s.auth).sealed) for s in pool],
                opt_in_topics=sizes[:-1],
            )  # fmt: skip
            for size in sizes:
                topic = DRAFT.topic if size == largest else f"offers-{size}"
                spec = {
                    "size": size, "topic": topic, "sa_url": sa_url,
                    "ca_bundle": service.ca_bundle, "origin": service.origin,
                    "auth_key": auth_key.hex(), "seconds": args.memory_seconds,
                }  # fmt: skip
                before = service.stats()
                out = subprocess.run(
                    [sys.executable, __file__, "--memory-child", json.dumps(spec)],
                    check=True, capture_output=True, text=True,
                )  # fmt: skip
                result = json.loads(out.stdout.strip().splitlines()[-1])
                after = service.stats()
                result["service_accepted"] = after["accepted"] - before["accepted"]
                result["load"] = load()
                accepted = result["deliveries"].get("accepted", 0)
                if result["complete"] and not (
                    accepted == size == result["service_accepted"]
                    and result["deliveries"] == {"accepted": size}
                ):
                    raise SystemExit(f"memory {size:,}: {result}")
                results.append(result)
                print(
                    f"  {size:>10,} recipients: {accepted:,} accepted in "
                    f"{result['seconds']:.1f}s ({accepted / result['seconds']:.0f} msg/s), "
                    f"RSS before {result['rss_before_kb'] / 1024:.1f} MiB, peak "
                    f"{result['rss_peak_kb'] / 1024:.1f} MiB"
                    f"{'' if result['complete'] else ' — NOT COMPLETE (time limit)'}, "
                    f"load {result['load']:.1f}",
                    flush=True,
                )
        finally:
            drop_database(args.admin_url, name)
            print(f"dropped {name}", flush=True)
    del pg_url
    return results


# -- report ----------------------------------------------------------------------------


def machine() -> str:
    mem_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    return f"{os.cpu_count()} CPUs, {mem_kb / 1024 / 1024:.0f} GiB RAM"


def throughput_table(ways: list[Way]) -> str:
    by = {w.key: w for w in ways}
    c = by["c"]
    lines = [
        "| way | messages | seconds | msg/s | sender CPU µs/msg | service CPU µs/msg "
        "| load | (c) × this |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in ways:
        sampled = f" (sample of {w.messages:,} of {w.audience:,})" if w.sampled else ""
        lines.append(
            f"| {w.name}{sampled} | {w.messages:,} | {w.seconds:.2f} | {w.rate:,.0f} "
            f"| {w.sender_cpu / w.messages * 1e6:,.0f} | {w.service_cpu / w.messages * 1e6:,.0f} "
            f"| {w.load:.1f} | {c.rate / w.rate:.1f}× |"
        )
    return "\n".join(lines)


def engine_label(c: Way) -> str:
    processes = c.name.split("engine, ", 1)[1].split(":", 1)[0]
    return f"Engine end to end ({processes}, way ({c.key}))"


def figure(
    name: str, value: float, unit: str, baseline: float, baseline_name: str, target: str,
    passed: bool | None,
) -> dict[str, Any]:  # fmt: skip
    return {
        "figure": name, "value": round(value, 1), "unit": unit, "baseline": round(baseline, 1),
        "baseline_name": baseline_name, "ratio": round(value / baseline, 2) if baseline else 0,
        "target": target, "passed": passed,
    }  # fmt: skip


def first_and_last(parts: list[dict[str, Any]]) -> tuple[float, float] | None:
    if len(parts) < 10 or parts[0]["rate"] is None or parts[-1]["rate"] is None:
        return None  # too few batches to cut in tenths (a --quick run)
    return parts[0]["rate"], parts[-1]["rate"]


def rss_at_first_tenth(share: dict[str, Any], tenth_end: float) -> int:
    """An engine process's peak memory by the time a tenth of the campaign was sent."""
    return max((kb for at, kb in share["rss_peaks"] if at <= tenth_end), default=0)


def figures(
    ways: list[Way], mem: list[dict[str, Any]], notes: dict[str, Any]
) -> list[dict[str, Any]]:
    """The SPEC §7 targets: (c1) is the engine in one process, (c) in one per CPU."""
    by = {w.key: w for w in ways}
    c, a = by["c"], by["a"]
    c1 = by.get("c1", c)
    b = max(by["b"], by["b'"], key=lambda w: w.rate)
    b_name = b.name.split(" ", 1)[1] + (" (sampled)" if b.sampled else "")
    a_name = a.name.split(" ", 1)[1] + (" (sampled)" if a.sampled else "")
    out = [
        figure(f"{engine_label(c1)} vs pywebpush with a shared requests.Session", c1.rate,
               "msg/s", b.rate, b_name, f"≥ {TARGET_VS_SESSION:.0f}×",
               c1.rate >= TARGET_VS_SESSION * b.rate),
        figure(f"{engine_label(c)} vs pywebpush webpush() per recipient", c.rate, "msg/s",
               a.rate, a_name, f"≥ {TARGET_VS_WEBPUSH:.0f}×",
               c.rate >= TARGET_VS_WEBPUSH * a.rate),
    ]  # fmt: skip
    if c1 is not c:
        out.append(figure(f"{engine_label(c)} vs pywebpush with a shared requests.Session",
                          c.rate, "msg/s", b.rate, b_name, "", None))  # fmt: skip
    for way in (c, c1) if c1 is not c else (c,):
        ends = first_and_last(notes["tenths"][way.key])
        if ends is not None:
            out.append(figure(
                f"{engine_label(way)}, {way.messages:,}-recipient campaign: msg/s of its last "
                "tenth vs its first", ends[1], "msg/s", ends[0], "its first tenth",
                f"≥ {TARGET_TENTHS}×", ends[1] >= TARGET_TENTHS * ends[0],
            ))  # fmt: skip
    encryption = notes["encryption"]["cpu_seconds"] / notes["encryption"]["messages"] * 1e6
    for way in (c1, c) if c1 is not c else (c,):
        per_message = way.sender_cpu / way.messages * 1e6
        out.append(figure(
            f"{engine_label(way)}: sender CPU per message vs encryption alone", per_message,
            "µs", encryption, "RFC 8291 encryption alone, `encrypt`, same run",
            f"≤ {TARGET_CPU_VS_ENCRYPTION:.0f}×",
            per_message <= TARGET_CPU_VS_ENCRYPTION * encryption,
        ))  # fmt: skip
    shares = notes.get("shares")
    parts = notes["tenths"]["c"]
    if shares and len(parts) == 10:
        peak = max(r["rss_peaks"][-1][1] for r in shares)
        early = max(rss_at_first_tenth(r, parts[0]["ended_at"]) for r in shares)
        out.append(figure(
            f"{engine_label(c)}, {c.messages:,}-recipient campaign: peak RSS of an engine "
            "process at the end vs when a tenth was sent", peak / 1024, "MiB", early / 1024,
            "the same processes' peak after the first tenth",
            f"< {TARGET_PEAK_MB:.0f} MB, flat (within {FLAT_SLACK_MB:.0f} MiB)",
            peak / 1024 * 1.048576 < TARGET_PEAK_MB and peak - early <= FLAT_SLACK_MB * 1024,
        ))  # fmt: skip
    if mem:
        small, large = mem[0], mem[-1]
        peak = large["rss_peak_kb"] / 1024
        growth = (large["rss_peak_kb"] - small["rss_peak_kb"]) / 1024
        out.append(figure(
            f"Engine peak RSS, {large['size']:,}-recipient campaign" + (
                "" if large["complete"] else
                f" (its first {large['seconds']:.0f} s: "
                f"{large['deliveries'].get('accepted', 0):,} accepted)"
            ), peak, "MiB", small["rss_peak_kb"] / 1024,
            f"peak RSS, {small['size']:,}-recipient campaign", f"< {TARGET_PEAK_MB:.0f} MB, flat",
            peak * 1.048576 < TARGET_PEAK_MB and growth <= FLAT_SLACK_MB,
        ))  # fmt: skip
    return out


def memory_table(mem: list[dict[str, Any]]) -> str:
    lines = [
        "| recipients | accepted | complete | seconds | msg/s | CPU s | RSS before MiB "
        "| peak RSS MiB | load |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for m in mem:
        accepted = m["deliveries"].get("accepted", 0)
        lines.append(
            f"| {m['size']:,} | {accepted:,} | {'yes' if m['complete'] else 'NO'} "
            f"| {m['seconds']:.1f} | {accepted / m['seconds']:,.0f} | {m['cpu_seconds']:.1f} "
            f"| {m['rss_before_kb'] / 1024:.1f} | {m['rss_peak_kb'] / 1024:.1f} "
            f"| {m['load']:.1f} |"
        )
    return "\n".join(lines)


def figures_table(figs: list[dict[str, Any]]) -> str:
    lines = [
        "| figure | value | baseline | ratio | target | result |",
        "|---|---:|---:|---:|---|---|",
    ]
    for f in figs:
        lines.append(
            f"| {f['figure']} | {f['value']:,} {f['unit']} "
            f"| {f['baseline']:,} ({f['baseline_name']}) | {f['ratio']}× | {f['target']} "
            f"| {'' if f['passed'] is None else 'pass' if f['passed'] else 'MISS'} |"
        )
    return "\n".join(lines)


def shape_details(ways: list[Way], notes: dict[str, Any]) -> list[str]:
    """The campaign's rate tenth by tenth, the engine processes' memory through it, and
    where a sending process's CPU goes (encryption alone, and the profile pass)."""
    out: list[str] = []
    runs = [w for w in ways if w.key in notes.get("tenths", {})]
    if runs:
        out += [
            "Each campaign's accepted deliveries in ten equal parts, in the order their "
            "answers were recorded (`updated_at`, the clock reading of the batch that sent "
            "them); msg/s of each part from the end of the part before (the first from the "
            "first answer):",
            "",
            "| tenth | "
            + " | ".join(f"({w.key}) messages | ({w.key}) s | ({w.key}) msg/s" for w in runs)
            + " |",
            "|---:|" + "---:|---:|---:|" * len(runs),
        ]
        for k in range(10):
            cells = []
            for w in runs:
                parts = notes["tenths"][w.key]
                if k < len(parts):
                    p = parts[k]
                    rate = "—" if p["rate"] is None else f"{p['rate']:,.0f}"
                    cells.append(f"{p['messages']:,} | {p['seconds']:.1f} | {rate}")
                else:
                    cells.append("— | — | —")
            out.append(f"| {k + 1} | " + " | ".join(cells) + " |")
        out.append("")
    shares = notes.get("shares")
    if shares and len(notes["tenths"].get("c", [])) == 10:
        tenth_end = notes["tenths"]["c"][0]["ended_at"]
        out += [
            "Memory of (c)'s engine processes (VmRSS when ready and idle; VmHWM, the peak, "
            f"read every {RSS_EVERY:.0f} s through the campaign):",
            "",
            "| (c) engine process | RSS ready MiB | peak after the first tenth MiB "
            "| peak at the end MiB |",
            "|---|---:|---:|---:|",
        ]
        for k, r in enumerate(shares, start=1):
            out.append(
                f"| {k} | {r['rss_ready_kb'] / 1024:.1f} "
                f"| {rss_at_first_tenth(r, tenth_end) / 1024:.1f} "
                f"| {r['rss_peaks'][-1][1] / 1024:.1f} |"
            )
        out.append("")
    encryption = notes.get("encryption")
    if encryption:
        alone = encryption["cpu_seconds"] / encryption["messages"] * 1e6
        out += [
            f"Encryption alone: the engine's `encrypt` (RFC 8291) of the campaign's payload "
            f"for {encryption['messages']:,} recipients' keys, fresh salt and key each, in one "
            f"thread: **{alone:.0f} µs CPU a message**. Sender CPU a message (all of a "
            "process's threads; the database server's CPU is not in it): "
            + ", ".join(
                f"({w.key}) {w.sender_cpu / w.messages * 1e6:.0f} µs "
                f"({w.sender_cpu / w.messages * 1e6 / alone:.2f}×)"
                for w in ways
                if w.key in ("c", "c1")
            )
            + ".",
            "",
        ]
    profile = notes.get("profile")
    if profile and profile["accepted"]:
        n = profile["accepted"]
        samples = sum(profile["samples"].values())
        per_message = profile["process_cpu"] / n * 1e6
        out += [
            f"Where the rest goes: a third campaign to the same recipients, sent by this "
            f"process for {profile['seconds']:.0f} s while py-spy sampled it from outside "
            f"(on-CPU samples of every thread, 200 a second, the process not paused: "
            f"{samples:,} samples): {n:,} messages accepted at {per_message:.0f} µs of "
            "process CPU a message. A sample of the sending thread counts for the innermost "
            "of these parts on its stack; µs a message is the part's share of the samples "
            "times the process's CPU a message.",
            "",
            "| part | samples | share | µs a message |",
            "|---|---:|---:|---:|",
        ]
        for key, label in PROFILE_LABELS.items():
            count = profile["samples"][key]
            share = count / samples if samples else 0.0
            out.append(f"| {label} | {count:,} | {share:.0%} | {share * per_message:,.0f} |")
        out.append("")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--audience", "--recipients", dest="recipients", type=int, default=1_000_000,
        help="recipients of each engine campaign (default 1,000,000)",
    )  # fmt: skip
    parser.add_argument(
        "--baseline-sample", type=int, default=2_000,
        help="recipients (a) sends to; its rate is extrapolated to --audience",
    )  # fmt: skip
    parser.add_argument(
        "--session-sample", type=int, default=20_000,
        help="recipients (b) and (b') send to; their rates are extrapolated to --audience",
    )  # fmt: skip
    parser.add_argument(
        "--encryption-sample", type=int, default=20_000,
        help="messages the encryption-only measurement encrypts",
    )  # fmt: skip
    parser.add_argument(
        "--profile-seconds", type=float, default=30.0,
        help="seconds of a third campaign whose process is profiled (0 skips it)",
    )  # fmt: skip
    parser.add_argument(
        "--memory-sizes", default="",
        help="comma-separated audience sizes for separate memory runs (default none: the "
        "engine processes of (c) report their peaks through the campaign)",
    )  # fmt: skip
    parser.add_argument(
        "--memory-seconds", type=float,
        help="stop each memory run after this long (default: send the whole campaign)",
    )  # fmt: skip
    parser.add_argument("--admin-url", default=DEFAULT_ADMIN_URL, help="a database to connect to")
    parser.add_argument("--database", default=DEFAULT_DATABASE, help="the database to create")
    parser.add_argument(
        "--json",
        metavar="PATH",
        type=Path,
        help="also write the figures to PATH (bench/contract.py)",
    )
    parser.add_argument(
        "--engine-processes", type=int, default=os.cpu_count() or 1,
        help="engine processes (c) dispatches the campaign with (default: the CPU count); "
        "with more than one, (c1) is the engine in one process, in the same run",
    )  # fmt: skip
    parser.add_argument(
        "--quick", action="store_true",
        help="smoke run: 2,000 recipients (sample 500), memory at 5,000 and 20,000",
    )  # fmt: skip
    parser.add_argument(
        "--decrypt-first", type=int, default=100,
        help="the fake service decrypts the first N messages it accepts (default 100) ...",
    )  # fmt: skip
    parser.add_argument(
        "--decrypt-every", type=int, default=20,
        help="... and then every K-th (default 20; 1 decrypts every message), for every way",
    )  # fmt: skip
    parser.add_argument(
        "--engine-only", action="store_true",
        help="measure (c) only, no pywebpush ways and no targets (for profiling the engine)",
    )  # fmt: skip
    parser.add_argument(
        "--profile", metavar="PATH",
        help="also keep the profile pass's py-spy samples (raw, one stack a line) here",
    )  # fmt: skip
    parser.add_argument(
        "--autovacuum", choices=("server", "on"), default="on",
        help="on (default): PostgreSQL's autovacuum on for this run, as on a production "
        "server, if the server has it off (ALTER SYSTEM, reset at the end); server: leave "
        "the server as it is set",
    )  # fmt: skip
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    parser.add_argument("--engine-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.memory_child:
        memory_child(json.loads(args.memory_child))
        return 0
    if args.engine_child:
        engine_child()
        return 0
    if args.quick:
        args.recipients, args.baseline_sample, args.memory_sizes = 2_000, 500, "5000,20000"
        args.session_sample, args.encryption_sample, args.profile_seconds = 2_000, 500, 3.0
    args.memory_sizes = [int(s) for s in args.memory_sizes.split(",") if s.strip()]
    sizes = (args.recipients, args.baseline_sample, args.session_sample, args.encryption_sample)
    if min(sizes) < 1 or any(s < 1 for s in args.memory_sizes):
        parser.error("sizes must be positive")
    if args.engine_processes < 1:
        parser.error("--engine-processes must be ≥ 1")
    if args.decrypt_first < 0 or args.decrypt_every < 1:
        parser.error("--decrypt-first must be ≥ 0 and --decrypt-every ≥ 1")

    # Stopped from outside: still drop the databases (the finally blocks).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    started = time.perf_counter()
    with psycopg.connect(args.admin_url, autocommit=True) as conn:
        version = first_row(conn.execute("SHOW server_version"))[0]
        server_autovacuum = first_row(conn.execute("SHOW autovacuum"))[0]
        if args.autovacuum == "on" and server_autovacuum != "on":
            # For this run only: ALTER SYSTEM's value is removed again at the end.
            conn.execute("ALTER SYSTEM SET autovacuum = on")
            conn.execute("SELECT pg_reload_conf()")
    autovacuum = (
        f"autovacuum {server_autovacuum} (the server's setting)"
        if args.autovacuum == "server" or server_autovacuum == "on"
        else f"autovacuum on for this run (the server's setting: {server_autovacuum})"
    )
    load_start = load()
    print(
        f"machine: {machine()}, PostgreSQL {version}, {autovacuum}, load {load_start:.1f}",
        flush=True,
    )
    try:
        ways, notes = throughput(args)
        mem = memory(args) if args.memory_sizes and not args.engine_only else []
    finally:
        if args.autovacuum == "on" and server_autovacuum != "on":
            with psycopg.connect(args.admin_url, autocommit=True) as conn:
                conn.execute("ALTER SYSTEM RESET autovacuum")
                conn.execute("SELECT pg_reload_conf()")
    load_end = load()
    figs = [] if args.engine_only else figures(ways, mem, notes)

    parts = [
        f"Machine: {machine()}, PostgreSQL {version}, {autovacuum}; load average (1 min) "
        f"{load_start:.1f} at the start, {load_end:.1f} at the end.",
        "",
        figures_table(figs),
        "",
        f"Throughput, {ways[-1].messages:,} recipients, {notes['payload_bytes']}-byte "
        f"payloads, the fake service checking every request and decrypting {notes['sample']} "
        "(the same for every way):",
        "",
        throughput_table(ways),
        "",
    ]
    c = next(w for w in ways if w.key == "c")
    c1 = next((w for w in ways if w.key == "c1"), None)
    if c1 is not None:
        shares = notes["shares"]
        parts += [
            f"(c) is the headline: {len(shares)} engine processes (the CPU count by default, "
            "`--engine-processes`), each building the app and running the dispatch job, as "
            "every web worker and `portal scheduler` process does in production, on the same "
            "launched campaign at once; timed from launch (materialisation included, done by "
            "whichever process got to it) until the campaign is completed. (c1) is the same "
            "engine in one process, in the same run, on a second campaign to the same "
            f"recipients ((c) is {c.rate / c1.rate:.2f}× (c1)): the Session target is checked on "
            "(c1), the webpush() target on (c), the others on both. Sender "
            "CPU for (c) is summed over its engine processes (user + system, from each "
            "process's start of dispatching until it saw the campaign completed).",
            "",
            "| (c) engine process | answers recorded | share | CPU s | CPU µs/msg | job runs |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for k, r in enumerate(shares, start=1):
            parts.append(
                f"| {k} | {r['answered']:,} | {r['answered'] / c.messages:.0%} "
                f"| {r['cpu_seconds']:.1f} "
                f"| {r['cpu_seconds'] / max(r['answered'], 1) * 1e6:,.0f} | {r['runs']} |"
            )
        parts += [
            f"| all | {sum(r['answered'] for r in shares):,} | 100% "
            f"| {c.sender_cpu:.1f} | {c.sender_cpu / c.messages * 1e6:,.0f} "
            f"| {sum(r['runs'] for r in shares)} |",
            "",
        ]
    parts += shape_details(ways, notes)
    parts += ["Checked: " + "; ".join(notes["verified"]) + "."]
    if args.engine_only:
        print("\n".join(parts))
        return 0
    a = next(w for w in ways if w.key == "a")
    b = max((w for w in ways if w.key in ("b", "b'")), key=lambda w: w.rate)
    if a.sampled:
        parts += [
            "",
            f"(a) sent to a sample of {a.messages:,} of the {a.audience:,} recipients; its "
            "messages per second are extrapolated to the whole audience (it sends one at a "
            "time, so its rate does not depend on the audience size).",
        ]
    if b.sampled:
        parts += [
            "",
            f"(b) and (b') sent to the first {b.messages:,} of the {b.audience:,} recipients "
            "(`--session-sample`); like (a) they send one message at a time, so their rate "
            "does not depend on the audience size.",
        ]
    parts += [
        "",
        "The Session target is checked on (c1), the engine in one process, against the "
        f"faster of (b) and (b'), here ({b.key}); the webpush() target on (c), one engine "
        "process per CPU.",
    ]
    if mem:
        parts += [
            "",
            "Memory, one child process per campaign (the fake service not decrypting). "
            "RSS before: the child's VmRSS after the app started and one dispatch run found "
            "nothing to do; peak: its VmHWM when the campaign ended (getrusage's ru_maxrss "
            "is not used: on Linux it keeps the parent's high-water mark across fork and exec).",
            "",
            memory_table(mem),
            "",
            f"peak RSS {mem[0]['rss_peak_kb'] / 1024:.1f} MiB for {mem[0]['size']:,} recipients, "
            f"{mem[-1]['rss_peak_kb'] / 1024:.1f} MiB for {mem[-1]['size']:,}: "
            + (
                "flat"
                if mem[-1]["rss_peak_kb"] - mem[0]["rss_peak_kb"] <= FLAT_SLACK_MB * 1024
                else "GROWS WITH THE AUDIENCE"
            )
            + ".",
        ]
        if not all(m["complete"] for m in mem):
            parts += [
                "",
                f"Time-limited (--memory-seconds {args.memory_seconds:.0f}): a campaign still "
                "sending by then stops after its current batch; the table says how many "
                "deliveries were accepted by then.",
            ]
    details = "\n".join(parts)
    print()
    print(details)
    print(f"\ntotal {time.perf_counter() - started:.0f}s")
    write(
        args.json, benchmark="dispatch", title="Dispatch",
        figures=[Figure(**f) for f in figs], details_markdown=details,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
