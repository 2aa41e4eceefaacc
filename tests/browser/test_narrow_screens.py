"""The compliance dashboard's charts at phone and desktop widths: week labels never overlap.

Every page state's phone-width checks (no sideways scroll at 320 and 390 px, no word broken
anywhere, axe-core) run with its other checks in ``test_accessibility``."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tests.browser.test_accessibility import NARROW, PAGES, styled

pytestmark = pytest.mark.browser

WEEK_LABELS = """() => [...document.querySelectorAll('svg.chart__svg')].map(svg =>
  [...svg.querySelectorAll('text.chart__axis[text-anchor=middle]')].map(t => {
    const r = t.getBoundingClientRect();
    return [r.left, r.right];
  }))"""


@pytest.mark.parametrize(
    "viewport", [*NARROW, {"width": 1280, "height": 900}], ids=lambda v: f"{v['width']}px"
)
def test_week_labels_on_the_dashboard_charts_never_overlap(
    viewport: dict[str, int], new_context: Any, server: Any
) -> None:
    (state,) = (s for s in PAGES if s.name == "staff-compliance-dashboard")

    def sized(**options: Any) -> Any:
        options["viewport"] = viewport
        return new_context(**options)

    page = styled(state.reach(sized, server))
    charts = page.evaluate(WEEK_LABELS)
    assert charts and all(len(labels) >= 2 for labels in charts), charts
    for labels in charts:
        for (_, right), (left, _) in itertools.pairwise(labels):
            assert left - right >= 2, f"week labels overlap at {viewport['width']} px: {labels}"
