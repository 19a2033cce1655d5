"""Finding heads in a real Chromium: hovers that say what a cell is, lines highlighted on hover, the statistic map's
click, the table's row selection, the sentence boundary, exports of what is shown, bertviz offline."""

import re

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.e2e.conftest import wait_until_idle

pytestmark = pytest.mark.e2e

SENTENCE = "The%20cat%20sat%20on%20the%20mat."  # [CLS] the cat sat on the mat . [SEP]: 9 tokens


def no_exception(page):
    assert page.locator('[data-testid="stException"]').count() == 0


def hover_text(page, plot_index: int, row: int, col: int, n_rows: int, n_cols: int) -> str:
    """Move the mouse to a heatmap cell and return Plotly's hover label."""
    area = page.locator(".js-plotly-plot").nth(plot_index).locator(".nsewdrag").first.bounding_box()
    page.mouse.move(area["x"] + area["width"] * (col + 0.5) / n_cols,
                    area["y"] + area["height"] * (row + 0.5) / n_rows)
    label = page.locator(".hoverlayer .hovertext").first
    label.wait_for(timeout=10_000)
    return label.text_content()


def test_a_heatmap_hover_names_the_query_the_key_the_weight_and_its_rank(page, app_url):
    page.goto(f"{app_url}/?layer=0&head=2&sentence={SENTENCE}")
    wait_until_idle(page)
    page.get_by_text("Layer 0, head 2: self-attention").first.wait_for(timeout=30_000)
    text = hover_text(page, 0, 2, 1, 9, 9)  # query "cat", key "the": this head's previous token
    assert "query 2 · cat" in text and "key 1 · the" in text
    weight = float(re.search(r"weight ([0-9.e-]+)", text).group(1))
    assert 0.5 < weight <= 1 and len(re.search(r"weight ([0-9.e-]+)", text).group(1).replace("0.", "")) <= 4
    assert "rank 1 of 9 in its row" in text
    no_exception(page)


def test_hovering_a_token_in_the_lines_view_highlights_its_lines(page, app_url):
    page.goto(f"{app_url}/?view=Lines&layer=2&head=5&sentence={SENTENCE}")
    wait_until_idle(page)
    page.get_by_text("Layer 2: self-attention, head 5").first.wait_for(timeout=30_000)
    plot = page.locator(".js-plotly-plot").first
    label = plot.get_by_text("2 · cat", exact=True).first.bounding_box()
    page.mouse.move(label["x"] + label["width"] + 5, label["y"] + label["height"] / 2)
    state = """el => { const m = el.layout.meta; const h = el.data[m.highlight];
        return {highlighted: (h.x || []).length, dimmed: m.line_traces.map(i => el.data[i].opacity),
                expected: m.lines.filter(l => l[0] === 2).length * 3}; }"""
    page.wait_for_function(f"() => {{ const el = document.querySelector('.js-plotly-plot'); "
                           f"return ({state})(el).highlighted > 0; }}", timeout=10_000)
    highlighted = plot.evaluate(state)
    assert highlighted["highlighted"] == highlighted["expected"] > 0  # exactly the lines of query "cat"
    assert set(highlighted["dimmed"]) == {0.12}
    page.mouse.move(5, 5)  # away: everything back
    page.wait_for_function("() => { const el = document.querySelector('.js-plotly-plot'); "
                           "return (el.data[el.layout.meta.highlight].x || []).length === 0; }", timeout=10_000)
    assert 0.12 not in plot.evaluate(state)["dimmed"]
    no_exception(page)


def test_clicking_the_statistic_map_opens_that_head(page, app_url):
    page.goto(f"{app_url}/?explore_tab=Head+statistics&sentence={SENTENCE}")
    wait_until_idle(page)
    page.get_by_text("previous token of every head").first.wait_for(timeout=60_000)
    plot = page.locator(".js-plotly-plot").filter(has_text="previous token of every head").first
    area = plot.locator(".nsewdrag").first.bounding_box()
    layer, head = 4, 9
    page.mouse.click(area["x"] + area["width"] * (head + 0.5) / 12, area["y"] + area["height"] * (layer + 0.5) / 6)
    wait_until_idle(page)
    page.get_by_text("Layer 4, head 9: self-attention").first.wait_for(timeout=30_000)
    assert "layer=4" in page.url and "head=9" in page.url
    no_exception(page)


