"""Pages benchmark (SPEC §6): the preference centre under gunicorn against a hello-world.

> The preference centre under gunicorn serves at least 40% of the requests per second of
> a Flask hello-world under the same server.

One run, one machine, one server configuration for both sides: gunicorn with the
project's ``gunicorn.conf.py`` (gthread workers), ``--workers`` processes (default twice
the CPUs) of ``--threads`` threads. In turn, for ``--duration`` seconds each at
``--connections`` concurrent keep-alive connections (after a short warm-up that is not
counted), ``wrk`` drives:

- ``hello``: ``GET /`` of ``bench/hello.py``, Flask's hello-world (the baseline);
- ``preferences-get``: ``GET /preferences``, the preference centre of a subscriber known
  by their signed cookie (as after following a notification's link);
- ``preferences-post``: the preference centre's form, saved with a valid CSRF token,
  toggling two marketing topics each time (two consent events and two preference rows
  written per save, under the consent log's lock);
- ``subscribe``: ``POST /api/push/subscribe``, a new endpoint on an allowed push host
  every request, with real P-256 keys;
- ``idle`` and ``idle-after-campaign``, a pair: ``GET /preferences`` as above, but on
  fresh workers running the embedded scheduler (as production's do) with every
  subscription on the fake push service (``tests/fakepush.py``, in a process of its own,
  not decrypting); first before any campaign, once the jobs the scheduler runs at start
  have finished (``idle``), then on the same workers once
  they have sent a campaign to ``--campaign-topic``'s audience (``security-alerts``:
  nearly everyone) and it has completed (``idle-after-campaign``). The pair is taken
  ``--pairs`` times, each on a gunicorn of its own, and every pair is reported.

The portal runs in production mode against a fresh PostgreSQL database (created, migrated,
populated with ``bench/audience.py``'s catalogue and subscribers, and dropped). The
credentials are made the way a browser gets them: a signed preference link token,
``GET /preferences?token=…`` for the subscriber cookie, then the page for the session
cookie and its CSRF token.

wrk must be installed (Debian: ``apt-get install wrk``). The load generator runs on the
same machine and competes with gunicorn and PostgreSQL for the same CPUs: on a 2-core
machine every figure is lower than on a dedicated server, the hello-world most of all.

    .venv/bin/python bench/pages.py                            # 50 connections, 60 s each
    .venv/bin/python bench/pages.py --connections 20 --duration 20 --env RATE_LIMIT_PER_ENDPOINT=0
    .venv/bin/python bench/pages.py --scenarios idle,idle-after-campaign --pairs 2
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import psycopg
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from flask import Flask

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.audience import (  # noqa: E402
    TOPICS,
    create_database,
    database_urls,
    drop_database,
    populate,
)
from bench.contract import Figure, add_arguments, first_row, write  # noqa: E402
from portal.config import b64url_encode, generate_signing_key, generate_vapid_keys  # noqa: E402
from portal.identity import preference_link_token  # noqa: E402

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
TARGET = 0.40
# Workers that sent a campaign serve the preference centre at least this share as fast as
# they did before it (the machine's noise is some per cent from one minute to the next).
AFTER_TARGET = 0.90
# req/s moves with whatever else the machine runs; the workers' own CPU per request does
# not, or far less: a campaign that left work behind shows as more CPU per request.
CPU_AFTER_TARGET = 1.10
SCENARIOS = (
    "hello",
    "preferences-get",
    "preferences-post",
    "subscribe",
    "idle",
    "idle-after-campaign",
)
CAMPAIGN_PAIR = ("idle", "idle-after-campaign")
EXPECTED = {
    "hello": 200,
    "preferences-get": 200,
    "preferences-post": 303,
    "subscribe": 201,
    "idle": 200,
    "idle-after-campaign": 200,
}
MARKETING = [slug for slug, _, tx, _, retired, *_ in TOPICS if not tx and not retired]
TOGGLED = MARKETING[1:3]  # two marketing topics flipped by every save
# Where the subscribe scenario's new endpoints point (never sent to by bench/pages.py).
FCM = "https://fcm.googleapis.com/fcm/send/"
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
_CHECKBOX = re.compile(r'name="topics" value="([^"]+)"\s*(checked)?')
_VISIBLE = re.compile(r'name="visible" value="([^"]+)"')
_POLICY = re.compile(r'name="policy_version" value="([^"]*)"')


@dataclass
class Result:
    scenario: str
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    socket_errors: int
    unexpected: int  # answers other than the scenario's expected status
    pair: int | None = None  # idle and idle-after-campaign: which pair
    note: str = ""  # idle-after-campaign: the campaign it followed
    # idle and idle-after-campaign: the workers' own CPU time (user + system, every thread)
    # per request served, and per second with no requests at all (the scheduler's ticks).
    # Unlike req/s, neither depends on what else the machine is running.
    cpu_ms_per_request: float | None = None
    quiet_cpu_ms_per_s: float | None = None
    # bench/beside_campaign.py: "idle" or "sending", and while sending the campaign's
    # answers per second over the measured window.
    phase: str = ""
    msg_per_s: float | None = None
    sender: str = ""  # bench/beside_campaign.py: the web workers' sender share

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def errors(self) -> int:
        return self.socket_errors + self.unexpected


@dataclass
class Subscribes:
    """What the subscribe scenario sends: browsers' key pairs, where the new endpoints
    point, and whether each request comes from a client address of its own."""

    keys: list[tuple[str, str]]
    endpoint_base: str = FCM
    spread_addresses: bool = False


@dataclass
class Credential:
    cookie: str  # the Cookie header: subscriber cookie and session (CSRF secret)
    form_a: str  # the form as the page showed it
    form_b: str  # the same with two marketing topics flipped


# ---------------------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def portal_environ(url: str, instance: Path) -> dict[str, str]:
    """Production settings with every secret set, as an operator would run it."""
    private, public = generate_vapid_keys()
    return {
        "PORTAL_ENV": "production",
        # Required in production; the load sends no Origin header, so it is never compared.
        "PUBLIC_URL": "https://portal.bench.example",
        "DATABASE_URL": url,
        "PORTAL_INSTANCE_PATH": str(instance),
        "SECRET_KEY": secrets.token_urlsafe(48),
        "VAPID_PRIVATE_KEY": private,
        "VAPID_PUBLIC_KEY": public,
        "VAPID_SUBJECT": "mailto:bench@example.test",
        "SUBSCRIPTION_AUTH_KEY_V1": base64.b64encode(os.urandom(32)).decode(),
        "EXPORT_SIGNING_KEY": generate_signing_key(),
        "CONSENT_LOG_SIGNING_KEY": generate_signing_key(),
        # Jobs would compete for the CPUs being measured; they run elsewhere here.
        "PORTAL_SCHEDULER": "off",
        "PORTAL_AUTO_MIGRATE": "off",
        "PORTAL_DEMO_DATA": "off",
        # All the load comes from one loopback address: the per-address limit is raised
        # out of reach rather than switched off, so each request still pays for its count.
        "RATE_LIMIT_PER_ADDRESS": "1000000000",
        # A hundred people save hundreds of times a second between them: likewise.
        "RATE_LIMIT_SAVES": "1000000000",
    }


def outside_environ() -> dict[str, str]:
    """This shell's environment without any portal setting of its own: a portal process
    started by a benchmark gets only the benchmark's."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PORTAL_", "DATABASE_URL", "SECRET_KEY", "PROMETHEUS_", "VAPID_"))
    }


