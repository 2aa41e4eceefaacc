"""Send throughput of the dispatch core against pywebpush, side by side in one run.

    .venv/bin/python bench/send_core.py [--messages 5000] [--rounds 3] [--no-decrypt]

Every way sends the same payload to distinct subscriptions on the fake push service
(tests/fakepush.py) over HTTPS on loopback, with real encryption. The service runs in a
child process so that sender and service each can have a core; it verifies every VAPID
header and, unless --no-decrypt, decrypts every body with the subscription's key, so a
message a browser could not read is not counted.

  (a)  pywebpush.webpush() per message with its defaults: a new TLS connection and a new
       VAPID signature every time.
  (b)  pywebpush.WebPusher(...).send() per message with one shared requests.Session and
       the VAPID header signed once and reused: the kindest way to run pywebpush.
  (b2) pywebpush.webpush(..., requests_session=session) per message: shared connections
       but a VAPID signature per message, as webpush() does.
  (c)  portal.push: encrypt() + the cached VapidSigner + HttpsPushTransport with
       --concurrency transfers in flight, in send_batch() calls of --batch requests that
       are encrypted lazily as slots free up, as the dispatch engine will call it.

requests, and so pywebpush, takes its CA from REQUESTS_CA_BUNDLE before anything else
(a Session's verify= included), and webpush() has no other way in: this script points
that variable at the fake CA. The dispatch core gets the CA as PUSH_CA_BUNDLE gives it.

Columns: messages per second; CPU per message of this process (the sender) and of the
service; "others" is the share of the machine's CPU that other processes took meanwhile
(on a shared machine that is what makes runs differ). With --rounds N each way runs N
times, interleaved, and the table shows each way's best round. Last, the throughput the
CPU per message would allow on an otherwise idle machine: (a) and (b) send one message
at a time, so sender and service take turns; (c) keeps every core busy.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import requests  # noqa: E402
from pywebpush import Vapid, WebPusher, webpush  # noqa: E402

from portal.config import b64url_decode, generate_vapid_keys  # noqa: E402
from portal.push.transport import HttpsPushTransport, PushRequest  # noqa: E402
from portal.push.vapid import VapidSigner  # noqa: E402
from tests.factories import SubscriptionFactory  # noqa: E402
from tests.fakepush import FakePushProcess  # noqa: E402

SUBJECT = "mailto:bench@example.test"
TTL = 3600


def _process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_busy() -> float:
    """CPU seconds all processes have used since boot (every core)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@dataclass
class Result:
    name: str
    messages: int
    seconds: float
    sender_cpu: float
    service_cpu: float
    others: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds


def measure(name: str, service: FakePushProcess, count: int, run: Callable[[], int]) -> Result:
    before = service.stats()
    busy0, sender0, service0 = _machine_busy(), time.process_time(), _process_cpu(service.pid)
    start = time.perf_counter()
    sent = run()
    seconds = time.perf_counter() - start
    sender = time.process_time() - sender0
    served = _process_cpu(service.pid) - service0
    others = max(_machine_busy() - busy0 - sender - served, 0.0) / (seconds * (os.cpu_count() or 1))
    after = service.stats()
    accepted = after["accepted"] - before["accepted"]
    if sent != count or accepted != count:
        raise SystemExit(f"{name}: {sent} answered 201 and {accepted} accepted of {count}")
    if service.decrypting and after["decrypted"] - before["decrypted"] != count:
        raise SystemExit(f"{name}: not every message decrypted")
    result = Result(name, count, seconds, sender, served, others)
    print(f"  {name:<40} {result.rate:8.0f} msg/s   (others {others:4.0%})", flush=True)
    return result


def way_a(infos: list[dict[str, Any]], payload: str, private_key: str) -> int:
    ok = 0
    for info in infos:
        response = webpush(
            info,
            data=payload,
            vapid_private_key=private_key,
            vapid_claims={"sub": SUBJECT},
            ttl=TTL,
            timeout=10,
        )
        ok += response.status_code == 201  # type: ignore[union-attr]
    return ok


def way_b(infos: list[dict[str, Any]], payload: str, private_key: str, origin: str) -> int:
    vapid_headers = Vapid.from_string(private_key).sign(
        {"sub": SUBJECT, "aud": origin, "exp": int(time.time()) + 12 * 3600}
    )
    ok = 0
    with requests.Session() as session:
        session.verify = os.environ["REQUESTS_CA_BUNDLE"]
        for info in infos:
            response = WebPusher(info, requests_session=session).send(
                payload, dict(vapid_headers), ttl=TTL, timeout=10
            )
            ok += response.status_code == 201  # type: ignore[union-attr]
    return ok


def way_b2(infos: list[dict[str, Any]], payload: str, private_key: str) -> int:
    vapid = Vapid.from_string(private_key)
    ok = 0
    with requests.Session() as session:
        session.verify = os.environ["REQUESTS_CA_BUNDLE"]
        for info in infos:
            response = webpush(
                info,
                data=payload,
                vapid_private_key=vapid,
                vapid_claims={"sub": SUBJECT},
                ttl=TTL,
                timeout=10,
                requests_session=session,
            )
            ok += response.status_code == 201  # type: ignore[union-attr]
    return ok


