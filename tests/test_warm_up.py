"""The warm-up at server start: `streamlit run app.py` serves app.py's `st.App`, whose lifespan loads the bundled
model (and what Explore heads computes on a first visit) before any browser connects."""

import asyncio
import importlib.util
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from attnviz.app import SCRIPT
from attnviz.ui import captures, lifespan, loaded_models
from attnviz.ui.caches import explore_heads as explore_cache
from tests.apptest_helpers import ROOT, open_page

warm_up_module = importlib.import_module("attnviz.ui.warm_up")  # the module, not its function


@pytest.mark.parametrize("served", ["app.py", "attnviz/app/streamlit_app.py"])
def test_streamlit_run_finds_the_asgi_app(monkeypatch, served):
    """`streamlit run app.py` (a checkout) and `attnviz serve` (the installed script) serve an ASGI app: Streamlit
    reads the file's syntax tree; imported as a module, the file builds it with the warm-up lifespan, on the app's
    script, and runs no page code."""
    import streamlit as st
    from streamlit import config
    from streamlit.web.server.app_discovery import discover_asgi_app

    found = discover_asgi_app(ROOT / served)
    assert found.is_asgi_app and found.import_string == f"{Path(served).stem}:app"

    monkeypatch.setattr(config, "_main_script_path", None)  # st.App pins it; leave the test process as it was

    def page_code(*args, **kwargs):
        raise AssertionError("importing app.py ran a session's code")

    monkeypatch.setattr(st, "set_page_config", page_code)
    monkeypatch.setattr(st, "navigation", page_code)
    spec = importlib.util.spec_from_file_location(Path(served).stem, ROOT / served)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert isinstance(module.app, st.App)
    assert Path(module.app.script_path).resolve() == SCRIPT
    assert module.app._user_lifespan is lifespan.server_lifespan


def _enter_and_leave(lifespan) -> None:
    """Start and stop the lifespan as uvicorn does, on an event loop of its own (on a thread of its own: earlier
    tests' sync Playwright leaves a loop running on this one)."""
    async def run():
        async with lifespan(None):
            pass

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, run()).result()


def test_lifespan_returns_at_once_and_warms_up_in_a_thread(monkeypatch):
    release, started = threading.Event(), threading.Event()

    def slow_warm_up():
        started.set()
        release.wait(10)

    monkeypatch.setattr(lifespan, "_warm_up", slow_warm_up)
    monkeypatch.delenv("ATTNVIZ_WARM_UP", raising=False)
    _enter_and_leave(lifespan.server_lifespan)  # returns while the warm-up is still running: the server answers
    assert started.wait(5)
    (thread,) = [t for t in threading.enumerate() if t.name == lifespan.WARM_UP_THREAD]
    assert thread.daemon and thread.is_alive()  # never holds the server's shutdown
    release.set()
    thread.join(5)


def test_warm_up_can_be_turned_off(monkeypatch):
    called = []
    monkeypatch.setattr(lifespan, "_warm_up", lambda: called.append(True))
    monkeypatch.setenv("ATTNVIZ_WARM_UP", "0")
    _enter_and_leave(lifespan.server_lifespan)
    assert not called and not [t for t in threading.enumerate() if t.name == lifespan.WARM_UP_THREAD]


