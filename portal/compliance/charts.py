"""Geometry of the dashboard's bar charts, drawn as SVG by the template (no JavaScript);
the scale and label spacing are :mod:`portal.charts`, shared with the campaign funnel.

One chart per topic: a pair of bars per week, opt-ins solid and opt-outs striped, each
with its number above it, so neither colour nor shape alone carries the meaning; the
page also gives the same numbers as a table.
"""

from __future__ import annotations

from dataclasses import dataclass

from portal.charts import Label, Tick, ticks, value_scale
from portal.charts import label_every as _label_every
from portal.compliance.services import TopicWeeks

WIDTH, HEIGHT = 640, 230
LEFT, RIGHT, TOP, BOTTOM = 44, 8, 18, 40
# The room a week label ("29 Dec" at 11 px, about 36 units wide) needs with a gap on each
# side. The chart scales as a whole, so labels that do not touch at 1280 px do not at 390 px.
LABEL_SPACE = 56


def label_every(group: float) -> int:
    """Label every n-th week: the smallest n whose labels are LABEL_SPACE apart, for weeks
    ``group`` units apart."""
    return _label_every(group, LABEL_SPACE)


@dataclass(frozen=True)
class Bar:
    kind: str  # "in" | "out"
    x: float
    y: float
    width: float
    height: float
    value: int


@dataclass(frozen=True)
class Chart:
    id: str
    title: str
    description: str
    width: int
    height: int
    baseline: float
    left: float
    right: float
    bars: list[Bar]
    ticks: list[Tick]
    labels: list[Label]


def weekly_chart(series: TopicWeeks, index: int) -> Chart:
    plot_width = WIDTH - LEFT - RIGHT
    plot_height = HEIGHT - TOP - BOTTOM
    top, step = value_scale(series.peak)
    scale = plot_height / top
    baseline = TOP + plot_height
    group = plot_width / len(series.weeks)
    bar = group * 0.34
    bars: list[Bar] = []
    labels: list[Label] = []
    every = label_every(group)
    for i, week in enumerate(series.weeks):
        start = LEFT + i * group + group * 0.14
        for offset, kind, value in ((0.0, "in", week.opt_in), (bar + 2, "out", week.opt_out)):
            height = value * scale
            bars.append(
                Bar(
                    kind,
                    round(start + offset, 1),
                    round(baseline - height, 1),
                    round(bar, 1),
                    round(height, 1),
                    value,
                )
            )
        # The newest week is always labelled; the others every n-th back from it.
        if (len(series.weeks) - 1 - i) % every == 0:
            labels.append(Label(round(LEFT + i * group + group / 2, 1), f"{week.week:%d %b}"))
    opt_in, opt_out = series.totals
    first, last = series.weeks[0].week, series.weeks[-1].week
    busiest = max(series.weeks, key=lambda w: (w.opt_in + w.opt_out, w.week))
    summary = (
        f"{opt_in} opt-ins and {opt_out} opt-outs over the {len(series.weeks)} weeks from "
        f"{first:%d %B %Y} to the week of {last:%d %B %Y}."
    )
    if opt_in or opt_out:
        summary += (
            f" Busiest week: {busiest.week:%d %B} ({busiest.opt_in} in, {busiest.opt_out} out)."
        )
    return Chart(
        id=f"chart-{index}",
        title=f"{series.topic.label}: opt-ins and opt-outs per week",
        description=summary,
        width=WIDTH,
        height=HEIGHT,
        baseline=baseline,
        left=LEFT,
        right=WIDTH - RIGHT,
        bars=bars,
        ticks=ticks(top, step, baseline=baseline, scale=scale),
        labels=labels,
    )
