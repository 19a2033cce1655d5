"""Presentation mode on a 1280 x 720 projector: from a link, the sidebar out of the way, the full width for the
content, no label cut short; and the story's Next / Previous links."""

import pytest

from attnviz.ui.frame import story_neighbours
from tests.e2e.conftest import wait_until_idle

pytestmark = pytest.mark.e2e

PAGES = ["step_by_step", "scaling", "masks", "positional", "", "over_training", "heads_kv_cache", "flash", "generation"]

# Labels and tabs whose text does not fit their box (the browser cuts them with an ellipsis or a scroll).
TRUNCATED = """
() => [...document.querySelectorAll(
    '[data-testid="stMain"] label p, [data-testid="stMain"] [data-testid="stMetricLabel"] p, '
    + '[data-testid="stMain"] [role="tab"] p, [data-testid="stMain"] [role="tablist"]')]
  .filter(el => el.offsetParent !== null && el.scrollWidth > el.clientWidth + 1)
  .map(el => el.innerText.slice(0, 40))
"""


# Control contents the browser hides (an ellipsis or a scroll): button, toggle and checkbox labels, metric values,
# a multiselect's chips, a segmented control's options; KaTeX's hidden MathML copy and the figures are not controls.
CUT_CONTROLS = """
() => [...document.querySelectorAll('[data-testid="stMain"] *')].filter(el => {
    if (!el.checkVisibility() || el.closest('[data-testid="stDataFrame"], .js-plotly-plot, .katex, pre')) return false;
    const style = getComputedStyle(el);
    const clips = style.textOverflow === 'ellipsis' || ['hidden', 'clip', 'auto', 'scroll'].includes(style.overflowX);
    return clips && (el.innerText || '').trim() && el.scrollWidth > el.clientWidth + 2;
  }).map(el => el.innerText.replace(/\\n+/g, ' | ').slice(0, 50))
"""
# Data grids whose columns do not fit their width (the user has to scroll them sideways).
SIDEWAYS_TABLES = """
() => [...document.querySelectorAll('[data-testid="stMain"] [data-testid="stDataFrame"]')]
  .filter(grid => grid.checkVisibility())
  .map(grid => grid.querySelector('.dvn-scroller'))
  .filter(scroller => scroller && scroller.scrollWidth > scroller.clientWidth + 2)
  .map(scroller => [scroller.scrollWidth, scroller.clientWidth])
"""
# Inside every drawn figure: a title longer than the figure, or two tick labels on top of each other (labels turned
# by 45 degrees collide when their anchors are closer than a line of text measured across the slant).
FIGURE_COLLISIONS = """
() => { const found = [];
  document.querySelectorAll('[data-testid="stMain"] [data-testid="stPlotlyChart"]').forEach((chart, index) => {
    if (!chart.checkVisibility()) return;
    const frame = chart.getBoundingClientRect();
    const title = chart.querySelector('.gtitle');
    if (title && title.getBoundingClientRect().right > frame.right + 1)
      found.push([index, 'title cut', title.textContent]);
    if (title) {  // nothing drawn over the title: panel titles, legends, annotations
      const box = title.getBoundingClientRect();
      chart.querySelectorAll('.main-svg text').forEach(other => {
        if (other === title || !other.textContent.trim() || other.closest('.modebar, .hoverlayer')) return;
        const them = other.getBoundingClientRect();
        const across = Math.min(box.right, them.right) - Math.max(box.left, them.left);
        const down = Math.min(box.bottom, them.bottom) - Math.max(box.top, them.top);
        if (across > 2 && down > 2) found.push([index, 'over the title', other.textContent.slice(0, 40)]);
      });
    }
    chart.querySelectorAll('.xaxislayer-above, .yaxislayer-above').forEach(layer => {
      const ticks = [...layer.querySelectorAll('text')].filter(t => t.textContent.trim()).map(t => {
        const transform = t.getAttribute('transform') || '';
        const box = t.getBoundingClientRect();
        return {text: t.textContent, box, turned: /rotate\\(-?45/.test(transform),
                anchor: parseFloat((transform.match(/translate\\(([-0-9.]+)/) || [0, 0])[1]),
                size: parseFloat(getComputedStyle(t).fontSize)};
      });
      for (let i = 0; i + 1 < ticks.length; i++) for (let j = i + 1; j < ticks.length; j++) {
        const a = ticks[i], b = ticks[j];
        if (a.turned && b.turned) {
          const apart = Math.abs(a.anchor - b.anchor) * Math.SQRT1_2;
          if (apart > 0 && apart < 0.8 * a.size && a.text.length > 2 && b.text.length > 2)
            found.push([index, 'ticks too close', a.text, b.text]);
        } else {
          const across = Math.min(a.box.right, b.box.right) - Math.max(a.box.left, b.box.left);
          const down = Math.min(a.box.bottom, b.box.bottom) - Math.max(a.box.top, b.box.top);
          if (across > 2 && down > 2) found.push([index, 'ticks overlap', a.text, b.text]);
        }
      }
    });
  });
  return found; }
"""
# figure_columns' rows: whether their columns sit side by side.
FIGURE_ROWS = """
() => [...document.querySelectorAll('[class*="st-key-figrow"]')].filter(row => row.checkVisibility()).map(row => {
  const columns = [...row.querySelectorAll(
      ':scope > [data-testid="stLayoutWrapper"] > [data-testid="stHorizontalBlock"] > [data-testid="stColumn"]')];
  const tops = new Set(columns.map(column => Math.round(column.getBoundingClientRect().top)));
  return {row: [...row.classList].find(name => name.startsWith('st-key-')), columns: columns.length,
          lines: tops.size, narrowest: Math.min(...columns.map(column => column.getBoundingClientRect().width))};
})
"""


