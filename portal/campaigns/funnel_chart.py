"""The delivery funnel over time, laid out for the campaign page's SVG (no JavaScript).

Three lines of running totals — accepted, shown, clicked — from zero at the start of the
first period to each period's end. They differ in colour *and* in stroke (solid, dashed,
dotted), and each is named with its final figure at its right-hand end, so neither colour
nor pattern alone carries the meaning; the page gives the same figures as a table.

The chart is drawn in a narrow ``viewBox`` (400 units) so that at a phone's width its text
is still near its set size; the names at the line ends are kept LINE_LABEL_GAP apart and
the time labels TIME_LABEL_SPACE apart, in those units, so they touch at no width.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from portal.campaigns.funnel import DAY, HOUR, Bucket, Funnel
from portal.charts import Label, Tick, label_every, spread, ticks, value_scale

WIDTH, HEIGHT = 400, 220
LEFT, RIGHT, TOP, BOTTOM = 46, 104, 12, 30
# Text is 12 units; a time label ("12:45" or "29 Dec", about 34 units) with room each side.
TIME_LABEL_SPACE = 48
LINE_LABEL_GAP = 15
SERIES = (
    ("accepted", "Accepted"),
    ("shown", "Shown"),
    ("clicked", "Clicked"),
)


@dataclass(frozen=True)
class Line:
    kind: str  # accepted | shown | clicked: its class, and so its colour and stroke
    name: str
    points: str  # the polyline's "x,y x,y …"
    end_x: float
    end_y: float
    label_y: float  # where its name and figure are written, apart from the others
    total: int


@dataclass(frozen=True)
class FunnelChart:
    title: str
    description: str
    width: int
    height: int
    left: float
    right: float
    baseline: float
    lines: list[Line]
    ticks: list[Tick]
    labels: list[Label]


def period_words(seconds: int) -> str:
    """900 → "15-minute", 3600 → "1-hour", 86400 → "1-day", 604800 → "1-week"."""
    for unit, word in ((7 * DAY, "week"), (DAY, "day"), (HOUR, "hour"), (60, "minute")):
        if seconds % unit == 0:
            return f"{seconds // unit}-{word}"
    return f"{seconds}-second"


def time_label(when: dt.datetime, width: int) -> str:
    return f"{when:%d %b}" if width >= DAY else f"{when:%H:%M}"


def _span_words(funnel: Funnel) -> str:
    first, last = funnel.buckets[0].start, funnel.buckets[-1].end
    if funnel.width is not None and funnel.width >= DAY:
        return f"from {first:%d %B %Y} to {last:%d %B %Y}"
    if first.date() == last.date():
        return f"from {first:%H:%M} to {last:%H:%M} UTC on {first:%d %B %Y}"
    return f"from {first:%d %B %Y %H:%M} to {last:%d %B %Y %H:%M} UTC"


@dataclass(frozen=True)
class Period:
    """A row of the chart's table: the period in words and its running totals."""

    text: str
    start: dt.datetime
    end: dt.datetime
    so_far: bool  # it has not ended yet
    bucket: Bucket


def one_day(funnel: Funnel) -> dt.date | None:
    """The day every period of shorter than a day falls on, if there is one."""
    if not funnel.buckets or (funnel.width or 0) >= DAY:
        return None
    first = funnel.buckets[0].start.date()
    last = (funnel.buckets[-1].end - dt.timedelta(microseconds=1)).date()
    return first if first == last else None


def periods(funnel: Funnel) -> list[Period]:
    """The chart's periods as its table gives them: "12:00 to 12:05" (UTC) when they all fall
    on one day (:func:`one_day`, which the caption names), "01 Jan 23:55 to 00:00" when not,
    or days."""
    width = funnel.width or 0
    dated = one_day(funnel) is None
    rows = []
    for bucket in funnel.buckets:
        if width >= DAY:
            last_day = bucket.end - dt.timedelta(days=1)
            text = f"{bucket.start:%d %b %Y}"
            if last_day.date() != bucket.start.date():
                text += f" to {last_day:%d %b %Y}"
        else:
            text = f"{bucket.start:%H:%M} to {bucket.end:%H:%M}"
            if dated:
                text = f"{bucket.start:%d %b} {text}"
        rows.append(Period(text, bucket.start, bucket.end, bucket.end > funnel.now, bucket))
    return rows


def funnel_chart(funnel: Funnel) -> FunnelChart | None:
    """The chart of ``funnel``'s periods; None when there are none (nothing accepted)."""
    if not funnel.buckets or funnel.width is None:
        return None
    plot_width = WIDTH - LEFT - RIGHT
    plot_height = HEIGHT - TOP - BOTTOM
    baseline = TOP + plot_height
    top, step = value_scale(funnel.accepted)
    scale = plot_height / top
    n = len(funnel.buckets)
    gap = plot_width / n
    xs = [round(LEFT + i * gap, 1) for i in range(n + 1)]

    lines: list[Line] = []
    for kind, name in SERIES:
        values = [0] + [getattr(b, f"{kind}_by") for b in funnel.buckets]
        ys = [round(baseline - v * scale, 1) for v in values]
        lines.append(
            Line(
                kind,
                name,
                " ".join(f"{x},{y}" for x, y in zip(xs, ys, strict=True)),
                xs[-1],
                ys[-1],
                ys[-1],
                values[-1],
            )
        )
    # Names at the line ends, top to bottom, never on one another (text baseline: +4).
    placed = spread([line.end_y for line in lines], gap=LINE_LABEL_GAP, low=TOP + 4, high=baseline)
    lines = [
        Line(line.kind, line.name, line.points, line.end_x, line.end_y, y, line.total)
        for line, y in zip(lines, placed, strict=True)
    ]

    every = label_every(gap, TIME_LABEL_SPACE)
    labels = [
        Label(xs[i], time_label(funnel.buckets[i].start, funnel.width)) for i in range(0, n, every)
    ]
    if n % every == 0:  # the last boundary falls on the labelling rhythm
        labels.append(Label(xs[n], time_label(funnel.buckets[-1].end, funnel.width)))

    period = period_words(funnel.width)
    description = (
        f"Running totals in {period} periods {_span_words(funnel)}: by the end, "
        f"{funnel.accepted:,} accepted, {funnel.shown:,} shown and {funnel.clicked:,} clicked."
    )
    return FunnelChart(
        title="Accepted, shown and clicked over time",
        description=description,
        width=WIDTH,
        height=HEIGHT,
        left=LEFT,
        right=LEFT + plot_width,
        baseline=baseline,
        lines=lines,
        ticks=ticks(top, step, baseline=baseline, scale=scale),
        labels=labels,
    )
