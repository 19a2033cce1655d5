"""The load benchmark, small: two browser sessions at once on one server, one of them with its own upload.
(`python -m attnviz.bench load --sessions 8` is the full one; its figures are in docs/benchmarks.md.)"""

from concurrent.futures import ThreadPoolExecutor

import pytest

from attnviz.bench import load
from tests.e2e.conftest import _require_browser

pytestmark = pytest.mark.e2e


def test_two_sessions_at_once_each_see_only_their_own(tmp_path):
    _require_browser()
    # On a thread of its own: the benchmark runs its own asyncio loop, and the other browser tests' sync
    # Playwright may hold this thread's.
    with ThreadPoolExecutor(1) as pool:
        report = pool.submit(load.bench_load, 2, 1, tmp_path, lambda _line: None, False).result()
    assert load.problems_of(report) == []  # no exception, own words and model only, uploads gone
    (round_,) = report["rounds_results"]
    sessions = {session["index"]: session for session in round_["sessions"]}
    assert sessions[1]["model"] == "tiny-gpt2-s1" and "upload" in sessions[1]["seconds"]
    for session in sessions.values():
        assert set(load.PAGES) <= set(session["seconds"])  # every page was visited and finished
    assert round_["uploads_left"] == []
    # The server logged its runs of every visited page, for the lone session and for the crowd.
    served = {row["page"] for row in load.server_table(report)}
    assert {"Explore heads", "Masks", "Scaling and softmax", "Flash vs naive"} <= served
    # Memory after the crowd has gone stays within what the bounded caches allow: the tiny uploads are a few MB,
    # so well under 600 MiB above a lone session's footprint.
    assert round_["rss_after"] < report["rss_after_baseline"] + 600 * 2**20
    printed = "\n".join(load.print_load(report))
    assert "Slowest page in the browser under 2 sessions" in printed and "Bounded by" in printed


def test_the_startup_benchmark_times_a_cold_start_and_a_fresh_page():
    from attnviz.bench import startup

    _require_browser()
    with ThreadPoolExecutor(1) as pool:  # sync Playwright of its own: on a thread of its own
        # the small version: one start with the warm-up, no start without it (tests/test_warm_up.py checks that
        # ATTNVIZ_WARM_UP=0 turns it off), no late visits: the benchmark's own
        report = pool.submit(startup.bench_startup, 1, {"checkpoints": "Checkpoints"}, lambda _line: None,
                             None, False).result()
    (start,) = report["starts"]
    assert 0 < start["healthy_s"] < start["first_explore_chart_s"]
    assert start["fresh_pages_s"]["Checkpoints"] > 0 and start["cold_browser_page_s"] > 0
    assert "Explore heads" in start["server_first_run_s"]  # read from the server's run log
    assert start["warm_up_s"] > 0  # the server's warm-up thread ran and said so in the run log
    assert report["starts_without_warm_up"] == []
    steps = report["in_process"]
    assert steps["load the bundled model (total)"] >= steps["  weights (from_pretrained)"] > 0
    printed = "\n".join(startup.print_startup(report))
    assert "first Explore heads chart" in printed and "Checkpoints" in printed
    assert "without the warm-up" not in printed
    assert report["late_visits"] == []