def _window(browser, width: int, height: int):
    """A browser window of this size (a generator: its page, then the window closed, also by ``.close()``)."""
    context = browser.new_context(viewport={"width": width, "height": height})
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.fixture
def projector(browser):
    yield from _window(browser, 1280, 720)


# The page's main figure (the first Plotly chart or table, whichever comes first) and where it starts.
FIRST_FIGURE = """
() => {
  const found = [...document.querySelectorAll(
      '[data-testid="stMain"] [data-testid="stPlotlyChart"], [data-testid="stMain"] [data-testid="stDataFrame"], '
      + '[data-testid="stMain"] [data-testid="stTable"]')]
    .filter(el => el.checkVisibility() && !el.closest('details:not([open])')
                  && el.getBoundingClientRect().height > 50);  // not inside a closed expander
  if (!found.length) { return null; }
  const box = found[0].getBoundingClientRect();
  return {top: box.top + window.scrollY, height: box.height};
}
"""
# Every text Plotly drew inside the page's figures, with its size in px.
FIGURE_TEXT_SIZES = """
() => [...document.querySelectorAll('[data-testid="stMain"] .js-plotly-plot svg text')]
  .filter(t => t.textContent.trim() && t.getBoundingClientRect().width > 0 && !t.closest('.modebar'))
  .map(t => [t.textContent.slice(0, 30), parseFloat(getComputedStyle(t).fontSize)])
"""


