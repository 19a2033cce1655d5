"""The "Does this head matter?" page over a corpus: a run started on the page goes on in a process of its own, and
its maps, agreement, per-head spread and documents show what its DuckDB file holds; a scan's documents are a
corpus; a document opens in Explore heads on the head."""

import time

import numpy as np
import pytest

from attnviz.corpus.importance import store as istore
from attnviz.models.shipped import BUNDLED_GPT_NAME
from tests.apptest_helpers import figure_titled, open_page, plotly_array, wait_while_progress
from tests.tiny_models import TINY_GPT_HEADS, TINY_GPT_LAYERS

PAGE = "app_pages/importance.py"


def wait_for_the_run(at, seconds: float = 240):
    return wait_while_progress(at, seconds, "the run")


@pytest.mark.slow
def test_a_corpus_run_started_on_the_page_shows_what_its_database_holds(clean_streamlit_caches):
    at = open_page(PAGE, timeout=300, imp_view="Importance map")
    at.segmented_control(key="imp_source").set_value("A corpus, in the background").run()
    at.number_input(key="imp_corpus_docs").set_value(6)
    at.number_input(key="imp_corpus_tokens").set_value(16).run()
    button = at.button(key="imp_corpus_run")
    assert button.label == "Measure every head over 6 documents"
    button.click().run()
    assert at.get("progress") or at.button(key="imp_corpus_run").label == "Measured: see below"
    wait_for_the_run(at)
    assert at.button(key="imp_corpus_run").label == "Measured: see below"  # the same settings reopen the results
    documents = next(m.value for m in at.metric if m.label == "Documents")
    assert documents == "6"
    with istore.ImportanceReader(at.session_state["imp_corpus_path"]) as reader:
        maps = reader.maps()
        assert reader.documents == 6 and reader.settings["status"] == "finished"
    shown = plotly_array(figure_titled(at, "Zero ablation")["data"][0]["z"])
    np.testing.assert_allclose(shown, maps["zero"][0], atol=1e-9)
    assert any("averaged over documents" in c.value for c in at.caption)
    assert len(at.dataframe[0].value) == 3  # the agreement of three measures
    # the documents where a head matters most, each openable in Explore heads on that head
    at.selectbox(key="imp_corpus_layer").set_value(1).run()
    at.selectbox(key="imp_corpus_head").set_value(2).run()
    with istore.ImportanceReader(at.session_state["imp_corpus_path"]) as reader:
        first = reader.per_document("zero", 1, 2)["text"].iloc[0]
    at.button(key="imp_corpus_open_0").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert (at.session_state["layer"], at.session_state["head"], at.session_state["view"]) == (1, 2, "head")
    assert at.session_state["model"] == BUNDLED_GPT_NAME  # the page's model (the sidebar's has no loss)
    from attnviz.models.capture import capture
    from attnviz.models.loading import load_model_dir
    from attnviz.models.shipped import bundled_models

    gpt = load_model_dir(bundled_models()[BUNDLED_GPT_NAME], name=BUNDLED_GPT_NAME)
    opened = at.session_state["sentence"]
    assert first.startswith(opened) and len(capture(gpt, opened).tokens) <= 16  # the document as the run read it


