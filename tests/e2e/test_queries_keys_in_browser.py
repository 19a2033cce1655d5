"""Queries and keys in a real Chromium: a click on a query of the head's picture draws its lines and names it, a
click on a head of the grid opens that head. AppTest cannot click a Plotly point, and the browser sends a point's
integer customdata in its own shape (a typed array arrives as {"0": .., "1": ..}), so only this catches a page
that reads the selection wrongly."""

import pytest

from tests.e2e.conftest import wait_until_idle

pytestmark = pytest.mark.e2e

SENTENCE = "The%20cat%20sat%20on%20the%20mat%20because%20it%20was%20tired."

# In page (client) pixels, every drawn point of a figure's traces: Plotly's own axes map data to pixels, so the
# test clicks where the point is whatever the layout, scale or subplot. customdata as the figure holds it.
POINTS_IN_PIXELS = """(gd, traces) => {
    const box = gd.getBoundingClientRect();
    return traces.map(t => {
        const trace = gd._fullData[t];
        const xa = gd._fullLayout[trace.xaxis.replace('x', 'xaxis')];
        const ya = gd._fullLayout[trace.yaxis.replace('y', 'yaxis')];
        return Array.from(trace.x, (x, j) => {
            const px = xa.l2p(x), py = ya.l2p(trace.y[j]);
            return {x: box.left + xa._offset + px, y: box.top + ya._offset + py,
                    inside: Math.min(px, xa._length - px, py, ya._length - py),  // pixels to its subplot's edge
                    customdata: Array.from(trace.customdata[j])};
        });
    });
}"""


def no_failure(page) -> None:
    """No exception box, no "Something went wrong", no traceback in place of the app."""
    assert page.locator('[data-testid="stException"]').count() == 0
    body = page.locator("body").inner_text()
    assert "Something went wrong" not in body and "Traceback" not in body


def plot_titled(page, title: str):
    """The Plotly figure whose title starts with ``title``."""
    plot = page.locator(".js-plotly-plot").filter(has=page.locator(".gtitle", has_text=title)).first
    plot.wait_for(timeout=60_000)
    return plot


def isolated_point(page, plot, traces: list[int], among: list[int]) -> dict:
    """The point of ``traces`` farthest from every other point of ``among`` (so a click cannot pick a neighbour)
    and at least 12 px inside its subplot (Plotly does not pick a point on the edge of a small subplot), in client
    pixels, once the figure is scrolled into view."""
    plot.scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    candidates = [point for points in plot.evaluate(POINTS_IN_PIXELS, traces) for point in points
                  if point["inside"] >= 12]
    others = [point for points in plot.evaluate(POINTS_IN_PIXELS, among) for point in points]

    def room(point):
        return min(((point["x"] - o["x"]) ** 2 + (point["y"] - o["y"]) ** 2 for o in others
                    if (o["x"], o["y"]) != (point["x"], point["y"])), default=1e9)
    return max(candidates, key=room)


def hover_says(page, plot, point: dict) -> str:
    """What Plotly's hover label says with the mouse on ``point``: the test clicks only what Plotly will pick."""
    page.mouse.move(point["x"], point["y"])
    page.wait_for_timeout(400)
    return plot.locator(".hoverlayer").text_content()


def test_a_click_on_a_query_draws_its_lines_and_a_click_on_a_head_opens_it(page, app_url, screenshot_dir):
    page.goto(f"{app_url}/queries_keys?sentence={SENTENCE}")
    wait_until_idle(page)
    picture = plot_titled(page, "self layer 0, head 0:")
    no_failure(page)
    assert "strongest 3 keys" not in picture.evaluate("gd => gd.data.map(t => t.name)")

    # a query: the picture's first trace; customdata (3 x index, position, document)
    query = isolated_point(page, picture, [0], [0, 1])
    index, position = query["customdata"][0] // 3, query["customdata"][1]
    assert hover_says(page, picture, query).startswith(f"query {position}")
    page.mouse.click(query["x"], query["y"])
    wait_until_idle(page)
    page.screenshot(path=str(screenshot_dir / "queries_keys_clicked_query.png"), full_page=True)
    no_failure(page)
    said = page.get_by_text(f"Query {position}, “").first
    said.wait_for(timeout=30_000)
    assert "attends most to" in said.inner_text()
    picture = plot_titled(page, "self layer 0, head 0:")
    lines = picture.evaluate("""gd => gd._fullData.filter(t => t.name === 'strongest 3 keys' && t.mode === 'lines')
                                                 .map(t => [Array.from(t.x), Array.from(t.y)])""")
    assert 1 <= len(lines) <= 3  # a line to each of its strongest keys (fewer where it may attend to fewer)
    start = picture.evaluate("(gd, i) => [gd._fullData[0].x[i], gd._fullData[0].y[i]]", index)
    assert all([x[0], y[0]] == start for x, y in lines)  # every line leaves the query that was clicked

    # a head of the layer's grid: its picture opens above, with no query chosen
    grid = plot_titled(page, "self, layer 0: queries and keys of each head")
    head = 5
    point = isolated_point(page, grid, [2 * head], [2 * head, 2 * head + 1])
    assert point["customdata"] == [0, head] and hover_says(page, grid, point) == f"head {head}"
    page.mouse.click(point["x"], point["y"])
    wait_until_idle(page)
    page.screenshot(path=str(screenshot_dir / "queries_keys_clicked_head.png"), full_page=True)
    no_failure(page)
    picture = plot_titled(page, f"self layer 0, head {head}:")
    assert "strongest 3 keys" not in picture.evaluate("gd => gd.data.map(t => t.name)")
    assert page.get_by_text(f"Query {position}, “").count() == 0

    # every layer: a click on L3 H7 changes the layer as well as the head
    page.get_by_text("Every layer", exact=True).click()
    wait_until_idle(page)
    grid = plot_titled(page, "self, every layer: queries and keys of each head")
    layer, head = 3, 7
    trace = 2 * (layer * 12 + head)
    point = isolated_point(page, grid, [trace], [trace, trace + 1])
    assert point["customdata"] == [layer, head] and hover_says(page, grid, point) == f"L{layer} H{head}"
    page.mouse.click(point["x"], point["y"])
    wait_until_idle(page)
    page.screenshot(path=str(screenshot_dir / "queries_keys_clicked_every_layer.png"), full_page=True)
    no_failure(page)
    plot_titled(page, f"self layer {layer}, head {head}:")
