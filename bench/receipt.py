"""Consent receipt verification offline, with no project install (SPEC §7: < 50 ms).

A real receipt is made by the portal (SQLite, a person with ``--choices`` explicit
choices among as many topics, behind ``--log-size`` other events, so each audit path is
⌈log2 n⌉ hashes long), then checked by the standalone ``tools/verify_receipt.py`` copied
into an empty folder and run with ``python3 -I`` in a fresh virtual environment holding
only ``cryptography`` (the release the project locks), as a person would after ``pip
install cryptography``: nothing of the portal importable. Measured in one run:

- **whole check**: the tool's process from start to exit, ``--runs`` times (median, p95):
  what the person waits for;
- **floor**: a Python process that only imports what the tool imports (``json``,
  ``hashlib``, ``base64`` … and ``cryptography``'s Ed25519) and exits: the part of the whole check
  that is the interpreter, not the check;
- **verification alone**: ``verify_receipt`` on the parsed receipt, in one process
  (median over ``--runs``).

    .venv/bin/python bench/receipt.py [--runs 30] [--choices 8] [--log-size 1000000] [--json PATH]
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.contract import Figure, add_arguments, write  # noqa: E402

TOOL = ROOT / "tools" / "verify_receipt.py"
FLOOR = (  # the tool's own imports
    "import base64, binascii, hashlib, json, os, struct, sys\n"
    "from cryptography.exceptions import InvalidSignature\n"
    "from cryptography.hazmat.primitives.asymmetric import ed25519\n"
)


def _others(app: Any, who: uuid.UUID, count: int, now: dt.datetime) -> None:
    """``count`` events of someone else's, in batches."""
    from portal.consent import log
    from portal.consent.models import EventKind
    from portal.db import db

    for start in range(0, count, 10_000):
        with db.begin(app) as session:
            log.append_many(
                session,
                [
                    log.NewEvent(
                        kind=EventKind.ACCOUNT_LINKED,
                        subscriber_id=who,
                        source="system",
                        actor="bench",
                        recorded_at=now,
                    )
                    for _ in range(min(10_000, count - start))
                ],
            )


