"""Every page state at phone widths: nothing scrolls sideways at 320 px (the narrowest
phones in use, and 1280 px zoomed to 400 %, WCAG 1.4.10 Reflow) or at 390 px, no word is
broken in the middle to make it fit, and axe-core finds nothing at either width."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tests.browser.test_accessibility import AXE_OPTIONS, PAGES, PageState, _axe, _settled

pytestmark = pytest.mark.browser

NARROW = [{"width": 320, "height": 640}, {"width": 390, "height": 844}]

# Elements wider than the page, and text set to break anywhere: both make a phone user
# scroll sideways or read half-words.
OVERFLOW = """() => {
  const width = document.documentElement.clientWidth;
  const wide = [];
  for (const el of document.body.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || getComputedStyle(el).position === 'fixed') continue;
    if (el.closest('.visually-hidden')) continue;
    if (r.right > width + 0.5) {  // (off to the left, as a skip link waits, scrolls nothing)
      wide.push(`${el.tagName.toLowerCase()}${el.id ? '#' + el.id : ''}` +
                `${el.className && typeof el.className === 'string' ? '.' + el.className.split(' ')[0] : ''}` +
                ` ${Math.round(r.left)}..${Math.round(r.right)}`);
    }
  }
  const broken = [];
  for (const el of document.body.querySelectorAll('*')) {
    const style = getComputedStyle(el);
    if (style.wordBreak === 'break-all') broken.push(el.tagName.toLowerCase());
  }
  return {
    scroll: document.documentElement.scrollWidth - window.innerWidth,
    wide: wide.slice(0, 8),
    broken: broken.slice(0, 8),
  };
}"""


@pytest.mark.parametrize("state", PAGES, ids=str)
def test_no_page_scrolls_sideways_on_a_phone(
    state: PageState, new_context: Any, server: Any
) -> None:
    first, *others = NARROW

    def sized(**options: Any) -> Any:
        options["viewport"] = first
        return new_context(**options)

    page = _settled(state.reach(sized, server))
    for viewport in (first, *others):
        page.set_viewport_size(viewport)
        assert page.evaluate("window.innerWidth") == viewport["width"]
        found = page.evaluate(OVERFLOW)
        assert found["scroll"] <= 0 and not found["wide"], (
            f"{state} scrolls sideways by {found['scroll']} px at {viewport['width']} px: "
            f"{found['wide']}"
        )
        assert found["broken"] == [], f"{state} breaks words anywhere: {found['broken']}"
        # Stacked tables keep their meaning for a screen reader: axe-core at phone width too.
        results = _axe.run(page, options=AXE_OPTIONS)
        assert results.violations_count == 0, results.generate_report()


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

    page = _settled(state.reach(sized, server))
    charts = page.evaluate(WEEK_LABELS)
    assert charts and all(len(labels) >= 2 for labels in charts), charts
    for labels in charts:
        for (_, right), (left, _) in itertools.pairwise(labels):
            assert left - right >= 2, f"week labels overlap at {viewport['width']} px: {labels}"
