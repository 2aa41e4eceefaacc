"""Background jobs by name: what the scheduler runs and ``portal run-job NAME`` runs once."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from flask import Flask


class Progress(Protocol):
    def start(self, total: int) -> None: ...
    def advance(self, count: int) -> None: ...


class NoProgress:
    def start(self, total: int) -> None:
        pass

    def advance(self, count: int) -> None:
        pass


@dataclass
class JobReport:
    name: str
    processed: int = 0
    changed: int = 0
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        text = f"{self.name}: {self.processed} rows looked at, {self.changed} changed"
        if self.problems:
            text += f", {len(self.problems)} problems"
        return text + f" in {self.seconds:.2f} s"


JobFunction = Callable[[Flask, Progress], JobReport]
JOBS: dict[str, JobFunction] = {}


def job(name: str) -> Callable[[JobFunction], JobFunction]:
    def register(function: JobFunction) -> JobFunction:
        JOBS[name] = function
        return function

    return register


def _load() -> None:
    """Import every module that registers jobs."""
    import portal.campaigns.jobs
    import portal.compliance.jobs
    import portal.ratelimit
    import portal.retention.jobs
    import portal.subscriptions.jobs  # noqa: F401


def run_job(app: Flask, name: str, progress: Progress | None = None) -> JobReport:
    _load()
    if name not in JOBS:
        raise KeyError(name)
    started = time.perf_counter()
    report = JOBS[name](app, progress or NoProgress())
    report.seconds = time.perf_counter() - started
    return report


def job_names() -> list[str]:
    _load()
    return sorted(JOBS)
