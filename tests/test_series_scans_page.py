"""The Over training page's series source with a corpus scan per checkpoint (attnviz.ui.over_training_series) in
AppTest: "Scan a corpus at each checkpoint" is off by default and, on, offers to scan a measured series without
measuring it again; once the checkpoints are scanned, a statistic's layer x head map is drawn at the step of the
page's step slider (``ot_step``), its cells the values the series' file holds for that step and statistic (read with
the notebook API), and it changes with the step and with the statistic; on the whole page, with its step slider."""

import dataclasses
import json
import shutil
from pathlib import Path

import duckdb
import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

from attnviz.api.series import series_scan_maps
from attnviz.corpus.series import runner as sr
from attnviz.ui.over_training_series import SETTINGS
from tests.apptest_helpers import assert_no_failure, figure_containing, open_page, plotly_array
from tests.test_series import make_series
from tests.test_series_scans import LINES

STEPS = (100, 200)


def script():
    import streamlit as st

    from attnviz.ui.over_training_series import series_source

    run = series_source()
    st.markdown("RUN: " + ("none" if run is None else ",".join(str(step) for step in run.steps)))


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    root = make_series(tmp_path_factory.mktemp("page-scanned-series"), STEPS)
    corpus = root.parent / "page-corpus.txt"
    corpus.write_text("\n".join(LINES) + "\n")
    return root, corpus


@pytest.fixture(scope="module")
def scanned_file(series, tmp_path_factory):
    """The series measured on the page's probe and scanned over the small corpus (as the page's job would scan it over
    the bundled one), once for the module: each test copies it where the page reads the series."""
    folder, corpus = series
    path = tmp_path_factory.mktemp("page-scanned") / "series.duckdb"
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sr.run_series(folder, path, dataclasses.replace(SETTINGS, corpus=str(corpus), scan_docs=5, scan_tokens=24))
    finally:
        torch.set_num_threads(before)
    return path


def measured_only(scanned: Path, target: Path) -> None:
    """``scanned`` copied to ``target`` without its scans: the series as measured before a corpus was chosen."""
    shutil.copy(scanned, target)
    with duckdb.connect(str(target)) as connection:
        connection.execute("DELETE FROM scan_heads")
        connection.execute("DELETE FROM scan_steps")


def said_run(at: AppTest) -> str:
    return next(m.value for m in at.markdown if m.value.startswith("RUN: "))[5:]


def cells(spec: dict) -> np.ndarray:
    return plotly_array(spec["data"][0]["z"])


def the_map(at: AppTest) -> dict:
    charts = at.get("plotly_chart")
    assert len(charts) == 1, "one figure: the statistic's map"
    spec = charts[0].proto.spec
    assert len(spec) < 2 * 1024**2  # a small figure: a few cells per head
    return json.loads(spec)


def test_the_map_of_a_scanned_series_plays_with_the_step(series, scanned_file, clean_streamlit_caches):
    folder, _ = series
    at = AppTest.from_function(script, default_timeout=60).run()
    at.text_input(key="ot_series_folder").set_value(str(folder)).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.toggle(key="ot_series_scan").value is False  # off by default: the measures only
    path = Path(at.session_state["ot_series_path"])
    measured_only(scanned_file, path)  # measured before, without a corpus
    at.run()
    assert said_run(at) == "100,200" and not at.get("plotly_chart") and at.success  # nothing scanned: no map
    at.toggle(key="ot_series_scan").set_value(True).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.button(key="ot_series_resume").label == "Scan 2 checkpoints over the corpus"
    shutil.copy(scanned_file, path)  # the checkpoints scanned
    at.toggle(key="ot_series_scan").set_value(False).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any(h.value == "A statistic's map over training" for h in at.subheader)
    statistic = at.selectbox(key="ot_series_statistic")
    assert statistic.value == "induction"  # what the map opens on where the scans have it
    latest = the_map(at)
    assert "at step 200" in latest["layout"]["title"]["text"]  # no slider yet: the latest scanned step
    maps = series_scan_maps(path, "induction")
    np.testing.assert_allclose(cells(latest), maps[200], rtol=1e-12)
    at.session_state["ot_step"] = 100
    at.run()
    first = the_map(at)
    assert "at step 100" in first["layout"]["title"]["text"]
    np.testing.assert_allclose(cells(first), maps[100], rtol=1e-12)
    assert not np.allclose(cells(first), cells(latest))  # the map moves over training
    assert first["data"][0]["zmin"] == latest["data"][0]["zmin"] == 0  # one colour range for every step
    caption = next(c.value for c in at.caption if c.value.startswith("Highest at step 100"))
    layer, head = np.unravel_index(np.nanargmax(maps[100]), np.shape(maps[100]))
    assert f"L{layer} H{head} ({maps[100][layer][head]:.3g})" in caption
    at.selectbox(key="ot_series_statistic").set_value("previous").run()
    np.testing.assert_allclose(cells(the_map(at)), series_scan_maps(path, "previous")[100], rtol=1e-12)


def test_on_the_over_training_page_the_step_slider_plays_the_map(series, scanned_file, clean_streamlit_caches):
    """The whole page: the series source above, its step slider (``ot_step``, made after the map) below."""
    folder, _ = series
    at = open_page("app_pages/over_training.py")
    at.segmented_control(key="ot_source").set_value("series").run()
    at.text_input(key="ot_series_folder").set_value(str(folder)).run()
    assert_no_failure(at)
    path = at.session_state["ot_series_path"]
    shutil.copy(scanned_file, path)
    at.run()
    assert_no_failure(at)
    maps = series_scan_maps(path, "induction")
    for step in (100, 200, 100):
        at.select_slider(key="ot_step").set_value(step).run()
        assert_no_failure(at)
        drawn = figure_containing(at, "every head, at step")
        assert f"at step {step} " in drawn["layout"]["title"]["text"]
        np.testing.assert_allclose(cells(drawn), maps[step], rtol=1e-12)
