"""The Over training page's series source (attnviz.ui.over_training_series.series_source) in AppTest: a folder typed
on the page is checked, measured by a background job of the server's queue, and returned as the Run its DuckDB file
holds; a stopped series resumes from the page and stops from it; what cannot be measured is refused in words; a server
that reads no folders says so. One background job runs (stopped from the page once it has measured a checkpoint): a
process's start is most of the time these tests take."""

import json
import shutil
import time
from pathlib import Path

import duckdb
import pytest
import torch
from streamlit.testing.v1 import AppTest

from attnviz.corpus.series import runner as sr
from attnviz.corpus.series.store import open_series
from tests.apptest_helpers import wait_while_progress
from tests.test_series import STEPS, assert_same_rows, copy_tokenizer, make_series


def script():
    import streamlit as st

    from attnviz.ui.over_training_series import series_source

    run = series_source()
    st.markdown("RUN: " + ("none" if run is None else ",".join(str(step) for step in run.steps)))


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    return make_series(tmp_path_factory.mktemp("page-series"), STEPS)


def source(folder=None) -> AppTest:
    at = AppTest.from_function(script, default_timeout=120).run()
    assert not at.exception, [e.value for e in at.exception]
    if folder is not None:
        at.text_input(key="ot_series_folder").set_value(str(folder)).run()
        assert not at.exception, [e.value for e in at.exception]
    return at


def said_run(at: AppTest) -> str:
    return next(m.value for m in at.markdown if m.value.startswith("RUN: "))[5:]


def wait_for_the_job(at: AppTest, seconds: float = 150) -> AppTest:
    return wait_while_progress(at, seconds, "the series' job")


def job_progress(path) -> dict:
    """The background job's progress file, beside its database (attnviz.corpus.background.ScanFolder)."""
    try:
        return json.loads(Path(path).with_name(Path(path).stem + ".progress.json").read_text())
    except (OSError, ValueError):
        return {}


def test_a_folder_typed_on_the_page_is_measured_in_the_background_resumed_and_stopped(series, tmp_path,
                                                                                       clean_streamlit_caches):
    folder = tmp_path / "run"
    shutil.copytree(series, folder)
    at = source()
    assert said_run(at) == "none" and any("Give a folder of checkpoints" in c.value for c in at.caption)
    at.text_input(key="ot_series_folder").set_value(str(folder)).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("3 checkpoints (steps 100 to 300) of a gpt2 of 2 layers x 2 heads" in c.value for c in at.caption)
    assert at.button(key="ot_series_start").label == "Measure 3 checkpoints" and said_run(at) == "none"
    # the same series, stopped after its first checkpoint: the page returns what is measured, and resumes it
    path = at.session_state["ot_series_path"]
    asked = []
    torch.set_num_threads(1)
    sr.run_series(folder, path, should_stop=lambda: asked.append(1) or len(asked) > 1)
    at.run()
    assert said_run(at) == "100"
    button = at.button(key="ot_series_resume")
    assert button.label == "Resume: 2 checkpoints left"
    button.click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.get("progress")  # the job's progress, with its Stop
    # One job (a process's start is most of this test's time): stopped from the page once it has measured a checkpoint
    deadline = time.time() + 150
    while int(job_progress(path).get("done", 0)) < 2 and job_progress(path).get("status") != "finished":
        assert time.time() < deadline, "the series' job measured nothing"
        time.sleep(0.5)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    if at.get("progress"):  # still running: it stops after the checkpoint in progress
        at.button(key="ot_series_stop").click().run()
        assert not at.exception, [e.value for e in at.exception]
    wait_for_the_job(at)
    assert not at.error, [e.value for e in at.error]
    by_the_job = [step for step in open_series(path).steps if step != 100]
    assert by_the_job[:1] == [200]
    if said_run(at) != "100,200,300":  # stopped before the last: the page offers what is left, measured here
        assert said_run(at) == "100,200" and at.button(key="ot_series_resume").label == "Resume: 1 checkpoint left"
        sr.run_series(folder, path)
        at.run()
    assert not at.error, [e.value for e in at.error]
    assert said_run(at) == "100,200,300"
    assert any("Every checkpoint is measured (3)" in s.value for s in at.success)
    run = open_series(path)
    assert run.facts["status"] == "finished" and run.checkpoints == {step: folder / f"step{step}" for step in STEPS}
    # the background job's rows are the runner's: the same file with the job's steps measured again here
    here = tmp_path / "here.duckdb"
    shutil.copy(path, here)
    with duckdb.connect(str(here)) as connection:
        for table in ("steps", "head_scores"):
            connection.execute(f"DELETE FROM {table} WHERE step IN ({', '.join(map(str, by_the_job))})")
    assert sr.run_series(folder, here).done_this_run == len(by_the_job)
    assert_same_rows(run.rows, open_series(here).rows, rel=1e-6, abs_=1e-9)


def test_what_cannot_be_a_series_is_refused_in_words(series, tmp_path, clean_streamlit_caches):
    at = source(tmp_path / "nowhere")
    assert any("does not exist on this server" in e.value for e in at.error), [e.value for e in at.error]
    shutil.copytree(series / "step100", tmp_path / "bad" / "final")
    copy_tokenizer(tmp_path / "bad")
    at.text_input(key="ot_series_folder").set_value(str(tmp_path / "bad")).run()
    assert not at.exception
    assert [e.value for e in at.error] == ["This folder cannot be measured as a series: final holds a checkpoint, but "
                                          "its name has no step number: name each checkpoint's folder with its step "
                                          "(step1000, checkpoint-1000, ...)."]
    assert not at.button and said_run(at) == "none"


def test_a_server_that_reads_no_folders_says_so(monkeypatch, clean_streamlit_caches):
    monkeypatch.setenv("ATTNVIZ_SERVER_FOLDERS", "0")
    at = source()
    assert any("reads no folders on its disk" in i.value for i in at.info)
    assert not at.text_input and said_run(at) == "none"