def test_a_link_opens_presentation_mode_and_the_point_is_on_the_first_screen(projector, app_url, screenshot_dir):
    """1280 x 720 from a link with presentation_mode=true: the sidebar out of the way, the whole width, the mode kept,
    Previous/Next above the title and at the end; each story page's main figure starts high enough that 280 px of it
    (its title and first rows) show on the first screen, no text inside any figure on it is under 16 px, and the
    larger text cuts no control, widens no table past its box and makes no figure's labels collide."""
    for path in PAGES:
        projector.goto(f"{app_url}/{path}?presentation_mode=true")
        wait_until_idle(projector)
        sidebar = projector.locator('[data-testid="stSidebar"]')
        assert sidebar.get_attribute("data-collapsed") == "true", path  # collapsed: out of the way
        sidebar_box = sidebar.bounding_box()
        assert sidebar_box is None or sidebar_box["x"] + sidebar_box["width"] <= 1, path  # and no strip left
        content = projector.locator('[data-testid="stMainBlockContainer"]').bounding_box()
        assert content["width"] >= 1100, (path, content)
        assert projector.evaluate(TRUNCATED) == [], path
        assert projector.get_by_role("switch", name="Presentation mode").is_checked()  # kept from the link
        projector.locator('[data-testid="stMain"] [data-testid="stPageLink-NavLink"]').first.wait_for(timeout=60_000)
        wait_until_idle(projector)
        previous, following = story_neighbours(projector.locator("h1").first.inner_text())
        links = [text.splitlines()[-1] for text in  # the last line: the first is the page's icon
                 projector.locator('[data-testid="stMain"] [data-testid="stPageLink-NavLink"]').all_inner_texts()]
        row = ([f"← Previous: {previous}"] if previous else []) + ([f"Next: {following} →"] if following else [])
        assert links == row + row, (path, links)  # above the title and at the end of the page
        first_link = projector.locator('[data-testid="stMain"] [data-testid="stPageLink-NavLink"]').first
        assert first_link.bounding_box()["y"] < projector.locator("h1").first.bounding_box()["y"], path
        projector.locator('[data-testid="stPlotlyChart"] .main-svg').first.wait_for(timeout=60_000)
        projector.wait_for_timeout(800)
        projector.screenshot(path=str(screenshot_dir / f"first_screen_1280_{path or 'explore'}.png"))
        figure = projector.evaluate(FIRST_FIGURE)
        assert figure is not None and figure["top"] <= 720 - 280, (path, figure)
        small = [(text, size) for text, size in projector.evaluate(FIGURE_TEXT_SIZES) if size < 16]
        assert small == [], (path, small[:8])
        assert projector.evaluate(CUT_CONTROLS) == [], path  # the larger text still fits every control
        assert projector.evaluate(SIDEWAYS_TABLES) == [], path
        assert projector.evaluate(FIGURE_COLLISIONS) == [], path


def _toolbars_apart_from_titles(page, charts) -> list:
    """Hover each of ``charts`` (locators): where its toolbars (Plotly's and Streamlit's) overlap its title."""
    overlaps = []
    for chart in charts:
        chart.locator(".main-svg").first.wait_for(timeout=60_000)
        if not chart.locator(".gtitle").count():
            continue
        chart.scroll_into_view_if_needed()
        chart.hover()
        page.wait_for_timeout(600)
        title = chart.locator(".gtitle").first.bounding_box()
        toolbar = page.locator('[data-testid="stElementToolbar"]:visible')
        bars = [box for box in (chart.locator(".modebar").first.bounding_box(),
                                toolbar.first.bounding_box() if toolbar.count() else None) if box]
        assert title and bars
        for bar in bars:
            apart = (bar["y"] + bar["height"] <= title["y"] or title["y"] + title["height"] <= bar["y"]
                     or bar["x"] + bar["width"] <= title["x"] or title["x"] + title["width"] <= bar["x"])
            if not apart:
                overlaps.append((chart.locator(".gtitle").first.text_content(), title, bar))
    return overlaps


def test_the_toolbar_never_covers_a_title(page, app_url):
    """With the pointer over a figure its toolbars appear (Plotly's and Streamlit's): neither overlaps the title."""
    for path in ("masks", "flash", ""):
        page.goto(f"{app_url}/{path}")
        wait_until_idle(page)
        assert _toolbars_apart_from_titles(page, [page.locator('[data-testid="stPlotlyChart"]').first]) == [], path


def test_the_toolbar_never_covers_a_title_on_a_projector(projector, app_url):
    """Presentation mode's larger titles, on every chart of pages with half-width charts."""
    for path in ("masks", "flash"):
        projector.goto(f"{app_url}/{path}?presentation_mode=true")
        projector.locator('[data-testid="stMain"] [data-testid="stPlotlyChart"] .main-svg').first.wait_for(
            timeout=60_000)  # the page drawn (the link's first run may still be on its way when the app is idle)
        wait_until_idle(projector)
        charts = projector.locator('[data-testid="stMain"] [data-testid="stPlotlyChart"]').all()
        assert len(charts) >= 2, path
        assert _toolbars_apart_from_titles(projector, charts) == [], path


@pytest.fixture
def narrow(browser):
    yield from _window(browser, 900, 1000)


