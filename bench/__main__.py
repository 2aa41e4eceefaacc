"""Run every benchmark and write docs/BENCHMARKS.md: ``.venv/bin/python -m bench``.

Each benchmark script runs as a subprocess with ``--json PATH`` (see bench/contract.py);
their figures go into one summary table (value, baseline, ratio, target, pass or miss),
followed by each benchmark's own details. A script that is not there yet is reported as
missing; one that fails is reported with its exit status.

    .venv/bin/python -m bench                      # full sizes (tens of minutes)
    .venv/bin/python -m bench --quick              # smoke run; writes a scratch file
    .venv/bin/python -m bench --only pages,export --pages-env RATE_LIMIT_PER_ADDRESS=0
    .venv/bin/python -m bench --report-only         # rewrite the report from bench/results

Every script's figures are also kept in ``bench/results/NAME.json`` with when, at which
commit and under what load they were measured. A run with ``--only`` replaces those it
runs and takes the others from there, each shown with its own date and commit, so the
suite can be measured in parts (a long benchmark need not be repeated to refresh another).

``--quick`` passes ``--quick`` to every script (small sizes, short runs) and writes its
report to a scratch file unless ``--output`` says otherwise: quick figures are never the
ones to publish.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench.contract import first_row

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = (
    "audience",
    "export",
    "sweeps",
    "pages",
    "beside_campaign",
    "dispatch",
    "claims",
    "waiting_claims",
    "paused_claims",
    "delivery_retention",
    "funnel",
    "progress",
    "consent_log",
    "preference_save",
    "receipt",
    "campaign_list",
    "compliance_pages",
    "compliance_search",
    "cancel",
    "review_audience",
)
ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
RESULTS = ROOT / "bench" / "results"


@dataclass
class Outcome:
    name: str
    command: list[str] = field(default_factory=list)
    status: str = "ok"  # ok, missing, failed, earlier (taken from the results folder)
    exit_code: int | None = None
    seconds: float = 0.0
    report: dict[str, Any] | None = None


def run(name: str, args: argparse.Namespace, folder: Path) -> Outcome:
    script = ROOT / "bench" / f"{name}.py"
    outcome = Outcome(name)
    if not script.exists():
        outcome.status = "missing"
        return outcome
    out = folder / f"{name}.json"
    command = [sys.executable, str(script.relative_to(ROOT)), "--json", str(out)]
    if args.quick:
        command.append("--quick")
    if args.admin_url and name not in ("dispatch", "receipt"):  # no PostgreSQL there
        command += ["--admin-url", args.admin_url]
    if name in ("pages", "beside_campaign"):
        for item in args.pages_env:
            command += ["--env", item]
    outcome.command = command
    print(f"\n==> {shlex.join(command)}", flush=True)
    started = time.perf_counter()
    finished = subprocess.run(command, cwd=ROOT, check=False)
    outcome.seconds = time.perf_counter() - started
    outcome.exit_code = finished.returncode
    if out.exists():
        outcome.report = json.loads(out.read_text())
    if outcome.report is None:
        outcome.status = "failed"
    return outcome


def measured(outcome: Outcome, info: dict[str, str], load: tuple[float, ...]) -> None:
    """Stamp a fresh report with when, where and under what load it was measured."""
    if outcome.report is None:
        return
    outcome.report["measured"] = {
        "date": f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        "commit": info["commit"],
        "seconds": round(outcome.seconds),
        "exit_code": outcome.exit_code,
        "load_after": [round(v, 2) for v in load],
    }


def earlier(name: str, folder: Path) -> Outcome | None:
    path = folder / f"{name}.json"
    if not path.exists():
        return None
    outcome = Outcome(name, status="earlier")
    outcome.report = json.loads(path.read_text())
    outcome.seconds = float(outcome.report.get("measured", {}).get("seconds", 0))
    return outcome


def _number(value: float | None) -> str:
    if value is None:
        return ""
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:,.1f}"
    return f"{value:.3g}"


def _verdict(passed: bool | None) -> str:
    return {True: "pass", False: "**MISS**", None: ""}[passed]


def machine(admin_url: str) -> dict[str, str]:
    memory_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            memory_kb = int(line.split()[1])
    try:
        with psycopg.connect(admin_url, connect_timeout=5) as conn:
            postgres = first_row(conn.execute("SHOW server_version"))[0]
    except psycopg.Error as error:
        postgres = f"unknown ({type(error).__name__})"
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {
        "cpus": str(os.cpu_count()),
        "memory": f"{memory_kb / 1024 / 1024:.0f} GiB",
        "postgres": postgres,
        "python": platform.python_version(),
        "commit": commit or "unknown",
    }


def markdown(
    outcomes: list[Outcome],
    *,
    info: dict[str, str],
    started: dt.datetime,
    load_before: tuple[float, ...],
    load_after: tuple[float, ...],
    command: str,
    quick: bool,
) -> str:
    lines = [
        "# Benchmarks",
        "",
        "The figures SPEC §6 asks for, measured by the scripts in `bench/` and written here by "
        "one command:",
        "",
        "```sh",
        command,
        "```",
        "",
        "Each script can also be run alone (see its docstring); `--json PATH` writes its "
        "figures for this report and `--quick` makes a fast smoke run at small sizes. Ratios "
        "matter more than absolute times: both sides of each comparison run on the same "
        "machine in the same run.",
        "",
    ]
    if quick:
        lines += [
            "> **Quick smoke run**: reduced sizes and durations. These figures only show "
            "that every benchmark runs; they are not the ones to quote.",
            "",
        ]
    lines += [
        f"- **Date:** {started:%Y-%m-%d %H:%M} UTC, commit `{info['commit']}`.",
        f"- **Machine:** {info['cpus']} CPUs, {info['memory']} RAM, PostgreSQL "
        f"{info['postgres']}, Python {info['python']}.",
        "- **Load average** (1, 5, 15 min): "
        f"{' / '.join(f'{v:.2f}' for v in load_before)} before, "
        f"{' / '.join(f'{v:.2f}' for v in load_after)} after.",
        "",
        "## Summary",
        "",
        "| benchmark | figure | value | baseline | ratio | target | result | measured |",
        "|---|---|---:|---|---:|---|---|---|",
    ]
    for outcome in outcomes:
        if outcome.report is None:
            reason = {
                "missing": f"`bench/{outcome.name}.py` is not present",
                "unmeasured": "not measured yet (no earlier figures in the results folder)",
            }.get(outcome.status, f"failed (exit status {outcome.exit_code})")
            lines.append(f"| {outcome.name} | {reason} | | | | | not run | |")
            continue
        for figure in outcome.report["figures"]:
            unit = figure["unit"]
            value = f"{_number(figure['value'])} {unit}"
            baseline = (
                f"{_number(figure['baseline'])} {unit} ({figure['baseline_name']})"
                if figure.get("baseline") is not None
                else ""
            )
            ratio = f"{figure['ratio']:.2f}×" if figure.get("ratio") is not None else ""
            stamp = outcome.report.get("measured", {})
            when = f"{stamp['date'][:10]} `{stamp['commit']}`" if stamp else ""
            lines.append(
                f"| {outcome.report['title']} | {figure['figure']} | {value} | {baseline} "
                f"| {ratio} | {figure.get('target', '')} | {_verdict(figure.get('passed'))} "
                f"| {when} |"
            )
    for outcome in outcomes:
        if outcome.report is None:
            continue
        report = outcome.report
        stamp = report.get("measured", {})
        when = (
            f" Measured {stamp['date']} at commit `{stamp['commit']}`"
            + (
                f", load average {' / '.join(str(v) for v in stamp['load_after'])} after it"
                if stamp.get("load_after")
                else ""
            )
            + (
                "; taken from an earlier run of this command."
                if outcome.status == "earlier"
                else "."
            )
            if stamp
            else ""
        )
        lines += [
            "",
            f"## {report['title']}",
            "",
            f"Command: `{report['command']}` ({outcome.seconds:.0f} s"
            + (f", exit status {outcome.exit_code}" if outcome.exit_code else "")
            + ")."
            + when,
            "",
            report["details_markdown"].strip(),
        ]
    missing = [o.name for o in outcomes if o.report is None]
    if missing:
        lines += ["", "## Not run", ""]
        for outcome in outcomes:
            if outcome.status == "missing":
                lines.append(f"- `bench/{outcome.name}.py`: not present in this checkout.")
            elif outcome.status == "unmeasured":
                lines.append(f"- `bench/{outcome.name}.py`: not measured yet.")
            elif outcome.report is None:
                lines.append(
                    f"- `bench/{outcome.name}.py`: exit status {outcome.exit_code}, no figures "
                    "written (its output above the report says why)."
                )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run of every script")
    parser.add_argument("--only", help=f"comma-separated subset of {', '.join(BENCHMARKS)}")
    parser.add_argument(
        "--output",
        type=Path,
        help="where to write the report (default docs/BENCHMARKS.md; a scratch file with --quick)",
    )
    parser.add_argument("--admin-url", help="PostgreSQL server the scripts create databases on")
    parser.add_argument(
        "--pages-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for the portal under bench/pages.py (repeatable)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: rewrite the report from the results folder",
    )
    parser.add_argument(
        "--results",
        type=Path,
        help="folder of each benchmark's latest figures (default bench/results; a scratch "
        "folder with --quick)",
    )
    args = parser.parse_args()
    names: tuple[str, ...] = BENCHMARKS
    if args.report_only:
        names = ()
    elif args.only:
        names = tuple(n.strip() for n in args.only.split(",") if n.strip())
        unknown = set(names) - set(BENCHMARKS)
        if unknown:
            parser.error(f"unknown benchmarks: {', '.join(sorted(unknown))}")

    started = dt.datetime.now(dt.UTC)
    info = machine(args.admin_url or ADMIN_URL)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        results = args.results or (Path(scratch) / "results" if args.quick else RESULTS)
        results.mkdir(parents=True, exist_ok=True)
        runs = Path(scratch) / "run"
        runs.mkdir()
        outcomes = []
        for name in BENCHMARKS:
            if name in names:
                outcome = run(name, args, runs)
                measured(outcome, info, os.getloadavg())
                if outcome.report is not None:
                    (results / f"{name}.json").write_text(
                        json.dumps(outcome.report, indent=2, ensure_ascii=False) + "\n"
                    )
            else:
                outcome = earlier(name, results) or Outcome(name, status="unmeasured")
            outcomes.append(outcome)
        load_after = os.getloadavg()
        output = args.output
        if output is None:
            output = (
                Path(tempfile.gettempdir()) / "BENCHMARKS.quick.md"
                if args.quick
                else ROOT / "docs" / "BENCHMARKS.md"
            )
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(
            markdown(
                outcomes,
                info=info,
                started=started,
                load_before=load_before,
                load_after=load_after,
                command=shlex.join([".venv/bin/python", "-m", "bench", *sys.argv[1:]]),
                quick=args.quick,
            )
        )
    print(f"\nreport written to {output}")
    for outcome in outcomes:
        print(f"  {outcome.name:<9} {outcome.status:<8} {outcome.seconds:6.0f} s")
    print(f"figures kept in {results}")
    return 0 if all(o.status != "failed" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
