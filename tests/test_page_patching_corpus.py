"""The patching experiment of "Does this head matter?" over a corpus: a run started on the page goes on in a process of
its own, its maps are the mean of the shares its DuckDB file holds (as attnviz.open_patching reads them), a stopped run
goes on when asked, and a corpus that cannot be read is refused in words."""

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from attnviz.api.patching_runs import open_patching
from attnviz.viz.style import format_number
from tests.apptest_helpers import assert_no_failure, figure_titled, open_page, plotly_array, wait_while_progress

PAGE = "app_pages/importance.py"
CORPUS = "A corpus, in the background"


def corpus_view(docs: int = 5, period: int = 16):
    at = open_page(PAGE, timeout=300, imp_view="Activation patching")
    at.segmented_control(key="pat_source").set_value(CORPUS).run()
    assert_no_failure(at)
    at.number_input(key="pat_corpus_docs").set_value(docs)
    at.number_input(key="pat_corpus_period").set_value(period).run()
    assert_no_failure(at)
    return at


def wait_for_the_run(at, seconds: float = 120):
    return wait_while_progress(at, seconds, "the run")


def kept_mean(shares: torch.Tensor) -> np.ndarray:
    """The mean over the documents that have a gap (a document whose clean and corrupted runs agree has none)."""
    kept = shares[~shares.reshape(len(shares), -1).isnan().all(-1)]
    return kept.mean(0).numpy()


def test_a_run_started_on_the_page_draws_the_mean_of_what_its_database_holds(clean_streamlit_caches):
    at = corpus_view()
    assert any("do not apply here" in c.value for c in at.caption)  # the looks are the preset's
    button = at.button(key="pat_corpus_run")
    assert button.label == "Patch 5 documents"
    button.click().run()
    assert_no_failure(at)
    assert at.get("progress") or at.button(key="pat_corpus_run").label == "Patched: see below"
    wait_for_the_run(at)
    assert_no_failure(at)
    assert at.button(key="pat_corpus_run").label == "Patched: see below"  # the same settings reopen the results
    run = open_patching(at.session_state["pat_corpus_path"])
    assert run.status == "finished" and run.settings["period"] == 16
    receiver = at.selectbox(key="pat_corpus_receiver").value
    path = f"{receiver[0]}.{receiver[1]}:k"
    assert run.names() == ["resid", "head", f"{path}/frozen", f"{path}/free"]
    measured = len(run.shares("resid"))
    assert next(m.value for m in at.metric if m.label == "Documents") == str(measured)
    for title, name in (("Residual stream patched", "resid"), ("Head output patched", "head"),
                        (f"Into L{receiver[0]} H{receiver[1]}'s keys: MLPs held", f"{path}/frozen"),
                        (f"Into L{receiver[0]} H{receiver[1]}'s keys: MLPs free", f"{path}/free")):
        heatmap = figure_titled(at, title)["data"][0]
        shown = plotly_array(heatmap["z"])
        np.testing.assert_allclose(shown, kept_mean(run.shares(name)), atol=1e-9, equal_nan=True)
        # each cell's 95% interval on hover is the run's own bootstrap (the page computes it a slice at a time)
        expected = run.spread(name)
        assert expected.examples == measured
        row, column = np.unravel_index(np.nanargmax(np.abs(shown)), shown.shape)
        interval = (f"95% interval: {format_number(float(expected.low[row, column]))} to "
                    f"{format_number(float(expected.high[row, column]))}")
        assert interval in heatmap["hovertext"][row][column]
    said = " ".join(m.value for m in at.markdown)
    assert "The largest cell is" in said and "Strongest sender into" in said
    # a rerun reads nothing again: its results are kept by the file's stamp
    started = time.perf_counter()
    at.run()
    assert time.perf_counter() - started < 1.5
    assert_no_failure(at)


