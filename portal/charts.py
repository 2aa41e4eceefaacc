"""What every server-rendered SVG chart shares: a round scale for its values and labels
spaced so they never touch. No database, no Flask: the compliance dashboard's bars
(:mod:`portal.compliance.charts`) and a campaign's delivery funnel
(:mod:`portal.campaigns.funnel_chart`) both build on it.

A chart is drawn in its own ``viewBox`` units and scales as a whole, so labels kept apart
in those units stay apart at every width the page is shown at.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Tick:
    """A gridline of the value axis: where it is drawn and the value it marks."""

    y: float
    value: int


@dataclass(frozen=True)
class Label:
    """A label of the category or time axis, centred at ``x``."""

    x: float
    text: str


def nice_step(peak: int, most: int = 4) -> int:
    """A round step (1, 2, 5 × a power of ten) giving at most ``most`` gridlines above zero."""
    step = 1
    while peak / step > most:
        for factor in (2, 5, 10):
            if peak / (step * factor) <= most:
                return step * factor
        step *= 10
    return step


def value_scale(peak: int, most: int = 4) -> tuple[int, int]:
    """(top of the axis, step between gridlines) for values up to ``peak``: the axis ends at
    a whole number of steps, never below 1."""
    step = nice_step(max(peak, 1), most)
    top = step * max(1, -(-max(peak, 1) // step))
    return top, step


def ticks(top: int, step: int, *, baseline: float, scale: float) -> list[Tick]:
    """The gridlines from zero to ``top``, ``scale`` units per value above ``baseline``."""
    return [Tick(round(baseline - v * scale, 1), v) for v in range(0, top + 1, step)]


def label_every(gap: float, space: float) -> int:
    """Label every n-th place: the smallest n whose labels are ``space`` apart, for places
    ``gap`` units apart."""
    return max(1, math.ceil(space / gap))


def spread(wanted: list[float], *, gap: float, low: float, high: float) -> list[float]:
    """Positions as close to ``wanted`` (in order, top first) as they can be while at least
    ``gap`` apart and within ``low``..``high``: labels at the ends of lines that would
    otherwise sit on one another."""
    placed: list[float] = []
    for want in wanted:
        y = max(want, low)
        if placed and y < placed[-1] + gap:
            y = placed[-1] + gap
        placed.append(y)
    # Pushed past the bottom: the last goes to the bottom, those above it only as far up
    # as the gaps need.
    if placed and placed[-1] > high:
        placed[-1] = high
        for i in range(len(placed) - 2, -1, -1):
            placed[i] = min(placed[i], placed[i + 1] - gap)
    return [round(y, 1) for y in placed]
