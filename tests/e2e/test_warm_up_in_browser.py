"""The warm-up at server start, seen from outside: `streamlit run app.py` loads the bundled model and captures the
default sentence before any browser has connected, and the first visit then draws from it."""

import json
import time

from tests.e2e.conftest import streamlit_server, wait_until_idle


def _warm_up_line(run_log):
    for text in run_log.read_text().splitlines() if run_log.exists() else []:
        line = json.loads(text)
        if line["page"] == "(warm-up at server start)":
            return line
    return None


def test_the_server_warms_up_before_any_browser(tmp_path, page):
    run_log = tmp_path / "runs.jsonl"
    with streamlit_server({"ATTNVIZ_RUN_LOG": str(run_log), "ATTNVIZ_WARM_UP": "1"}) as url:
        deadline = time.monotonic() + 180
        while _warm_up_line(run_log) is None and time.monotonic() < deadline:
            time.sleep(0.5)
        line = _warm_up_line(run_log)
        assert line is not None and line["ending"] == "finished", line
        runs = [json.loads(text) for text in run_log.read_text().splitlines()]
        assert all(run["page"].startswith("(warm-up") for run in runs)  # no session has run yet

        page.goto(url)
        wait_until_idle(page)
        page.get_by_text("Replay check:").first.wait_for(timeout=30_000)
        # Plotly draws in the browser after the script has finished: wait for the chart's SVG, not a fixed moment.
        page.locator('[data-testid="stPlotlyChart"] .main-svg').first.wait_for(timeout=30_000)
        explore = [run for run in map(json.loads, run_log.read_text().splitlines())
                   if not run["page"].startswith("(warm-up")]
        assert explore and explore[0]["page"] == "Explore heads" and explore[0]["ending"] == "finished"
