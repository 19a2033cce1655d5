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
