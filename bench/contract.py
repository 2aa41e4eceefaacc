"""What every benchmark script hands the runner (``python -m bench``).

Each script takes ``--json PATH`` (write its figures there as well as printing its usual
tables) and ``--quick`` (a smoke run at small sizes: proves the script works end to end;
its figures are not the ones to quote). The JSON document::

    {"benchmark": "audience", "title": "Audience", "command": "<command line>",
     "figures": [{"figure": "...", "value": 1.2, "unit": "s" | "msg/s" | "req/s" | "MiB",
                  "baseline": 0.9 or null, "baseline_name": "...", "ratio": 1.3 or null,
                  "target": "≤ 2×", "passed": true | false | null}],
     "details_markdown": "<markdown>"}
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


def first_row(cursor: Any) -> Any:
    """The row a query that always answers one (``SHOW``, ``count(*)``, a row known to
    exist) answered; its absence is the benchmark's error, said plainly."""
    row = cursor.fetchone()
    if row is None:
        raise SystemExit("a query that always answers a row answered none")
    return row


def median_time(work: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """The median of ``repeat`` timings of ``work`` after one untimed call (the pages it
    reads in memory), and that first call's answer."""
    answer = work()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times), answer


@dataclass
class Figure:
    figure: str
    value: float
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    ratio: float | None = None
    target: str = ""
    passed: bool | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", metavar="PATH", type=Path, help="also write the figures to PATH as JSON"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a fast smoke run at small sizes (not for quoting)"
    )


def command_line() -> str:
    return shlex.join([Path(sys.executable).name, *sys.argv])


def write(
    path: Path | None,
    *,
    benchmark: str,
    title: str,
    figures: list[Figure],
    details_markdown: str,
) -> None:
    if path is None:
        return
    document: dict[str, Any] = {
        "benchmark": benchmark,
        "title": title,
        "command": command_line(),
        "figures": [asdict(f) for f in figures],
        "details_markdown": details_markdown.strip() + "\n",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    print(f"figures written to {path}")
