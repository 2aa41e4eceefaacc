"""Does a process serve the preference centre as cheaply after sending a campaign as before?

``bench/pages.py``'s ``idle`` / ``idle-after-campaign`` pair asks it of gunicorn's workers,
where the machine's other load moves every req/s. This asks it of one process, in CPU time
(``time.process_time``), which that load moves far less: the portal's app in production
mode on a fresh PostgreSQL database of ``--subscribers`` (``bench/audience.py``'s data, every
subscription on the fake push service), ``--requests`` ``GET /preferences`` through the
test client, then a campaign to ``security-alerts`` (nearly everyone) sent to the end by
this process's own dispatcher, then the same requests again. Each measurement is taken
twice, and once more after a full garbage collection; with each, the objects the garbage
collector tracks, the thread count and the load average.

    .venv/bin/python bench/after_campaign.py --subscribers 250000
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psycopg
from flask import Flask

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import pages  # noqa: E402
from bench.audience import create_database, database_urls, drop_database, populate  # noqa: E402
from bench.contract import first_row  # noqa: E402
from portal.identity import preference_link_token  # noqa: E402

BASE = "https://portal.bench.example"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--admin-url", default=pages.ADMIN_URL)
    parser.add_argument("--subscribers", type=int, default=250_000)
    parser.add_argument("--requests", type=int, default=400)
    args = parser.parse_args()

    name = f"bench_after_{uuid.uuid4().hex[:8]}"
    pg_url, sa_url = database_urls(args.admin_url, name)
    create_database(args.admin_url, name)
    try:
        populate(sa_url, args.subscribers)
        from tests.fakepush import FakePushProcess

        with (
            FakePushProcess(decrypt=False, record=False) as push,
            tempfile.TemporaryDirectory() as folder,
        ):
            environ = pages.portal_environ(sa_url, Path(folder) / "instance")
            pages.retarget(pg_url, push.endpoint_base, environ["SUBSCRIPTION_AUTH_KEY_V1"])
            environ |= {
                "PUSH_ALLOWED_HOSTS": push.origin.removeprefix("https://"),
                "PUSH_CA_BUNDLE": push.ca_bundle,
            }
            os.environ.update(environ)
            from portal import create_app
            from portal.delivery.jobs import dispatcher_for

            app = create_app()
            signer = Flask("bench")
            signer.config["SECRET_KEY"] = environ["SECRET_KEY"]
            clients = []
            for subscriber in pages.subscriber_ids(pg_url, 20):
                client = app.test_client()
                token = preference_link_token(subscriber, signer)
                client.get(f"/preferences?token={token}", base_url=BASE)
                clients.append(client)

            def measure(label: str) -> None:
                for client in clients[:5]:  # warm
                    client.get("/preferences", base_url=BASE)
                gc.collect()
                tracked = len(gc.get_objects())
                cpu, wall, statuses = time.process_time(), time.perf_counter(), set()
                for i in range(args.requests):
                    answer = clients[i % len(clients)].get("/preferences", base_url=BASE)
                    statuses.add(answer.status_code)
                cpu = (time.process_time() - cpu) / args.requests * 1000
                wall = (time.perf_counter() - wall) / args.requests * 1000
                print(
                    f"| {label} | {cpu:.2f} ms | {wall:.2f} ms | {tracked:,} "
                    f"| {threading.active_count()} | {sorted(statuses)} "
                    f"| {os.getloadavg()[0]:.1f} |",
                    flush=True,
                )

            print(
                "| when | CPU per request | wall per request | objects tracked by the GC "
                "| threads | statuses | load |"
            )
            print("|---|---:|---:|---:|---:|---|---:|")
            measure("before the campaign")
            measure("before the campaign, again")
            campaign = uuid.uuid4()
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO campaign (id, topic_id, title, body, urgency, ttl, send_at, "
                    "status, created_by, created_at, launched_at, is_test) SELECT %s, id, "
                    "'Bench', 'After a campaign', 'normal', 86400, now(), 'scheduled', "
                    "'bench', now(), now(), false FROM topic WHERE slug = 'security-alerts'",
                    (campaign,),
                )
                started = time.perf_counter()
                with app.app_context():
                    dispatcher = dispatcher_for(app)
                    while True:
                        dispatcher.tick()
                        (status,) = first_row(
                            conn.execute("SELECT status FROM campaign WHERE id = %s", (campaign,))
                        )
                        if status not in ("scheduled", "sending"):
                            break
                (sent,) = first_row(
                    conn.execute(
                        "SELECT count(*) FROM delivery WHERE campaign_id = %s", (campaign,)
                    )
                )
            print(
                f"| campaign: {sent:,} deliveries, {status} in "
                f"{time.perf_counter() - started:.0f} s | | | | | | |",
                flush=True,
            )
            measure("after it")
            measure("after it, again")
            gc.collect()
            measure("after a full collection")
    finally:
        drop_database(args.admin_url, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