_masters: dict[str, int] = {}  # base URL → gunicorn master's pid


@contextlib.contextmanager
def gunicorn(
    app_spec: str, environ: dict[str, str], *, workers: int, threads: int, health: str, log: Path
) -> Iterator[str]:
    port = free_port()
    clean = outside_environ()
    metrics = tempfile.mkdtemp(prefix="bench-pages-metrics-")
    clean.update(environ)
    clean.update(
        PORTAL_BIND=f"127.0.0.1:{port}",
        WEB_CONCURRENCY=str(workers),
        PORTAL_THREADS=str(threads),
        PROMETHEUS_MULTIPROC_DIR=metrics,
    )
    with log.open("ab") as errors:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "gunicorn"), "-c", "gunicorn.conf.py", app_spec],
            cwd=ROOT,
            env=clean,
            stdout=subprocess.DEVNULL,  # the access log: written, not kept
            stderr=errors,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    _masters[base] = process.pid
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise SystemExit(f"gunicorn exited with {process.returncode}; see {log}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(base + health, timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit(f"gunicorn did not answer {health}; see {log}")
            time.sleep(0.3)
        time.sleep(1.0)  # the master answers before every worker has booted
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        shutil.rmtree(metrics, ignore_errors=True)


# ---------------------------------------------------------------------------- data


def subscriber_ids(pg_url: str, count: int) -> list[uuid.UUID]:
    """Subscribers with a live subscription, spread over the table."""
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT s.id FROM subscriber AS s WHERE s.erased_at IS NULL AND EXISTS ("
            " SELECT 1 FROM push_subscription AS p WHERE p.subscriber_id = s.id"
            " AND p.deleted_at IS NULL AND p.state = 'active') "
            "ORDER BY md5(s.id::text) LIMIT %s",
            (count,),
        ).fetchall()
    if len(rows) < count:
        raise SystemExit(f"only {len(rows)} live subscribers; populate more")
    return [row[0] for row in rows]


def credential(base: str, token: str) -> Credential:
    """What a browser holds after following a notification's link to the centre."""
    with requests.Session() as browser:
        link = browser.get(
            f"{base}/preferences", params={"token": token}, allow_redirects=False, timeout=30
        )
    # The link names its person for the visit (the session cookie), never switching the
    # browser's own subscriber cookie; production cookies are Secure: sent by hand over
    # plain HTTP on loopback.
    visit = {k: v for k, v in link.cookies.items() if k in ("portal_subscriber", "session")}
    if link.status_code != 303 or not visit:
        raise SystemExit(f"the preference link was refused ({link.status_code} {link.headers})")
    page = requests.get(
        f"{base}/preferences",
        headers={"Cookie": "; ".join(f"{k}={v}" for k, v in visit.items())},
        timeout=30,
    )
    if page.status_code != 200:
        raise SystemExit(f"the preference centre did not answer ({page.status_code})")
    visit |= {k: v for k, v in page.cookies.items() if k in ("portal_subscriber", "session")}
    csrf = _CSRF.search(page.text)
    policy = _POLICY.search(page.text)
    if csrf is None or policy is None:
        raise SystemExit("the preference centre has no form")
    visible = _VISIBLE.findall(page.text)
    checked = {slug for slug, on in _CHECKBOX.findall(page.text) if on}
    flipped = checked ^ set(TOGGLED)

    def form(topics: set[str]) -> str:
        return urlencode(
            {
                "csrf_token": csrf.group(1),
                "policy_version": policy.group(1),
                "visible": visible,
                "topics": sorted(topics),
            },
            doseq=True,
        )

    return Credential(
        cookie="; ".join(f"{k}={v}" for k, v in visit.items()),
        form_a=form(checked),
        form_b=form(flipped),
    )


def browser_keys(count: int) -> list[tuple[str, str]]:
    """(p256dh, auth) pairs as browsers send them: real P-256 points, 16-byte secrets."""
    keys = []
    for _ in range(count):
        point = (
            ec.generate_private_key(ec.SECP256R1())
            .public_key()
            .public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
        )
        keys.append((b64url_encode(point), b64url_encode(os.urandom(16))))
    return keys


# ---------------------------------------------------------------------------- a campaign


def retarget(pg_url: str, endpoint_base: str, auth_key: str) -> None:
    """Every subscription onto the fake push service, with one real browser key pair
    (sealed with this run's data key), so the workers can send a campaign to it, and
    seen just now."""
    from portal.subscriptions.sealing import KeyRing

    point = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    )
    sealed = KeyRing({1: base64.b64decode(auth_key)}, 1).seal(os.urandom(16))
    with psycopg.connect(pg_url) as conn:
        conn.execute(
            "UPDATE push_subscription SET endpoint = %(base)s || id::text, "
            "endpoint_hash = sha256(convert_to(%(base)s || id::text, 'UTF8')), "
            "push_service = 'other', p256dh = %(p256dh)s, auth_sealed = %(sealed)s, "
            "auth_key_version = 1, last_seen_at = now(), expiration_time = NULL "
            # Seen just now: the scheduler's sweep, running in these workers, would
            # otherwise find bench/audience.py's subscriptions long silent and end them.
            "WHERE deleted_at IS NULL",
            {"base": endpoint_base, "p256dh": b64url_encode(point), "sealed": sealed.sealed},
        )


