"""Heads across a corpus in Chromium: a scan made on the command line (ATTNVIZ_SCAN_ROOT) opens; the map draws; a
click on a head opens it with its offset profile and examples."""

import pytest

from tests.e2e.conftest import streamlit_server, wait_until_idle

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def scans_root(tmp_path_factory):
    from attnviz.models.loading import DEFAULT_MODEL_NAME
    from attnviz.scan.__main__ import main

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

    from attnviz.scan import store

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