def test_a_stopped_run_goes_on_when_asked(clean_streamlit_caches):
    from attnviz.corpus.importance.runner import read_corpus_spec
    from attnviz.corpus.patching.runner import PatchingSettings, run_patching
    from attnviz.models.shipped import BUNDLED_GPT_DIR

    at = corpus_view(docs=6)
    at.toggle(key="pat_corpus_paths").set_value(False).run()
    assert at.button(key="pat_corpus_run").label == "Patch 6 documents"
    path = at.session_state["pat_corpus_path"]
    # the same run, stopped after its first chunk of two documents (the chunk size is not part of a run's key)
    done = []
    run_patching(read_corpus_spec("bundled", keep=6), BUNDLED_GPT_DIR, path,
                 PatchingSettings(max_docs=6, period=16, sites=("resid", "head"), mlps=("frozen", "free"),
                                  chunk_docs=2), progress=lambda state: done.append(state.done),
                 should_stop=lambda: bool(done) and done[-1] >= 2)
    assert open_patching(path).status == "stopped" and open_patching(path).done == 2
    at.run()
    assert_no_failure(at)
    assert at.button(key="pat_corpus_run").label == "Go on patching"
    assert any("Stopped part way" in c.value for c in at.caption)
    assert next(m.value for m in at.metric if m.label == "Documents") == "2"
    # going on, then Stop on the page: the run ends, what it committed is kept, and it goes on again when asked
    at.button(key="pat_corpus_run").click().run()
    assert_no_failure(at)
    at.button(key="pat_corpus_stop").click().run()
    assert_no_failure(at)
    wait_for_the_run(at)
    assert_no_failure(at)
    assert at.button(key="pat_corpus_run").label in ("Go on patching", "Patched: see below")
    if at.button(key="pat_corpus_run").label == "Go on patching":
        at.button(key="pat_corpus_run").click().run()
        wait_for_the_run(at)
        assert_no_failure(at)
    assert at.button(key="pat_corpus_run").label == "Patched: see below"
    run = open_patching(path)
    assert run.status == "finished" and run.done == 6 and run.names() == ["resid", "head"]
    assert Path(path).stem == run.settings["key"]  # the page names the run as the runner keys it
    shown = plotly_array(figure_titled(at, "Residual stream patched")["data"][0]["z"])
    np.testing.assert_allclose(shown, kept_mean(run.shares("resid")), atol=1e-9, equal_nan=True)


@pytest.mark.parametrize("name, data, said", [
    ("broken.parquet", b"not a parquet file", "cannot"),
    ("empty.txt", b"\n\n", "no document"),
])
def test_a_corpus_that_cannot_be_read_is_refused_in_words(name, data, said, clean_streamlit_caches):
    at = open_page(PAGE, timeout=300, imp_view="Activation patching", pat_source=CORPUS)
    at.selectbox(key="pat_corpus").set_value("A corpus file, uploaded").run()
    assert_no_failure(at)
    assert not any(b.key == "pat_corpus_run" for b in at.button)  # nothing to start before a file is given
    at.file_uploader(key="pat_corpus_upload").set_value((name, data, "application/octet-stream")).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(said in e.value for e in at.error), [e.value for e in at.error]
    assert not any(b.key == "pat_corpus_run" for b in at.button)


def test_the_spread_over_thousands_of_documents_is_that_of_one_call_a_slice_at_a_time(monkeypatch):
    from attnviz.interventions import activation_patching as ap
    from attnviz.ui import patching_run_results

    shares = torch.randn(30, 5, 7, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    shares[:, 4, 5:] = float("nan")  # a layer with fewer heads
    monkeypatch.setattr(patching_run_results, "MOST_GATHERED", 2000 * 30 * 4)  # four cells a slice
    sliced, whole = patching_run_results.spread_over_documents(shares), ap.spread(shares)
    for name in ("mean", "std", "low", "high"):
        torch.testing.assert_close(getattr(sliced, name), getattr(whole, name), equal_nan=True)
    assert sliced.examples == whole.examples == 30