def make_receipt(folder: Path, choices: int, log_size: int) -> tuple[dict[str, Any], str]:
    """A receipt from the portal's own code, and the log key's JSON."""
    from portal import create_app
    from portal.config import Settings
    from portal.consent import catalogue, receipts, tree
    from portal.consent.models import PreferenceState
    from portal.consent.preferences import Decision, apply_decisions
    from portal.db import db, uuid7
    from portal.migrate import upgrade
    from portal.seams import current_portal
    from portal.subscriptions.models import Subscriber

    environ = {"PORTAL_SCHEDULER": "off", "PORTAL_DEMO_DATA": "off"}
    app = create_app(Settings.from_env(environ, str(folder / "instance")))
    upgrade(app.extensions["portal.db"].engine)
    settings = current_portal(app).settings
    key = tree.signing_key(settings.consent_log_signing_key)
    now = dt.datetime.now(dt.UTC)
    with db.begin(app) as session:
        catalogue.publish_policy(session, version="v1", text="We send what you choose.", now=now)
        topics = [
            catalogue.add_topic(
                session,
                slug=f"topic-{i}",
                category="News",
                label=f"Topic {i}",
                description="",
                transactional=False,
                default_state="opt_out",
                now=now,
            )
            for i in range(choices)
        ]
        others = uuid7()
        session.add(Subscriber(id=others, created_at=now))
    # Other people's events before and after the person's: the tree the proofs climb.
    _others(app, others, log_size // 2, now)
    person = uuid7()
    with db.begin(app) as session:
        session.add(Subscriber(id=person, created_at=now, region_code="EU"))
    with db.begin(app) as session:
        apply_decisions(
            session,
            person,
            [Decision(t, PreferenceState.OPT_IN) for t in topics],
            source="preference-centre",
            policy_version="v1",
            decided_at=now,
            recorded_at=now,
        )
    _others(app, others, log_size - log_size // 2, now)
    with db.begin(app) as session:
        while tree.integrate(session, key, now=now, gap_grace_seconds=10).leaves:
            pass
    with app.app_context():
        subscriber = db.session.get(Subscriber, person)
        assert subscriber is not None  # made above
        document = receipts.build_receipt(
            db.session,
            subscriber,
            catalogue.active_topics(db.session),
            key=key,
            controller=receipts.Controller("Bench Ltd", None, None, None),
            policy_url=lambda version: f"https://portal.example/policy/{version}",
            now=now,
            gap_grace_seconds=10,
        )
    from portal.consent import merkle

    key_json = json.dumps(merkle.log_key_to_json(key.public_key()))
    app.extensions["portal.db"].engine.dispose()
    assert uuid.UUID(document["pii_principal"]["subscriber_id"]) == person
    return document, key_json


def clean_python(folder: Path) -> tuple[list[str], str]:
    """A fresh venv with cryptography alone; the project's interpreter when pip cannot
    install it here (said in the report)."""
    import cryptography

    venv = folder / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], check=False)
    if made.returncode == 0:
        installed = subprocess.run(
            [
                str(venv / "bin" / "pip"),
                "install",
                "-q",
                f"cryptography=={cryptography.__version__}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if installed.returncode == 0:
            return [str(venv / "bin" / "python"), "-I"], (
                f"a fresh venv with cryptography {cryptography.__version__} alone"
            )
    return [sys.executable, "-I"], "the project's venv (pip could not make a clean one)"


def _times(command: list[str], cwd: Path, runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
        samples.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise SystemExit(f"{command} failed: {done.stderr}")
    return samples


def _p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--choices", type=int, default=8)
    parser.add_argument("--log-size", type=int, default=1_000_000)
    args = parser.parse_args()
    runs = 5 if args.quick else args.runs
    log_size = 2_000 if args.quick else args.log_size
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        receipt, key_json = make_receipt(folder, args.choices, log_size)
        elsewhere = folder / "elsewhere"
        elsewhere.mkdir()
        shutil.copy(TOOL, elsewhere / "verify_receipt.py")
        (elsewhere / "receipt.json").write_text(json.dumps(receipt, indent=2))
        (elsewhere / "log-key.json").write_text(key_json)
        python, interpreter = clean_python(folder)
        tool = [*python, "verify_receipt.py", "receipt.json", "--log-key", "log-key.json"]
        _times(tool, elsewhere, 2)  # warm the page cache
        whole = _times(tool, elsewhere, runs)
        floor = _times([*python, "-c", FLOOR], elsewhere, runs)
        # The copied file itself, loaded by path: not the portal's module.
        spec = importlib.util.spec_from_file_location("copied", elsewhere / "verify_receipt.py")
        assert spec is not None
        assert spec.loader is not None
        verify_receipt = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(verify_receipt)
        key = verify_receipt.parse_log_key(key_json)
        alone = []
        for _ in range(runs):
            started = time.perf_counter()
            verify_receipt.verify_receipt(receipt, key)
            alone.append(time.perf_counter() - started)
    load_after = os.getloadavg()
    tree_size = receipt["tree_head"]["tree_size"]
    path_length = len(receipt["events"][0]["audit_path"])
    median_whole, median_floor = statistics.median(whole), statistics.median(floor)
    median_alone = statistics.median(alone)
    figures = [
        Figure(
            "receipt check, the standalone tool's whole process (python3 -I)",
            round(median_whole * 1000, 1),
            "ms",
            baseline=round(median_floor * 1000, 1),
            baseline_name="a Python process importing the same modules and nothing else",
            ratio=round(median_whole / median_floor, 2),
            target="< 50 ms",
            passed=median_whole < 0.05,
        ),
        Figure(
            "receipt check, verification alone (one process, receipt parsed)",
            round(median_alone * 1000, 2),
            "ms",
            target="< 50 ms",
            passed=median_alone < 0.05,
        ),
    ]
    details = "\n".join(
        [
            f"A receipt of {args.choices} explicit choices ({len(receipt['events'])} events, "
            f"each with an audit path of {path_length} hashes) under a signed tree head of "
            f"{tree_size:,} leaves; made by the portal on SQLite, checked by "
            "`tools/verify_receipt.py` copied into an empty folder and run as "
            f"`python3 -I` in {interpreter} ({runs} runs each). Load average {load[0]:.1f} before, "
            f"{load_after[0]:.1f} after (2 CPUs).",
            "",
            "| what | median ms | p95 ms |",
            "|---|---|---|",
            f"| whole check: the tool's process, start to exit | {median_whole * 1000:.1f} | "
            f"{_p95(whole) * 1000:.1f} |",
            f"| floor: a process that only imports the same modules | "
            f"{median_floor * 1000:.1f} | {_p95(floor) * 1000:.1f} |",
            f"| verification alone, in process | {median_alone * 1000:.2f} | "
            f"{_p95(alone) * 1000:.2f} |",
            "",
            "The whole check minus the floor is what the check itself costs a fresh process "
            f"(parsing and verifying): {(median_whole - median_floor) * 1000:.1f} ms.",
        ]
    )
    print(details)
    write(
        args.json,
        benchmark="receipt",
        title="Consent receipt verification",
        figures=figures,
        details_markdown=details,
    )


if __name__ == "__main__":
    main()
