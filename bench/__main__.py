"""Run every benchmark and write docs/BENCHMARKS.md: ``.venv/bin/python -m bench``.

Each benchmark script runs as a subprocess with ``--json PATH`` (see bench/contract.py);
their figures go into one summary table (value, baseline, ratio, target, pass or miss),
followed by each benchmark's own details. A script that is not there yet is reported as
missing; one that fails is reported with its exit status.

    .venv/bin/python -m bench                      # full sizes (tens of minutes)
    .venv/bin/python -m bench --quick              # smoke run; writes a scratch file
    .venv/bin/python -m bench --only pages,export --pages-env RATE_LIMIT_ENABLED=off

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

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ("audience", "export", "sweeps", "pages", "dispatch")
ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"


@dataclass
class Outcome:
    name: str
    command: list[str] = field(default_factory=list)
    status: str = "ok"  # ok, missing, failed
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
    if args.admin_url and name != "dispatch":
        command += ["--admin-url", args.admin_url]
    if name == "pages":
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
            postgres = conn.execute("SHOW server_version").fetchone()[0]
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
        "| benchmark | figure | value | baseline | ratio | target | result |",
        "|---|---|---:|---|---:|---|---|",
    ]
    for outcome in outcomes:
        if outcome.report is None:
            reason = (
                f"`bench/{outcome.name}.py` is not present"
                if outcome.status == "missing"
                else f"failed (exit status {outcome.exit_code})"
            )
            lines.append(f"| {outcome.name} | {reason} | | | | | not run |")
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
            lines.append(
                f"| {outcome.report['title']} | {figure['figure']} | {value} | {baseline} "
                f"| {ratio} | {figure.get('target', '')} | {_verdict(figure.get('passed'))} |"
            )
    for outcome in outcomes:
        if outcome.report is None:
            continue
        report = outcome.report
        lines += [
            "",
            f"## {report['title']}",
            "",
            f"Command: `{report['command']}` ({outcome.seconds:.0f} s"
            + (f", exit status {outcome.exit_code}" if outcome.exit_code else "")
            + ").",
            "",
            report["details_markdown"].strip(),
        ]
    missing = [o.name for o in outcomes if o.report is None]
    if missing:
        lines += ["", "## Not run", ""]
        for outcome in outcomes:
            if outcome.status == "missing":
                lines.append(f"- `bench/{outcome.name}.py`: not present in this checkout.")
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
    parser.add_argument("--keep-json", type=Path, help="keep each script's JSON in this folder")
    args = parser.parse_args()
    names = BENCHMARKS
    if args.only:
        names = tuple(n.strip() for n in args.only.split(",") if n.strip())
        unknown = set(names) - set(BENCHMARKS)
        if unknown:
            parser.error(f"unknown benchmarks: {', '.join(sorted(unknown))}")

    started = dt.datetime.now(dt.UTC)
    info = machine(args.admin_url or ADMIN_URL)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        folder = args.keep_json or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        outcomes = [run(name, args, folder) for name in names]
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
    return 0 if all(o.status != "failed" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