def launch_campaign(pg_url: str, topic: str, body: str) -> uuid.UUID:
    """A campaign to ``topic``, due now, as the form's launch leaves it."""
    campaign_id = uuid.uuid4()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO campaign (id, topic_id, title, body, urgency, ttl, send_at, status, "
            "created_by, created_at, launched_at, is_test) SELECT %s, id, 'Bench', "
            "%s, 'normal', 86400, now(), 'scheduled', 'bench', now(), "
            "now(), false FROM topic WHERE slug = %s",
            (campaign_id, body, topic),
        )
    return campaign_id


def campaign_counts(pg_url: str, campaign_id: uuid.UUID) -> tuple[str, dict[str, int]]:
    """The campaign's status and its deliveries per status."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        status = first_row(
            conn.execute("SELECT status FROM campaign WHERE id = %s", (campaign_id,))
        )[0]
        counts: dict[str, int] = dict(
            conn.execute(
                "SELECT status, count(*) FROM delivery WHERE campaign_id = %s GROUP BY status",
                (campaign_id,),
            ).fetchall()
        )
    return status, counts


def answered(counts: dict[str, int]) -> int:
    return sum(n for state, n in counts.items() if state != "queued")


def wait_finished(pg_url: str, campaign_id: uuid.UUID, started: float, timeout: float) -> str:
    """Wait for the workers to finish the campaign; what it came to."""
    while True:
        status, counts = campaign_counts(pg_url, campaign_id)
        if status not in ("scheduled", "sending"):
            break
        if time.monotonic() - started > timeout:
            raise SystemExit(f"the campaign was still {status} after {timeout:.0f} s")
        time.sleep(1.0)
    seconds = time.monotonic() - started
    sent = ", ".join(f"{n:,} {state}" for state, n in sorted(counts.items()))
    return f"{sum(counts.values()):,} recipients ({sent}) in {seconds:.0f} s, {status}"


def run_campaign(pg_url: str, topic: str, timeout: float = 1800) -> str:
    """Launch a campaign to ``topic`` now and wait for the workers to complete it."""
    started = time.monotonic()
    campaign_id = launch_campaign(pg_url, topic, "Idle after a campaign")
    return wait_finished(pg_url, campaign_id, started, timeout)


def wait_for_jobs(pg_url: str, timeout: float = 600) -> str:
    """Wait until the jobs the scheduler runs when it starts (sweep, purge, tombstone …)
    have finished: an idle figure taken while they run measures them too."""
    started = time.monotonic()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        while True:
            running, done = first_row(
                conn.execute(
                    "SELECT count(*) FILTER (WHERE seconds IS NULL), count(*) FROM job_run "
                    "WHERE name <> 'dispatch'"
                )
            )
            if done and not running:
                break
            if time.monotonic() - started > timeout:
                raise SystemExit(f"start-up jobs still running after {timeout:.0f} s")
            time.sleep(1.0)
        seconds = time.monotonic() - started
    return f"{done} start-up job runs finished {seconds:.0f} s after the credentials were made"


def workers_of(master: int) -> list[int]:
    children = Path(f"/proc/{master}/task/{master}/children")
    return [int(pid) for pid in children.read_text().split()] if children.exists() else []


_TICKS = os.sysconf("SC_CLK_TCK")


def worker_cpu(master: int) -> float:
    """Seconds of CPU (user + system, all threads) the master's workers have used so far."""
    total = 0
    for pid in workers_of(master):
        try:
            # The fields after the command name (which may hold spaces, hence the split on
            # its closing parenthesis): utime and stime are the 12th and 13th.
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / _TICKS