def test_a_failed_second_part_is_logged_as_itself(monkeypatch, tmp_path, caplog):

    def broken():
        raise OSError("no memory left")

    monkeypatch.setattr(warm_up_module, "warm_up", lambda: None)
    monkeypatch.setattr(warm_up_module, "warm_up_later", broken)
    monkeypatch.setenv("ATTNVIZ_RUN_LOG", str(tmp_path / "runs.jsonl"))
    monkeypatch.setattr(lifespan, "VISITOR_WAIT_S", 0)
    lifespan._warm_up()
    lines = [json.loads(text) for text in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [(line["page"], line["ending"]) for line in lines] == [
        (lifespan.WARM_UP_LINE, "finished"), (lifespan.WARM_UP_LATER_LINE, "failed")]
    assert "warm-up of the other pages failed" in caplog.text and "no memory left" in caplog.text


def test_the_lifespan_opens_a_browser_only_when_not_headless(monkeypatch):
    from streamlit import cli_util, config

    opened = []
    monkeypatch.setattr(cli_util, "open_browser", opened.append)
    monkeypatch.setattr(lifespan, "_warm_up", lambda: None)
    for headless in (True, False):
        monkeypatch.setattr(config, "get_option", lambda name, headless=headless, real=config.get_option: (
            headless if name == "server.headless" else real(name)))
        _enter_and_leave(lifespan.server_lifespan)
    (url,) = opened
    assert url.startswith("http://localhost:")


def test_a_failed_warm_up_is_logged_not_raised(monkeypatch, tmp_path, caplog):

    def broken():
        raise OSError("disk gone")

    monkeypatch.setattr(warm_up_module, "warm_up", broken)
    monkeypatch.setenv("ATTNVIZ_RUN_LOG", str(tmp_path / "runs.jsonl"))
    monkeypatch.setattr(lifespan, "VISITOR_WAIT_S", 0)
    monkeypatch.setattr(lifespan, "DRAWING_WAIT_S", 0)
    lifespan._warm_up()
    (line,) = [json.loads(text) for text in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert line["page"] == "(warm-up at server start)" and line["ending"] == "failed"
    assert "warm-up at server start failed" in caplog.text and "disk gone" in caplog.text


def test_the_second_part_waits_for_the_first_visitor(monkeypatch):
    """The Scaling experiments (seconds of CPU) start only once a session has run (plus a moment for its browser
    to draw), not while the first visitor's page is being made and drawn."""

    first_done, second_done = threading.Event(), threading.Event()
    monkeypatch.setattr(warm_up_module, "warm_up", first_done.set)
    monkeypatch.setattr(warm_up_module, "warm_up_later", second_done.set)
    monkeypatch.setattr(lifespan, "VISITOR_WAIT_S", 60)
    monkeypatch.setattr(lifespan, "DRAWING_WAIT_S", 0)
    monkeypatch.setattr(lifespan, "SESSION_RAN", threading.Event())
    thread = threading.Thread(target=lifespan._warm_up)
    thread.start()
    assert first_done.wait(10)
    assert not second_done.wait(0.5) and thread.is_alive()  # waiting for a visitor
    lifespan.SESSION_RAN.set()  # app.py does this after every run
    assert second_done.wait(10)
    thread.join(10)
    assert not thread.is_alive()


def test_app_py_says_when_a_session_has_run(monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setattr(lifespan, "SESSION_RAN", threading.Event())
    AppTest.from_file(str(SCRIPT), default_timeout=120).run()
    assert lifespan.SESSION_RAN.is_set()


@pytest.mark.usefixtures("clean_streamlit_caches")
def test_the_first_visit_finds_everything_made(monkeypatch, tmp_path):
    """After the warm-up, a new session's Explore heads neither loads the model, nor captures, nor replays: the
    warm-up made the very cache entries the page reads."""

    monkeypatch.setenv("ATTNVIZ_RUN_LOG", str(tmp_path / "runs.jsonl"))
    monkeypatch.setattr(lifespan, "VISITOR_WAIT_S", 0)  # no visitor to wait for: both parts at once
    monkeypatch.setattr(lifespan, "DRAWING_WAIT_S", 0)
    thread = threading.Thread(target=lifespan._warm_up, name=lifespan.WARM_UP_THREAD)
    thread.start()
    thread.join(300)
    lines = [json.loads(text) for text in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [(line["page"], line["ending"]) for line in lines] == [
        (lifespan.WARM_UP_LINE, "finished"), (lifespan.WARM_UP_LATER_LINE, "finished")]

    calls = []

    def counted(name, function):
        def wrapper(*args, **kwargs):
            calls.append(name)
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(loaded_models, "load_model_dir", counted("load", loaded_models.load_model_dir))
    monkeypatch.setattr(captures, "capture", counted("capture", captures.capture))
    monkeypatch.setattr(explore_cache, "replay_difference", counted("replay", explore_cache.replay_difference))
    at = open_page("app_pages/explore_heads.py")
    assert any("Replay check" in m.value for m in at.markdown)  # the page did show what the warm-up computed
    assert at.get("plotly_chart")
    assert calls == []

    # The check is real: with a sentence the warm-up did not see, the page does capture.
    at = open_page("app_pages/explore_heads.py", sentence="A different sentence entirely.")
    assert "capture" in calls and "load" not in calls

    # The Scaling page's experiments, sampled at their defaults, are not sampled again; other settings are.
    from attnviz.core import scaling

    experiments = ("dot_product_variance", "dot_samples", "softmax_statistics", "stability_table")
    for name in experiments:
        monkeypatch.setattr(scaling, name, counted(name, getattr(scaling, name)))
    calls.clear()
    at = open_page("app_pages/scaling.py")
    assert at.get("plotly_chart") and not at.exception
    assert not [name for name in calls if name in experiments], calls
    at.select_slider(key="scale_keys").set_value(64).run()
    assert "softmax_statistics" in calls


def test_the_second_part_fills_what_the_generation_page_reads_first(monkeypatch, clean_streamlit_caches):
    """After the warm-up's second part a fresh Generation page computes nothing itself: loading the tiny GPT,
    measuring its heads and generating from the default prompt would fail here, and the page still shows its
    generation and the heads it learned (the entries the warm-up made, the very ones the page reads)."""
    from attnviz.pagelogic.generation import decode as gen
    from attnviz.pagelogic.generation import heads as generation_heads

    warm_up_module.warm_up_later()

    def not_again(*args, **kwargs):
        raise AssertionError("computed again on the first visit")

    monkeypatch.setattr(gen, "generate", not_again)
    monkeypatch.setattr(generation_heads, "find_circuits", not_again)
    monkeypatch.setattr(loaded_models, "load_causal_lm", not_again)
    at = open_page("app_pages/generation.py")
    assert not at.exception and not at.error, [e.value for e in at.exception] + [e.value for e in at.error]
    assert any("induction head" in m.value for m in at.markdown)


def test_the_second_part_times_the_flash_page_s_opening_settings(monkeypatch, clean_streamlit_caches):
    """After the warm-up's Flash part, a fresh Flash page at its opening settings shows that measurement (its time
    stamp) and times and traces nothing itself; another query block is traced, another N measured, by the page."""
    import time as clock

    from attnviz.pagelogic import flash as flash_page
    from attnviz.ui.caches.shared_measurements import shared_measurements

    warm_up_module.warm_flash_page()
    ((key, (rows, measured_at)),) = shared_measurements().results.items()
    assert key[0] == flash_page.default_case() and [row.name for row in rows] == list(flash_page.DEFAULT_CONTENDERS)
    assert next(row for row in rows if row.name == "naive").median_ms > 0

    timed, traced = [], []
    real, real_tiling = flash_page.run_contenders, flash_page.tiling
    monkeypatch.setattr(flash_page, "run_contenders", lambda *a, **k: timed.append(a[0].n) or real(*a, **k))
    monkeypatch.setattr(flash_page, "tiling", lambda *a: traced.append(a[1:]) or real_tiling(*a))
    at = open_page("app_pages/flash.py")
    assert not at.exception, [e.value for e in at.exception]
    assert timed == [] and traced == []  # the tiling's trace too was made by the warm-up
    at.slider(key="flash_trace_block").set_value(3).run()
    assert traced == [(64, 64, 3)]
    stamp = clock.strftime("%H:%M:%S", clock.localtime(measured_at))
    assert any(f"Measured on this server at {stamp}" in c.value for c in at.caption)
    at.select_slider(key="flash_n").set_value(256).run()
    assert timed == [256]