def test_selecting_a_table_row_sets_layer_and_head(page, app_url):
    page.goto(f"{app_url}/?explore_tab=Head+statistics&sentence={SENTENCE}")
    wait_until_idle(page)
    table = page.locator('[data-testid="stDataFrame"]').first
    table.wait_for(timeout=60_000)
    box = table.bounding_box()
    row, row_height = 5, 35  # layer 0, head 5: its selection box, below the header row
    page.mouse.click(box["x"] + 18, box["y"] + row_height * (row + 1) + row_height / 2)
    wait_until_idle(page)
    page.get_by_text("now layer 0, head 5").first.wait_for(timeout=30_000)
    assert page.locator('[data-testid="stNumberInputField"]').nth(0).input_value() == "0"
    assert page.locator('[data-testid="stNumberInputField"]').nth(1).input_value() == "5"
    assert "head=5" in page.url
    no_exception(page)


def test_a_sentence_pair_draws_its_boundary_and_colours_its_labels(page, app_url):
    page.goto(f"{app_url}/?sentence={SENTENCE}&explore_pair=It%20was%20tired.")
    wait_until_idle(page)
    page.get_by_text("Layer 0, head 2: self-attention").first.wait_for(timeout=30_000)
    assert "explore_pair=It" in page.url  # the pair is kept in the link
    plot = page.locator(".js-plotly-plot").first
    lines = plot.evaluate("el => el.layout.shapes.filter(s => s.type === 'line').map(s => [s.x0, s.x1, s.y0, s.y1])")
    assert [8.5, 8.5] in [line[:2] for line in lines]  # sentence B starts after [SEP] at position 8
    orange = plot.locator(".xtick text tspan[style*='194, 65, 12'], .xtick text tspan[style*='#c2410c']")
    assert orange.count() >= 3  # "it", "was", "tired" (and the final [SEP]) drawn in sentence B's colour
    no_exception(page)


def test_the_csv_export_holds_what_is_shown_after_the_filters(page, app_url, tmp_path):
    page.goto(f"{app_url}/?explore_tab=Export&explore_hide_special=true&sentence={SENTENCE}")
    wait_until_idle(page)
    # The link's settings applied before the export is taken (on a slow machine the first idle can come first).
    from playwright.sync_api import expect

    expect(page.get_by_label("Hide special tokens", exact=True)).to_be_checked(timeout=60_000)
    wait_until_idle(page)
    button = page.get_by_role("button", name="This head as shown (CSV)")
    button.wait_for(timeout=60_000)
    path = tmp_path / "head.csv"
    # The CSV is made when asked (a deferred download): the server builds it, then the browser saves it. On a loaded
    # machine a click can land while the page is still being redrawn and be lost, so it is tried again.
    for attempt in range(3):
        try:
            with page.expect_download(timeout=45_000) as download:
                button.click()
            download.value.save_as(path)
            break
        except PlaywrightTimeout:
            if attempt == 2:
                raise
            wait_until_idle(page)
    lines = path.read_text().strip().splitlines()
    assert len(lines) == 1 + 7  # header and the 7 word tokens: [CLS] and [SEP] hidden
    assert "[CLS]" not in path.read_text() and "[SEP]" not in path.read_text()
    rows = [[float(v) for v in line.split(",")[1:]] for line in lines[1:]]
    assert all(abs(sum(row) - 1) < 1e-5 for row in rows)  # renormalised, as shown


def test_bertviz_offline_says_its_scripts_did_not_load(page, app_url):
    page.route(re.compile(r"^https?://(?!127\.0\.0\.1)"), lambda route: route.abort())  # no internet
    page.goto(f"{app_url}/?explore_tab=bertviz+%28online%29&sentence={SENTENCE}")
    wait_until_idle(page)
    page.get_by_role("button", name="Build the bertviz view").click()
    wait_until_idle(page)
    frame = page.frame_locator("iframe").first
    frame.get_by_text("bertviz did not load").wait_for(timeout=20_000)
    assert frame.locator("#attnviz-bertviz-offline").is_visible()
    no_exception(page)