def way_c(
    keys: list[tuple[str, bytes, bytes]],
    payload: bytes,
    signer: VapidSigner,
    ca_bundle: str,
    concurrency: int,
    batch: int,
) -> int:
    ok = 0
    with HttpsPushTransport(signer, ca_bundle=ca_bundle, concurrency=concurrency) as transport:
        for start in range(0, len(keys), batch):
            requests_ = (
                PushRequest.encrypted(endpoint, payload, p256dh=p256dh, auth=auth, ttl=TTL)
                for endpoint, p256dh, auth in keys[start : start + batch]
            )
            ok += sum(r.status == 201 for r in transport.send_batch(requests_))
    return ok


def _payload(size: int) -> bytes:
    text = '{"title":"Spring sale","body":"%s","url":"https://example.test/sale"}'
    return (text % ("x" * max(size - 64, 0))).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000, help="per way and round")
    parser.add_argument("--webpush-messages", type=int, help="for (a) (default: --messages)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1000, help="requests per send_batch()")
    parser.add_argument("--payload-bytes", type=int, default=256)
    parser.add_argument("--no-decrypt", action="store_true", help="the service skips decryption")
    args = parser.parse_args()

    private_key, public_key = generate_vapid_keys()
    signer = VapidSigner(private_key, SUBJECT, public_key=public_key)
    payload = _payload(args.payload_bytes)
    text = payload.decode()
    count_a = args.webpush_messages or args.messages

    with FakePushProcess(decrypt=not args.no_decrypt, record=False) as service:
        os.environ["REQUESTS_CA_BUNDLE"] = service.ca_bundle
        factory = SubscriptionFactory()
        print(f"preparing {args.messages} subscriptions on {service.origin} …", flush=True)
        subs = [factory(base=service.endpoint_base) for _ in range(args.messages)]
        service.register_many(subs)
        infos = [s.to_json() for s in subs]
        keys = [(s.endpoint, b64url_decode(s.p256dh), s.auth) for s in subs]
        print(
            f"{len(payload)}-byte payloads, {os.cpu_count()} cores, "
            f"service decrypts: {not args.no_decrypt}, rounds: {args.rounds}",
            flush=True,
        )
        ways: list[tuple[str, int, Callable[[], int]]] = [
            ("(a)  webpush() per message", count_a,
             lambda: way_a(infos[:count_a], text, private_key)),
            ("(b)  WebPusher.send(), shared Session", args.messages,
             lambda: way_b(infos, text, private_key, service.origin)),
            ("(b2) webpush(requests_session=…)", args.messages,
             lambda: way_b2(infos, text, private_key)),
            (f"(c)  dispatch core, concurrency {args.concurrency}", args.messages,
             lambda: way_c(keys, payload, signer, service.ca_bundle, args.concurrency,
                           args.batch)),
        ]  # fmt: skip
        best: dict[str, Result] = {}
        for round_number in range(1, args.rounds + 1):
            print(f"round {round_number}", flush=True)
            for name, count, run in ways:
                result = measure(name, service, count, run)
                if name not in best or result.rate > best[name].rate:
                    best[name] = result
        stats = service.stats()

    results = list(best.values())
    a, b, c = results[0], results[1], results[-1]
    print()
    header = (
        f"{'way':<40} {'msgs':>6} {'seconds':>8} {'msg/s':>7} {'sender µs':>10} "
        f"{'service µs':>10} {'others':>7} {'× (a)':>7} {'× (b)':>7}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r.name:<40} {r.messages:>6} {r.seconds:>8.2f} {r.rate:>7.0f} "
            f"{r.sender_cpu / r.messages * 1e6:>10.0f} {r.service_cpu / r.messages * 1e6:>10.0f} "
            f"{r.others:>7.0%} {r.rate / a.rate:>7.1f} {r.rate / b.rate:>7.1f}"
        )
    print()
    # What the CPU per message allows on an otherwise idle machine: (a) and (b) send one
    # message at a time, so sender and service take turns; (c) keeps both busy at once.
    cores = os.cpu_count() or 1
    ceilings = {
        r.name: (cores if r is c else 1) / ((r.sender_cpu + r.service_cpu) / r.messages)
        for r in results
    }
    print("ceiling from CPU per message on an idle machine (msg/s):")
    for name, ceiling in ceilings.items():
        print(
            f"  {name:<40} {ceiling:8.0f}   × (a) {ceiling / ceilings[a.name]:5.1f}"
            f"   × (b) {ceiling / ceilings[b.name]:5.1f}"
        )
    print()
    print(f"fake service totals: {stats}")
    print(f"VAPID cache of (c): {signer.stats}")
    print(
        f"targets: (c) ≥ 5× (b): {'met' if c.rate >= 5 * b.rate else 'not met'} "
        f"({c.rate / b.rate:.1f}×); (c) ≥ 50× (a): "
        f"{'met' if c.rate >= 50 * a.rate else 'not met'} ({c.rate / a.rate:.1f}×)"
    )


if __name__ == "__main__":
    main()