def measure_workers(
    master: int, base: str, scenario: str, args: argparse.Namespace, creds: list[Credential]
) -> Result:
    """``measure``, plus the workers' CPU per request and, first, per quiet second."""
    quiet = 10.0
    cpu, started = worker_cpu(master), time.monotonic()
    time.sleep(quiet)
    quiet_cpu = (worker_cpu(master) - cpu) / (time.monotonic() - started)
    warm_up(base, scenario, args, creds, None)  # first, so the CPU read after it is the window's
    cpu = worker_cpu(master)
    result = measure(base, scenario, args, creds, None, warm=False)
    result.cpu_ms_per_request = 1000 * (worker_cpu(master) - cpu) / max(result.requests, 1)
    result.quiet_cpu_ms_per_s = 1000 * quiet_cpu
    print(
        f"    workers' CPU: {result.cpu_ms_per_request:.2f} ms per request, "
        f"{result.quiet_cpu_ms_per_s:.1f} ms per quiet second",
        flush=True,
    )
    return result


def worker_state(master: int) -> str:
    """Each worker's threads and resident memory: what a campaign may have left behind."""
    found = []
    for pid in workers_of(master):
        try:
            threads = len(list(Path(f"/proc/{pid}/task").iterdir()))
            rss = next(
                int(line.split()[1]) // 1024
                for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("VmRSS:")
            )
        except (OSError, StopIteration):
            continue
        found.append(f"{threads} threads/{rss} MiB")
    return ", ".join(found)


