"""What a background job returns and how it reports progress (a leaf: job functions in
every package import it; the table of jobs in :mod:`portal.jobs` imports them)."""

from __future__ import annotations

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
