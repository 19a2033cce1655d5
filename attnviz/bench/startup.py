"""``python -m attnviz.bench startup``: how long a speaker waits, from ``streamlit run app.py`` to a chart.

Each cold start is a fresh server process (Python's and the OS's file caches stay warm, as on a laptop that ran the
app before). Chromium is started first and kept (the speaker's browser is already open). Measured from the moment
the process is spawned: the server answering its health check; then, in a new browser session, the first Explore
heads chart drawn (a Plotly SVG in the page). Then each other page in a new tab of the same browser (a new
Streamlit session, as a link opened in another tab), from navigation to its first chart (to its title for
Checkpoints, which has none); each tab is closed once its page has finished, before the next opens. Median of the
cold starts; targets: the first Explore chart <= 6 s, any fresh page <= 3 s. Each cold start is paired with one
whose server has the warm-up at server start turned off (``ATTNVIZ_WARM_UP=0``), to its first Explore chart: the
ratio says what the warm-up saves.

Also measured in-process, in a fresh interpreter: importing what app.py imports, and loading the bundled model,
split into the steps that take the time."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attnviz.bench import browser
from attnviz.ui.lifespan import WARM_UP_LATER_LINE, WARM_UP_LINE  # the run log's lines of the warm-up

FIRST_CHART_TARGET_S = 6.0
FRESH_PAGE_TARGET_S = 3.0
PAGES = {  # path -> title
    "": "Explore heads",  # again, in a new tab: the first visit above had the server to itself
    "step_by_step": "Attention step by step",
    "masks": "Masks",
    "positional": "Positional encodings",
    "scaling": "Scaling and softmax",
    "heads_kv_cache": "Heads and KV cache",
    "flash": "Flash vs naive",
    "generation": "Generation and KV cache",
    "checkpoints": "Checkpoints",
}
CHART = '[data-testid="stPlotlyChart"] .main-svg'

IN_PROCESS = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
steps = {}
start = time.perf_counter()
from attnviz.system.runtime import configure_environment
configure_environment()
import streamlit
steps["import streamlit"] = time.perf_counter() - start
mark = time.perf_counter()
import attnviz.ui.warm_up, attnviz.pagelogic.explore_heads, attnviz.viz.heads
steps["import attnviz (torch, transformers, plotly)"] = time.perf_counter() - mark
from attnviz.models import loading, shipped
mark = time.perf_counter()
bundle = loading.load_model_dir(shipped.default_model_dir(), name="bundled", timings=steps)
steps["load the bundled model (total)"] = time.perf_counter() - mark
print(json.dumps(steps))
"""