def campaign_pairs(
    args: argparse.Namespace, environ: dict[str, str], pg_url: str, folder: Path, signer: Flask
) -> tuple[list[Result], list[str]]:
    """``--pairs`` times, on a fresh gunicorn whose workers run the scheduler: the
    preference centre idle, then the same workers' after they sent a campaign."""
    from tests.fakepush import FakePushProcess

    results: list[Result] = []
    notes: list[str] = []
    with FakePushProcess(decrypt=False, record=False) as push:
        retarget(pg_url, push.endpoint_base, environ["SUBSCRIPTION_AUTH_KEY_V1"])
        sending = environ | {
            "PORTAL_SCHEDULER": "on",
            "PUSH_ALLOWED_HOSTS": push.origin.removeprefix("https://"),
            "PUSH_CA_BUNDLE": push.ca_bundle,
        }
        for pair in range(1, args.pairs + 1):
            with gunicorn(
                "app:app",
                sending,
                workers=args.workers,
                threads=args.threads,
                health="/healthz",
                log=folder / "gunicorn.log",
            ) as base:
                master = _masters[base]
                creds = [
                    credential(base, preference_link_token(s, signer))
                    for s in subscriber_ids(pg_url, max(2 * args.connections, 2))
                ]
                settled = wait_for_jobs(pg_url)
                time.sleep(2 * 5)  # and two dispatch ticks
                idle = measure_workers(master, base, "idle", args, creds)
                idle.pair = pair
                before = worker_state(master)
                print(f"  pair {pair}: sending a campaign to {args.campaign_topic} ...", flush=True)
                note = run_campaign(pg_url, args.campaign_topic)
                print(f"    {note}", flush=True)
                time.sleep(2 * 5)  # two dispatch ticks: whatever the campaign left is idle
                after = measure_workers(master, base, "idle-after-campaign", args, creds)
                after.pair, after.note = pair, note
                results += [idle, after]
                notes.append(
                    f"pair {pair}: {settled}; campaign of {note}; workers before it: {before}; "
                    f"after it: {worker_state(master)}"
                )
    return results, notes


# ---------------------------------------------------------------------------- wrk

LUA_COMMON = r"""
local threads = {}
local next_id = 0
unexpected = 0
counter = 0

function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

function response(status, headers, body)
  if status ~= EXPECTED then unexpected = unexpected + 1 end
end

function done(summary, latency, requests)
  local bad = 0
  for _, thread in ipairs(threads) do bad = bad + thread:get("unexpected") end
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "socket_errors": %d, "unexpected": %d, '
    .. '"p50_us": %d, "p99_us": %d, "mean_us": %f}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, bad,
    latency:percentile(50), latency:percentile(99), latency.mean))
end
"""

LUA_PER_THREAD = r"""
function init(args)
  mine = {}
  for i, item in ipairs(ALL) do
    if (i - 1) % NTHREADS == id then table.insert(mine, item) end
  end
end
"""


