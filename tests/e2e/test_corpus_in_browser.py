"""Heads across a corpus in Chromium: a scan made on the command line (ATTNVIZ_SCAN_ROOT) opens; the map draws; a
click on a head opens it with its offset profile and examples."""

import pytest

from tests.e2e.conftest import streamlit_server, wait_until_idle

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def scans_root(tmp_path_factory):
    from attnviz.corpus.scan.__main__ import main
    from attnviz.models.shipped import DEFAULT_MODEL_NAME

    root = tmp_path_factory.mktemp("scans")
    assert main(["bundled", "--model", DEFAULT_MODEL_NAME, "--out", str(root / "bundled.duckdb"), "--max-docs",
                 "12", "--max-tokens", "48", "--qk-points", "0", "--quiet"]) == 0  # the sample: tests/test_qk_sample.py
    return root


def test_a_command_line_scan_opens_in_the_browser(browser, scans_root, screenshot_dir):
    with streamlit_server({"ATTNVIZ_SCAN_ROOT": str(scans_root)}) as url:
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.goto(url + "/corpus")
        wait_until_idle(page)
        page.get_by_text("every head, over 12 documents").first.wait_for(timeout=60_000)
        page.locator(".js-plotly-plot").first.wait_for(timeout=30_000)
        assert page.locator('[data-testid="stException"]').count() == 0
        page.screenshot(path=str(screenshot_dir / "corpus_map.png"), full_page=True)
        page.get_by_text("Head", exact=True).first.click()  # the view's segmented control
        wait_until_idle(page)
        page.get_by_text("mean weight by relative position").first.wait_for(timeout=60_000)
        page.get_by_role("button", name="Open in Explore heads").first.wait_for(timeout=30_000)
        assert page.locator('[data-testid="stException"]').count() == 0
        page.screenshot(path=str(screenshot_dir / "corpus_head.png"), full_page=True)
        page.close()


def test_an_export_streams_from_its_link(browser, scans_root, screenshot_dir):
    """Export: the Parquet file is prepared on disk and served by app.py's own route, streamed from the file (never
    held in the server's memory); an unknown or expired link is a 404 in words."""
    import io

    import pyarrow.parquet as pq

    from attnviz.corpus.scan import store

    with streamlit_server({"ATTNVIZ_SCAN_ROOT": str(scans_root)}) as url:
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.goto(url + "/corpus")
        wait_until_idle(page)
        page.get_by_text("every head, over 12 documents").first.wait_for(timeout=60_000)
        page.get_by_text("Export", exact=True).first.click()
        wait_until_idle(page)
        page.get_by_role("button", name="Prepare the Parquet file").click()
        link = page.locator('a[href*="/attnviz-download/"]').first
        link.wait_for(timeout=60_000)
        assert page.locator('[data-testid="stException"]').count() == 0
        page.screenshot(path=str(screenshot_dir / "corpus_export.png"), full_page=True)
        href = link.get_attribute("href")
        answer = page.request.get(href if href.startswith("http") else url + href)
        assert answer.status == 200 and 'filename="documents.parquet"' in answer.headers["content-disposition"]
        with store.ScanReader(scans_root / "bundled.duckdb") as reader:
            expected = reader.connection.execute("SELECT * FROM documents ORDER BY doc").fetchall()
        exported = pq.read_table(io.BytesIO(answer.body())).sort_by("doc").to_pylist()
        assert [tuple(row.values()) for row in exported] == expected and len(expected) == 12
        missing = page.request.get(url + "/attnviz-download/not-a-token")
        assert missing.status == 404 and "prepare it again" in missing.text()
        page.close()


@pytest.fixture(scope="module")
def induction_root(tmp_path_factory):
    """A command-line scan of the bundled tiny GPT over passages written twice (its induction heads copy)."""
    from attnviz.corpus.scan.__main__ import main
    from tests.test_scan_detectors import repeated_passages

    root = tmp_path_factory.mktemp("induction")
    corpus = root / "repeated.txt"
    corpus.write_text("\n".join(repeated_passages(8)) + "\n", encoding="utf-8")
    assert main([str(corpus), "--model", "tiny GPT (bundled, trained by attnviz)", "--out",
                 str(root / "repeated.duckdb"), "--max-tokens", "96", "--qk-points", "0", "--quiet"]) == 0
    return root


def test_a_scan_names_induction_heads_and_a_click_shows_the_copy_with_its_far_key(browser, induction_root,
                                                                                  screenshot_dir):
    """The map opens on induction; a click on layer 2, head 1 opens it, labelled an induction head; its induction
    example shows the key in the first copy apart from the query's context, after a gap."""
    with streamlit_server({"ATTNVIZ_SCAN_ROOT": str(induction_root)}) as url:
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        page.goto(url + "/corpus")
        wait_until_idle(page)
        title = "induction: weight on the token after an earlier copy of the query's token, every head"
        page.get_by_text(title).first.wait_for(timeout=60_000)
        plot = page.locator(".js-plotly-plot").filter(has_text=title).first
        page.screenshot(path=str(screenshot_dir / "corpus_induction_map.png"), full_page=True)
        area = plot.locator(".nsewdrag").first.bounding_box()
        layer, head, layers, heads = 2, 1, 3, 4
        page.mouse.click(area["x"] + area["width"] * (head + 0.5) / heads,
                         area["y"] + area["height"] * (layer + 0.5) / layers)
        wait_until_idle(page)
        page.get_by_text("Layer 2, head 1: mean weight by relative position").first.wait_for(timeout=60_000)
        assert page.locator('[data-testid="stMetricValue"]').first.inner_text() == "induction head"
        criterion = page.locator('[data-testid="stSelectbox"]').filter(has_text="Top examples by").first
        criterion.scroll_into_view_if_needed()
        criterion.locator("input").click()
        page.keyboard.type("token after an earlier")
        page.keyboard.press("Enter")
        wait_until_idle(page)
        page.screenshot(path=str(screenshot_dir / "corpus_induction_head.png"), full_page=True)
        page.get_by_text("tokens …").first.wait_for(timeout=30_000)  # the gap between the key and the query's context
        assert page.locator('[data-testid="stException"]').count() == 0
        page.screenshot(path=str(screenshot_dir / "corpus_induction_example.png"), full_page=True)
        page.close()