def test_the_documents_of_a_scan_are_offered_as_a_corpus(bert, tmp_path, monkeypatch, clean_streamlit_caches):
    from attnviz.corpus.background import SCAN_ROOT_VARIABLE
    from attnviz.corpus.documents import Corpus, Document
    from attnviz.corpus.importance.runner import ImportanceSettings, run_importance
    from attnviz.corpus.scan.runner import ScanSettings, run_scan
    from attnviz.corpus.scan.store import ScanReader
    from attnviz.interventions import edits as iv
    from attnviz.models.shipped import BUNDLED_GPT_DIR

    texts = ["The cat sat on the mat.", "Heads read keys.", "A third document here.", "And a fourth one."]
    corpus = Corpus("tests", [Document(text, f"line {i}") for i, text in enumerate(texts)])
    run_scan(corpus, bert, tmp_path / "four.duckdb", ScanSettings(max_docs=4, max_tokens=12))
    # a corpus importance run beside it (the scan root takes any .duckdb made on the command line), and a file that
    # is no database: neither is a scan, and neither is offered as one (opening the run failed with a
    # CatalogException)
    run_importance(corpus, BUNDLED_GPT_DIR, tmp_path / "run.duckdb", ImportanceSettings(max_docs=2, max_tokens=8,
                                                                                       methods=("zero",)),
                   loaded=iv.editable_lm(BUNDLED_GPT_DIR))
    (tmp_path / "junk.duckdb").write_bytes(b"not a database")
    monkeypatch.setenv(SCAN_ROOT_VARIABLE, str(tmp_path))
    at = open_page(PAGE, timeout=300, imp_view="Importance map", imp_source="A corpus, in the background")
    choices = at.selectbox(key="imp_corpus").options
    assert len(choices) == 2 and "The documents of a scan" in choices[1]
    # named as the corpus page names a scan: its corpus, model, documents and date, not a hash
    with ScanReader(tmp_path / "four.duckdb") as reader:
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(reader.settings["started"]))
    assert choices[1] == f"The documents of a scan: tests · {bert.name} · 4 documents · {started}"
    at.selectbox(key="imp_corpus").set_value(str(tmp_path / "four.duckdb")).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(c.value.startswith("4 of 4 documents of the documents of scan") for c in at.caption)
    assert at.button(key="imp_corpus_run").label == "Measure every head over 4 documents"
    # the form is kept while another view is shown
    at.number_input(key="imp_corpus_docs").set_value(3).run()
    at.segmented_control(key="imp_view").set_value("Induction circuit").run()
    at.segmented_control(key="imp_view").set_value("Importance map").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.segmented_control(key="imp_source").value == "A corpus, in the background"
    assert at.selectbox(key="imp_corpus").value == str(tmp_path / "four.duckdb")
    assert at.number_input(key="imp_corpus_docs").value == 3
    assert at.button(key="imp_corpus_run").label == "Measure every head over 3 documents"
    # Heads across a corpus offers the scan, and the damaged file (to say it is not a scan), never the importance run
    corpus_page = open_page("app_pages/corpus.py", timeout=300)
    offered = corpus_page.selectbox(key="corpus_scan_choice").options
    assert sorted(offered) == sorted([f"{bert.name} · tests · 4 documents · ≤ 12 tokens", "junk.duckdb (not a scan)"])


@pytest.mark.slow
def test_a_scans_labels_stand_beside_the_importance_of_the_same_heads(tmp_path, monkeypatch, clean_streamlit_caches):
    """Measured over a scan's documents with the scan's own model, every head's row shows its most frequent label
    over the scan."""
    from attnviz.corpus.background import SCAN_ROOT_VARIABLE
    from attnviz.corpus.documents import Corpus, Document
    from attnviz.corpus.scan import store
    from attnviz.corpus.scan.runner import ScanSettings, run_scan
    from attnviz.models.loading import load_model_dir
    from attnviz.models.shipped import BUNDLED_GPT_DIR

    texts = ["The cat sat on the mat.", "Heads read keys and values.", "A third document, a little longer.",
             "And a fourth one here."]
    scan = tmp_path / "gpt.duckdb"
    run_scan(Corpus("tests", [Document(text, f"line {i}") for i, text in enumerate(texts)]),
             load_model_dir(BUNDLED_GPT_DIR, name=BUNDLED_GPT_NAME), scan, ScanSettings(max_docs=4, max_tokens=16))
    monkeypatch.setenv(SCAN_ROOT_VARIABLE, str(tmp_path))
    at = open_page(PAGE, timeout=300, imp_view="Importance map", imp_source="A corpus, in the background")
    at.selectbox(key="imp_corpus").set_value(str(scan)).run()
    at.number_input(key="imp_corpus_tokens").set_value(16).run()
    at.button(key="imp_corpus_run").click().run()
    wait_for_the_run(at)
    table = next(frame.value for frame in at.dataframe if "label over the scan" in frame.value.columns)
    with store.ScanReader(scan) as reader:
        expected = reader.top_labels()
    assert len(table) == TINY_GPT_LAYERS * TINY_GPT_HEADS
    for _, row in table.iterrows():
        layer, head = (int(part.split()[-1]) for part in row["head"].split(", "))
        label, share = expected[(layer, head)]
        assert row["label over the scan"] == f"{label} ({share:.0%} of documents)"
    assert any("most frequent label on the same documents" in c.value for c in at.caption)


def test_a_run_in_progress_with_other_settings_is_named_as_such(monkeypatch, clean_streamlit_caches):
    import os
    import time

    from attnviz.corpus.background import ScanFolder
    from attnviz.corpus.jobs import Job

    monkeypatch.setattr(ScanFolder, "job", lambda self: Job("another-run", os.getpid(), time.time()))
    at = open_page(PAGE, timeout=300, imp_view="Importance map")
    at.segmented_control(key="imp_source").set_value("A corpus, in the background").run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("started with other settings" in info.value for info in at.info)