def _drawn(page) -> None:
    """Waits until the page's figures are drawn (pages without one: until the app is idle)."""
    wait_until_idle(page)
    if page.locator('[data-testid="stMain"] [data-testid="stPlotlyChart"]').count():
        page.locator('[data-testid="stMain"] [data-testid="stPlotlyChart"] .main-svg').first.wait_for(timeout=60_000)
    page.wait_for_timeout(800)  # Plotly lays out its ticks after the first paint
    wait_until_idle(page)


NARROW_PAGES = [*PAGES, "corpus", "importance", "queries_keys", "checkpoints"]


def test_a_900_px_window_closes_the_sidebar_and_cuts_no_label(narrow, app_url, screenshot_dir):
    """At 900 px the sidebar closes on the first visit (Streamlit alone closes it only under 768 px); every
    control's label, tab, button, metric and chip fits its box; no data grid scrolls sideways; nothing runs off the
    page; no figure's title is cut or its tick labels collide; figures that sit side by side on a wide screen
    (figure_columns) go one under the other. A sidebar the user opens again stays open."""
    stacked = 0
    for path in NARROW_PAGES:
        narrow.goto(f"{app_url}/{path}")
        _drawn(narrow)
        collapsed = """() => document.querySelector('[data-testid="stSidebar"]')
                                     ?.getAttribute('data-collapsed') === 'true'"""
        narrow.wait_for_function(collapsed, timeout=20_000)  # the page's script closes it once the page is drawn
        narrow.wait_for_timeout(500)
        assert narrow.locator('[data-testid="stException"]').count() == 0, path
        assert narrow.evaluate(TRUNCATED) == [], path
        assert narrow.evaluate(CUT_CONTROLS) == [], path
        assert narrow.evaluate(SIDEWAYS_TABLES) == [], path
        assert narrow.evaluate(FIGURE_COLLISIONS) == [], path
        assert narrow.evaluate("document.documentElement.scrollWidth") <= 900, path
        for row in narrow.evaluate(FIGURE_ROWS):  # each column gets the width its figure was built for
            min_width = int(row["row"].removeprefix("st-key-figrow").split("_")[0])
            assert row["narrowest"] >= min_width - 1, (path, row)
            stacked += row["lines"] > 1
        narrow.screenshot(path=str(screenshot_dir / f"narrow_900_{path or 'explore'}.png"))
    assert stacked >= 5  # Masks, Flash, Scaling, Generation, ... put their two figures one under the other here
    narrow.locator('[data-testid="stExpandSidebarButton"]').click()
    narrow.goto(f"{app_url}/masks")
    wait_until_idle(narrow)
    narrow.wait_for_timeout(800)
    assert narrow.locator('[data-testid="stSidebar"]').get_attribute("data-collapsed") == "false"


def test_screenshots_at_1440_x_900(browser, app_url, screenshot_dir):
    """The researcher's window: every page renders with the sidebar open, nothing cut, no figure's labels colliding,
    and figures built to sit side by side do; screenshots kept with the others."""
    page = next(window := _window(browser, 1440, 900))
    side_by_side = 0
    for path in NARROW_PAGES:
        page.goto(f"{app_url}/{path}")
        _drawn(page)
        assert page.locator('[data-testid="stException"]').count() == 0, path
        assert page.evaluate(TRUNCATED) == [], path
        assert page.evaluate(CUT_CONTROLS) == [], path
        assert page.evaluate(SIDEWAYS_TABLES) == [], path
        assert page.evaluate(FIGURE_COLLISIONS) == [], path
        rows = page.evaluate(FIGURE_ROWS)
        side_by_side += sum(row["lines"] == 1 for row in rows)
        page.screenshot(path=str(screenshot_dir / f"wide_1440_{path or 'explore'}.png"))
    assert side_by_side >= 8
    window.close()


def test_next_and_previous_follow_the_story(page, app_url):
    page.goto(f"{app_url}/step_by_step")
    wait_until_idle(page)
    assert page.get_by_role("link", name="← Previous").count() == 0  # the story starts here
    page.get_by_role("link", name="Next: Scaling and softmax →").first.click()  # above the title (and at the end)
    wait_until_idle(page)
    assert page.locator("h1").first.inner_text() == "Scaling and softmax"
    page.get_by_role("link", name="← Previous: Attention step by step").last.click()  # the one at the end
    wait_until_idle(page)
    assert page.locator("h1").first.inner_text() == "Attention step by step"