def in_process_steps() -> dict[str, float]:
    """Imports and the bundled model's load, in a fresh interpreter, each step in seconds."""
    result = subprocess.run([sys.executable, "-c", IN_PROCESS, str(browser.ROOT)], capture_output=True, text=True,
                            timeout=600, cwd=browser.ROOT)
    if result.returncode:
        raise RuntimeError("the in-process measurement failed:\n" + result.stderr[-2000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def _first_chart(page, url: str, title: str) -> float:
    began = time.perf_counter()
    page.goto(url, timeout=120_000)
    if title == "Checkpoints":
        page.get_by_role("heading", name=title).wait_for(timeout=120_000)
    else:
        page.wait_for_selector(CHART, state="attached", timeout=120_000)
    return time.perf_counter() - began


def _fresh_tab(context, url: str, title: str) -> float:
    """A page opened in a new tab, to its first chart; then the tab is left to finish (the rest of its script on
    the server, the rest of its figures in the browser) and closed, so that the next tab is timed on a quiet
    machine, as a speaker opens one link after another: a tab still drawing would slow the next one down."""
    page = context.new_page()
    seconds = _first_chart(page, url, title)
    browser.wait_until_idle(page, timeout_ms=120_000)
    page.close()
    return seconds


def _server_environment(run_log: Path, warm_up: bool) -> dict:
    return {"ATTNVIZ_RUN_LOG": str(run_log), "ATTNVIZ_WARM_UP": "1" if warm_up else "0"}


def cold_start(chromium, pages: dict[str, str], run_log, warm_up: bool = True) -> dict:
    """One fresh server: its health check, the first Explore chart, then ``pages`` each in a new tab and one page in
    a browser that never loaded the app (only when ``pages`` is not empty). ``warm_up=False`` starts the server
    with ``ATTNVIZ_WARM_UP=0``: the first session does everything, as with a plain script."""
    run_log.write_text("")
    spawned = time.perf_counter()
    with browser.streamlit_server(_server_environment(run_log, warm_up)) as server:
        row = {"healthy_s": time.perf_counter() - spawned}
        context = chromium.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        page.goto(server.url, timeout=120_000)
        page.wait_for_selector(CHART, state="attached", timeout=120_000)
        row["first_explore_chart_s"] = time.perf_counter() - spawned
        page.close()
        if warm_up and pages:
            _wait_for_line(run_log, WARM_UP_LATER_LINE)  # the other pages are timed once the warm-up is over
        # A fresh visit: a new tab of the same browser (a new Streamlit session; the browser's cache is warm, as it
        # is for a link opened during a talk) ...
        row["fresh_pages_s"] = {title: _fresh_tab(context, f"{server.url}/{path}", title)
                                for path, title in pages.items()}
        context.close()
        if pages:
            # ... and, for comparison, a browser that has never loaded the app (Streamlit's and Plotly's scripts
            # are downloaded and compiled again).
            fresh_browser = chromium.new_context(viewport={"width": 1400, "height": 1000})
            row["cold_browser_page_s"] = _first_chart(fresh_browser.new_page(), f"{server.url}/masks", "Masks")
            fresh_browser.close()
    runs = [json.loads(line) for line in run_log.read_text().splitlines() if line.strip()]
    first_runs = {}
    for run in runs:  # the first finished run of each page: a new session's full script run on the server
        if run["ending"] == "finished":
            first_runs.setdefault(run["page"], run["seconds"])
    row["warm_up_s"] = first_runs.pop(WARM_UP_LINE, None)
    first_runs.pop(WARM_UP_LATER_LINE, None)
    row["server_first_run_s"] = first_runs
    return row


def _wait_for_line(run_log: Path, page: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(json.loads(line)["page"] == page for line in run_log.read_text().splitlines() if line.strip()):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the server wrote no {page!r} line to its run log within {timeout:.0f} s")


LATE_VISIT_S = 12.0


def late_visit(chromium, run_log, warm_up: bool, wait_s: float = LATE_VISIT_S) -> float:
    """A speaker who starts the server before the talk and opens the browser later: the server is left alone for
    ``wait_s`` seconds (long enough for the warm-up to finish here), then a new tab goes to Explore heads; the
    seconds from navigation to its first chart."""
    run_log.write_text("")
    with browser.streamlit_server(_server_environment(run_log, warm_up)) as server:
        time.sleep(wait_s)
        context = chromium.new_context(viewport={"width": 1400, "height": 1000})
        seconds = _first_chart(context.new_page(), server.url, "Explore heads")
        context.close()
    return seconds


def bench_startup(repeats: int = 3, pages: dict[str, str] | None = None, progress=print,
                  late_after_s: float | None = LATE_VISIT_S, without_warm_up: bool = True) -> dict:
    """``without_warm_up=False`` (the tests' small version) skips the starts with ``ATTNVIZ_WARM_UP=0`` that the
    warm-up is compared with."""
    from playwright.sync_api import sync_playwright

    pages = PAGES if pages is None else pages
    progress("in a fresh interpreter: imports and the bundled model's load")
    report = {"benchmark": "startup", "repeats": repeats, "in_process": in_process_steps(), "starts": [],
              "starts_without_warm_up": [], "late_visits": [], "late_after_s": late_after_s,
              "targets": {"first_explore_chart_s": FIRST_CHART_TARGET_S, "fresh_page_s": FRESH_PAGE_TARGET_S}}
    with sync_playwright() as playwright, tempfile.TemporaryDirectory(prefix="attnviz-startup-") as work:
        chromium = browser.launch_chromium(playwright)
        for number in range(repeats):  # interleaved, so that a noisy minute weighs on both alike
            progress(f"cold start {number + 1} of {repeats}")
            report["starts"].append(cold_start(chromium, pages, Path(work) / "runs.jsonl"))
            if without_warm_up:
                progress(f"cold start {number + 1} of {repeats}, without the warm-up (ATTNVIZ_WARM_UP=0)")
                report["starts_without_warm_up"].append(cold_start(chromium, {}, Path(work) / "runs.jsonl", False))
            if late_after_s is not None:
                progress(f"cold start {number + 1} of {repeats}: the browser opened {late_after_s:g} s later")
                report["late_visits"].append({
                    "with_warm_up_s": late_visit(chromium, Path(work) / "runs.jsonl", True, late_after_s),
                    "without_warm_up_s": late_visit(chromium, Path(work) / "runs.jsonl", False, late_after_s)})
        chromium.close()
    return report


def summary(report: dict) -> dict:
    starts = report["starts"]
    pages = {title: statistics.median(start["fresh_pages_s"][title] for start in starts)
             for title in starts[0]["fresh_pages_s"]} if starts else {}
    served = {title: statistics.median(start["server_first_run_s"][title] for start in starts
                                       if title in start["server_first_run_s"])
              for title in starts[0]["server_first_run_s"]} if starts else {}
    without = report.get("starts_without_warm_up") or []
    warm_ups = [start["warm_up_s"] for start in starts if start.get("warm_up_s") is not None]
    return {
        "server_first_run_s": served,
        "cold_browser_page_s": statistics.median(start.get("cold_browser_page_s", float("nan")) for start in starts),
        "healthy_s": statistics.median(start["healthy_s"] for start in starts),
        "first_explore_chart_s": statistics.median(start["first_explore_chart_s"] for start in starts),
        "first_explore_chart_without_warm_up_s": (
            statistics.median(start["first_explore_chart_s"] for start in without) if without else None),
        "warm_up_s": statistics.median(warm_ups) if warm_ups else None,
        "late_visit_s": ({key: statistics.median(visit[key] for visit in report["late_visits"])
                          for key in ("with_warm_up_s", "without_warm_up_s")} if report.get("late_visits") else None),
        "fresh_pages_s": pages,
    }


def print_startup(report: dict) -> list[str]:
    lines = ["In a fresh interpreter (seconds):"]
    lines += [f"  {step:<48} {seconds:6.2f}" for step, seconds in report["in_process"].items()]
    middle = summary(report)
    targets = report["targets"]
    lines.append(f"From `streamlit run app.py` (median of {report['repeats']} cold starts):")
    lines.append(f"  {'server answers its health check':<48} {middle['healthy_s']:6.2f}")
    verdict = "meets" if middle["first_explore_chart_s"] <= targets["first_explore_chart_s"] else "misses"
    lines.append(f"  {'first Explore heads chart':<48} {middle['first_explore_chart_s']:6.2f}   {verdict} the "
                 f"{targets['first_explore_chart_s']:g} s target")
    if middle["warm_up_s"] is not None:
        lines.append(f"  {'  the warm-up thread, its first part':<48} {middle['warm_up_s']:6.2f}   "
                     "imports, bundled model, first capture, replay check")
    unwarmed = middle["first_explore_chart_without_warm_up_s"]
    if unwarmed is not None:
        lines.append(f"  {'first Explore chart without the warm-up':<48} {unwarmed:6.2f}   (ATTNVIZ_WARM_UP=0; "
                     f"with it: {middle['first_explore_chart_s'] / unwarmed:.2f}x the time)")
    late = middle["late_visit_s"]
    if late:
        lines.append(f"The browser opened {report['late_after_s']:g} s after `streamlit run app.py`, navigation to "
                     "the first Explore chart:")
        lines.append(f"  {'with the warm-up':<48} {late['with_warm_up_s']:6.2f}")
        lines.append(f"  {'without it (ATTNVIZ_WARM_UP=0)':<48} {late['without_warm_up_s']:6.2f}   (with it: "
                     f"{late['with_warm_up_s'] / late['without_warm_up_s']:.2f}x the time)")
    lines.append("A fresh session (a new tab) opening each page, once the warm-up is over, to its first chart, "
                 "median; and the server's own first run of it (app.py and the page):")
    for title, seconds in middle["fresh_pages_s"].items():
        mark = "" if seconds <= targets["fresh_page_s"] else f"   over the {targets['fresh_page_s']:g} s target"
        served = middle["server_first_run_s"].get(title)
        served_text = f"server {served:5.2f}" if served is not None else ""
        lines.append(f"  {title:<48} {seconds:6.2f}   {served_text}{mark}")
    if middle["fresh_pages_s"]:
        lines.append(f"  {'Masks in a browser that never loaded the app':<48} {middle['cold_browser_page_s']:6.2f}   "
                     "(Streamlit's and Plotly's scripts downloaded and compiled again)")
        worst = max(middle["fresh_pages_s"], key=middle["fresh_pages_s"].get)
        lines.append(f"Slowest fresh page: {worst}, {middle['fresh_pages_s'][worst]:.2f} s.")
    return lines