def _lua(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def script(
    scenario: str,
    threads: int,
    credentials: list[Credential],
    subscribes: Subscribes | None,
    phase: str,
) -> str:
    head = f"EXPECTED = {EXPECTED[scenario]}\nNTHREADS = {threads}\n" + LUA_COMMON
    if scenario in CAMPAIGN_PAIR:
        scenario = "preferences-get"
    if scenario == "hello":
        return head + 'wrk.method = "GET"\nwrk.path = "/"\n'
    if scenario == "preferences-get":
        items = ",\n".join(_lua(c.cookie) for c in credentials)
        return (
            head
            + f"ALL = {{\n{items}\n}}\n"
            + LUA_PER_THREAD
            + r"""
request = function()
  counter = counter + 1
  return wrk.format("GET", "/preferences", {["Cookie"] = mine[(counter % #mine) + 1]})
end
"""
        )
    if scenario == "preferences-post":
        items = ",\n".join(
            f"{{cookie = {_lua(c.cookie)}, a = {_lua(c.form_a)}, b = {_lua(c.form_b)}, n = 0}}"
            for c in credentials
        )
        return (
            head
            + f"ALL = {{\n{items}\n}}\n"
            + LUA_PER_THREAD
            + r"""
request = function()
  counter = counter + 1
  local c = mine[(counter % #mine) + 1]
  c.n = c.n + 1
  local body = (c.n % 2 == 1) and c.b or c.a
  return wrk.format("POST", "/preferences", {
    ["Cookie"] = c.cookie,
    ["Content-Type"] = "application/x-www-form-urlencoded"}, body)
end
"""
        )
    if subscribes is None:
        raise SystemExit(f"the {scenario} scenario needs browsers' keys")
    items = ",\n".join(f"{{p = {_lua(p)}, a = {_lua(a)}}}" for p, a in subscribes.keys)
    # An FCM-sized endpoint, unique per run, phase, thread and request.
    padding = secrets.token_urlsafe(96)
    prefix = f"{subscribes.endpoint_base}{phase}-{padding}"
    return (
        head
        + f"ALL = {{\n{items}\n}}\nPREFIX = {_lua(prefix)}\n"
        + f"SPREAD = {'true' if subscribes.spread_addresses else 'false'}\n"
        + LUA_PER_THREAD
        + r"""
request = function()
  counter = counter + 1
  local k = mine[(counter % #mine) + 1]
  local body = string.format(
    '{"subscription": {"endpoint": "%s-%d-%d", "expirationTime": null, '
    .. '"keys": {"p256dh": "%s", "auth": "%s"}}}', PREFIX, id, counter, k.p, k.a)
  local headers = {["Content-Type"] = "application/json"}
  if SPREAD then
    -- Each request from a client address of its own, as a proxy in front would say.
    headers["X-Forwarded-For"] = string.format(
      "10.%d.%d.%d", id % 256, math.floor(counter / 256) % 256, counter % 256)
  end
  return wrk.format("POST", "/api/push/subscribe", headers, body)
end
"""
    )


def run_wrk(
    base: str, lua: str, *, scenario: str, connections: int, seconds: int, threads: int
) -> Result:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as handle:
        handle.write(lua)
    try:
        out = subprocess.run(
            [
                "wrk",
                f"-t{threads}",
                f"-c{connections}",
                f"-d{seconds}s",
                "--timeout",
                "30s",
                "-s",
                handle.name,
                base,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        Path(handle.name).unlink()
    line = next((x for x in out.splitlines() if x.startswith("WRKJSON ")), None)
    if line is None:
        raise SystemExit(f"wrk gave no summary:\n{out}")
    data = json.loads(line.removeprefix("WRKJSON "))
    return Result(
        scenario,
        data["requests"],
        data["duration_us"] / 1e6,
        data["p50_us"] / 1000,
        data["p99_us"] / 1000,
        data["mean_us"] / 1000,
        data["socket_errors"],
        data["unexpected"],
    )


# ---------------------------------------------------------------------------- report


def label(r: Result) -> str:
    return f"{r.scenario} (pair {r.pair})" if r.pair is not None else r.scenario


def idle_of(results: list[Result], r: Result) -> Result | None:
    """The idle figure an idle-after-campaign one is compared with: its own pair's."""
    if r.scenario != "idle-after-campaign":
        return None
    return next((x for x in results if x.scenario == "idle" and x.pair == r.pair), None)


def _ms(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f} ms"


def table(results: list[Result], hello: Result | None) -> str:
    lines = [
        "| scenario | requests | req/s | p50 ms | p99 ms | errors | vs hello-world | target "
        "| workers' CPU per request | workers' CPU per quiet second |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in results:
        ratio = f"{r.rps / hello.rps:.0%}" if hello and r is not hello and hello.rps else ""
        target = f"≥ {TARGET:.0%}" if r.scenario.startswith("preferences") else ""
        idle = idle_of(results, r)
        if idle is not None and idle.rps:
            target = f"{r.rps / idle.rps:.0%} of idle, ≥ {AFTER_TARGET:.0%}"
        lines.append(
            f"| {label(r)} | {r.requests:,} | {r.rps:,.1f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} "
            f"| {r.errors} | {ratio} | {target} | {_ms(r.cpu_ms_per_request, 2)} "
            f"| {_ms(r.quiet_cpu_ms_per_s, 1)} |"
        )
    return "\n".join(lines)


def figures(results: list[Result], hello: Result | None) -> list[Figure]:
    found = []
    for r in results:
        ratio = r.rps / hello.rps if hello and hello.rps and r is not hello else None
        has_target = r.scenario.startswith("preferences") and ratio is not None
        idle = idle_of(results, r)
        if idle is not None and idle.rps:
            ratio = r.rps / idle.rps
            found.append(
                Figure(
                    f"{label(r)}, the preference centre on workers that sent a campaign "
                    f"({r.p50_ms:.0f} ms p50, {r.errors} errors)",
                    round(r.rps, 1),
                    "req/s",
                    round(idle.rps, 1),
                    f"the same workers before it (pair {r.pair})",
                    round(ratio, 3),
                    f"≥ {AFTER_TARGET:g}× (as fast as before)",
                    ratio >= AFTER_TARGET and r.errors == 0,
                )
            )
            if r.cpu_ms_per_request and idle.cpu_ms_per_request:
                cpu_ratio = r.cpu_ms_per_request / idle.cpu_ms_per_request
                found.append(
                    Figure(
                        f"{label(r)}, the workers' own CPU per preference-centre request "
                        f"(user + system, all threads; {r.quiet_cpu_ms_per_s:.1f} ms per "
                        f"quiet second after, {idle.quiet_cpu_ms_per_s:.1f} before)",
                        round(r.cpu_ms_per_request, 2),
                        "ms",
                        round(idle.cpu_ms_per_request, 2),
                        f"the same workers before it (pair {r.pair})",
                        round(cpu_ratio, 3),
                        f"≤ {CPU_AFTER_TARGET:g}× (no more work per request)",
                        cpu_ratio <= CPU_AFTER_TARGET,
                    )
                )
            continue
        if r.scenario == "idle":
            continue  # the baseline of its pair's figure
        found.append(
            Figure(
                f"{r.scenario} ({r.p50_ms:.0f} ms p50, {r.p99_ms:.0f} ms p99, {r.errors} errors)",
                round(r.rps, 1),
                "req/s",
                None if r is hello or hello is None else round(hello.rps, 1),
                "" if r is hello or hello is None else "Flask hello-world, same gunicorn",
                None if ratio is None else round(ratio, 3),
                f"≥ {TARGET:g}× ({TARGET:.0%} of hello-world)" if has_target else "",
                (ratio >= TARGET and r.errors == 0) if has_target and ratio is not None else None,
            )
        )
    return found


# ---------------------------------------------------------------------------- main


def server_arguments(parser: argparse.ArgumentParser, *, duration: int) -> None:
    """The arguments of a gunicorn under wrk's load (this script's and
    bench/beside_campaign.py's)."""
    cpus = os.cpu_count() or 1
    parser.add_argument("--admin-url", default=ADMIN_URL)
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--duration", type=int, default=duration, help="seconds per window")
    parser.add_argument("--warmup", type=int, default=5, help="uncounted seconds first")
    parser.add_argument("--workers", type=int, default=2 * cpus, help="gunicorn workers")
    parser.add_argument("--threads", type=int, default=4, help="threads per gunicorn worker")
    parser.add_argument("--wrk-threads", type=int, default=min(2, cpus))
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for the portal's gunicorn (repeatable), e.g. rate limits",
    )


def extra_environment(args: argparse.Namespace) -> dict[str, str]:
    """``--env``'s NAME=VALUE pairs."""
    extra = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--env takes NAME=VALUE, not {item!r}")
        extra[name] = value
    return extra


def main() -> int:
    cpus = os.cpu_count() or 1
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    server_arguments(parser, duration=60)
    parser.add_argument("--subscribers", type=int, default=100_000)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument(
        "--pairs",
        type=int,
        default=2,
        help="idle, idle-after-campaign pairs (each on a new gunicorn)",
    )
    parser.add_argument(
        "--campaign-topic", default="security-alerts", help="the campaign of idle-after-campaign"
    )
    parser.add_argument("--keep", action="store_true", help="leave the database in place")
    add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.connections = min(args.connections, 10)
        args.duration, args.warmup = min(args.duration, 5), 1
        args.subscribers = min(args.subscribers, 5_000)
    if shutil.which("wrk") is None:
        raise SystemExit("bench/pages.py needs wrk: apt-get install wrk (Debian/Ubuntu)")
    extra = extra_environment(args)
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    if set(CAMPAIGN_PAIR) & set(scenarios):
        scenarios = [s for s in scenarios if s not in CAMPAIGN_PAIR] + list(CAMPAIGN_PAIR)
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        raise SystemExit(f"unknown scenarios {sorted(unknown)}; choose from {SCENARIOS}")
    pool = max(2 * args.connections, 2 * args.wrk_threads)

    load_before = os.getloadavg()
    name = f"bench_pages_{uuid.uuid4().hex[:10]}"
    pg_url, sa_url = database_urls(args.admin_url, name)
    create_database(args.admin_url, name)
    results: list[Result] = []
    try:
        populate(sa_url, args.subscribers)
        with psycopg.connect(pg_url) as conn:
            version = first_row(conn.execute("SHOW server_version"))[0].split()[0]
        with tempfile.TemporaryDirectory(prefix="bench-pages-") as folder:
            log = Path(folder) / "gunicorn.log"
            environ = portal_environ(sa_url, Path(folder) / "instance") | extra
            signer = Flask("bench")
            signer.config["SECRET_KEY"] = environ["SECRET_KEY"]
            portal_scenarios = [s for s in scenarios if s != "hello" and s not in CAMPAIGN_PAIR]
            if portal_scenarios:
                with gunicorn(
                    "app:app",
                    environ,
                    workers=args.workers,
                    threads=args.threads,
                    health="/healthz",
                    log=log,
                ) as base:
                    print(f"making {pool} subscribers' credentials ...", flush=True)
                    creds = [
                        credential(base, preference_link_token(s, signer))
                        for s in subscriber_ids(pg_url, pool)
                    ]
                    subscribes = Subscribes(browser_keys(64))
                    for scenario in portal_scenarios:
                        results.append(measure(base, scenario, args, creds, subscribes))
            if "hello" in scenarios:
                with gunicorn(
                    "bench.hello:app",
                    {},
                    workers=args.workers,
                    threads=args.threads,
                    health="/",
                    log=log,
                ) as base:
                    results.insert(0, measure(base, "hello", args, [], None))
            pair_notes: list[str] = []
            if CAMPAIGN_PAIR[0] in scenarios:
                paired, pair_notes = campaign_pairs(args, environ, pg_url, Path(folder), signer)
                results += paired
            problems = log.read_text(errors="replace") if log.exists() else ""
    finally:
        if not args.keep:
            drop_database(args.admin_url, name)
    load_after = os.getloadavg()

    hello = next((r for r in results if r.scenario == "hello"), None)
    print()
    print(table(results, hello))
    tracebacks = problems.count("Traceback")
    setup = (
        f"gunicorn `-c gunicorn.conf.py` (gthread), {args.workers} workers × {args.threads} "
        f"threads, for the portal (production mode, scheduler off) and the hello-world alike; "
        f"wrk {args.wrk_threads} threads, {args.connections} keep-alive connections, "
        f"{args.duration} s per scenario after {args.warmup} s of warm-up; PostgreSQL "
        f"{version}, {args.subscribers:,} subscribers ({len(TOPICS)} topics, "
        f"bench/audience.py's data); {pool} subscribers' credentials. {cpus} CPUs shared by "
        f"wrk, gunicorn and PostgreSQL; load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after."
    )
    if pair_notes:
        setup += (
            " idle / idle-after-campaign: the portal's gunicorn as above but with the "
            "scheduler on (a dispatch tick every 5 s in every worker) and every subscription "
            "on the fake push service (not decrypting); a fresh gunicorn per pair, idle "
            "measured once the start-up jobs (sweep, purge, tombstone …) have finished; the "
            f"campaign goes to `{args.campaign_topic}`, and the second figure is taken 10 s "
            "after it completed. " + " ".join(n[0].upper() + n[1:] + "." for n in pair_notes)
        )
    if extra:
        setup += " Extra environment: " + ", ".join(f"`{k}={v}`" for k, v in extra.items()) + "."
    details = "\n\n".join(
        [
            "> The preference centre under gunicorn serves at least 40% of the requests per "
            "second of a Flask hello-world under the same server. (SPEC §6)",
            setup,
            table(results, hello),
            "errors: socket errors and timeouts (30 s) plus answers other than the expected "
            "status (200; 303 for the form; 201 for a new subscription). "
            f"Tracebacks in gunicorn's error log: {tracebacks}. The load generator runs on "
            "the same CPUs as the servers: it takes a share of them from both sides, most "
            "noticeably from the hello-world, whose requests cost the least.",
        ]
    )
    print()
    print(details)
    write(
        args.json,
        benchmark="pages",
        title="Pages (preference centre under gunicorn)",
        figures=figures(results, hello),
        details_markdown=details,
    )
    return 0


def warm_up(
    base: str,
    scenario: str,
    args: argparse.Namespace,
    creds: list[Credential],
    subscribes: Subscribes | None,
) -> None:
    """``--warmup`` seconds of the scenario's requests, not counted."""
    if args.warmup:
        run_wrk(
            base,
            script(scenario, args.wrk_threads, creds, subscribes, "warm"),
            scenario=scenario,
            connections=args.connections,
            seconds=args.warmup,
            threads=args.wrk_threads,
        )


def measure(
    base: str,
    scenario: str,
    args: argparse.Namespace,
    creds: list[Credential],
    subscribes: Subscribes | None,
    *,
    warm: bool = True,
) -> Result:
    if warm:
        warm_up(base, scenario, args, creds, subscribes)
    result = run_wrk(
        base,
        script(scenario, args.wrk_threads, creds, subscribes, "measured"),
        scenario=scenario,
        connections=args.connections,
        seconds=args.duration,
        threads=args.wrk_threads,
    )
    print(
        f"  {scenario:<17} {result.rps:9,.1f} req/s  p50 {result.p50_ms:7.1f} ms  "
        f"p99 {result.p99_ms:7.1f} ms  errors {result.errors}  load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    return result


if __name__ == "__main__":
    sys.exit(main())
