"""The page "Heads across a corpus" in AppTest: a scan started from the page runs in its own process and its
results appear; scans made on the command line open from ATTNVIZ_SCAN_ROOT; the map, a head, the searches, the
comparison and the export show what the database holds; hostile uploads get a message."""

import json
import pickle
import time

import numpy as np
import pytest

from attnviz.corpus.documents import Corpus, Document
from attnviz.corpus.scan import store
from attnviz.corpus.scan.runner import ScanSettings, run_scan
from tests.apptest_helpers import figure_titled, figures, open_page, plotly_array
from tests.test_scan import TEXTS

PAGE = "app_pages/corpus.py"


def wait_for_results(at, seconds: float = 180):
    deadline = time.time() + seconds
    while time.time() < deadline:
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        if not at.get("progress") and any(s.label == "Scan" for s in at.selectbox):
            return at
        time.sleep(1)
    raise AssertionError("the scan did not finish")


@pytest.mark.slow
def test_a_scan_started_on_the_page_runs_in_the_background_and_opens(bert, clean_streamlit_caches):
    at = open_page(PAGE)
    assert any("No scan yet" in info.value for info in at.info)
    at.number_input(key="corpus_docs").set_value(6)
    at.number_input(key="corpus_tokens").set_value(24)
    at.run()
    at.button(key="corpus_scan").click()
    at.run()
    assert at.get("progress") or at.session_state["corpus_chosen"]  # running (or already done)
    wait_for_results(at)
    chosen = at.session_state["corpus_chosen"]
    with store.ScanReader(chosen) as reader:
        assert reader.settings["status"] == store.STATUS_FINISHED and reader.documents == 6
        expected, _ = reader.statistic_map("induction")
        previous, _ = reader.statistic_map("previous")
    # a corpus with a repeated token opens on the induction map (the first question people bring)
    spec = figure_titled(at, "induction: weight on the token after an earlier copy of the query's token, every head, "
                             "over 6 documents")
    np.testing.assert_allclose(plotly_array(spec["data"][0]["z"]), expected, atol=1e-12)
    at.selectbox(key="corpus_statistic").set_value("previous").run()
    spec = figure_titled(at, "weight on the previous token, every head, over 6 documents")
    np.testing.assert_allclose(plotly_array(spec["data"][0]["z"]), previous, atol=1e-12)
    options = at.selectbox(key="corpus_statistic").options
    assert "weight on the next token" in options  # BERT reads both ways: "next" applies to it
    # The same corpus, model and limits: the page offers the finished scan instead of a new one
    assert at.button(key="corpus_scan").label == "Open the finished scan"

    at.segmented_control(key="corpus_view").set_value("Head").run()
    at.number_input(key="corpus_layer").set_value(2).run()
    assert not at.exception
    titles = [f["layout"]["title"]["text"] for f in figures(at)]
    assert "Layer 2, head 0: mean weight by relative position" in titles
    at.button(key="corpus_open_0").click().run()
    with store.ScanReader(chosen) as reader:
        example = reader.examples(2, 0, "strongest")[0]
        document = reader.document(example["doc"])
    from attnviz.corpus.scan.runner import text_as_read

    read = text_as_read(bert, document["text"], 24) if document["truncated"] else document["text"]
    assert at.session_state["sentence"] == read  # the document as the scan read it
    assert (at.session_state["layer"], at.session_state["head"]) == (2, 0)


@pytest.fixture(scope="module")
def server_scans(bert, tmp_path_factory):
    root = tmp_path_factory.mktemp("scans")
    corpus = Corpus("tests", [Document(text, f"line {i + 1}") for i, text in enumerate(TEXTS)])
    run_scan(corpus, bert, root / "short.duckdb", ScanSettings(max_docs=6, max_tokens=12))
    run_scan(corpus, bert, root / "long.duckdb", ScanSettings(max_docs=6, max_tokens=24))
    (root / "outside.duckdb").symlink_to(root / "short.duckdb")  # a link is never listed
    return root


def test_server_scans_search_compare_and_export(server_scans, monkeypatch, clean_streamlit_caches):
    monkeypatch.setenv("ATTNVIZ_SCAN_ROOT", str(server_scans))
    at = open_page(PAGE)
    choices = at.selectbox(key="corpus_scan_choice").options
    assert len(choices) == 2 and all("all-MiniLM" in c for c in choices)
    at.segmented_control(key="corpus_view").set_value("Search").run()
    at.text_input(key="corpus_q_word").input("the")
    at.number_input(key="corpus_q_min").set_value(0.0)
    at.button[0].click()  # the form's Search
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    found = at.dataframe[0].value
    assert len(found) and set(found["query_token"]) == {"the"}
    at.segmented_control(key="corpus_view").set_value("Compare").run()
    spec = figure_titled(at, "weight on the previous token:<br>all-MiniLM")
    with store.ScanReader(server_scans / "long.duckdb") as a, store.ScanReader(server_scans / "short.duckdb") as b:
        chosen = at.selectbox(key="corpus_scan_choice").value
        mine, other = (a, b) if chosen.name == "long.duckdb" else (b, a)
        expected = mine.statistic_map("previous")[0] - other.statistic_map("previous")[0]
    np.testing.assert_allclose(plotly_array(spec["data"][0]["z"]), expected, atol=1e-12)
    assert any("24 and 12 tokens" in w.value or "12 and 24 tokens" in w.value for w in at.warning)  # said
    at.segmented_control(key="corpus_view").set_value("Export").run()
    at.selectbox(key="corpus_export_table").set_value("head_stats").run()
    at.button(key="corpus_export").click().run()
    assert not at.exception
    # the export is a file on disk, offered at a link of its own (streamed by app.py's route, never in memory)
    import pyarrow.parquet as pq

    from attnviz.ui.downloads import DOWNLOAD_PREFIX, offered

    link = at.get("link_button")[0].proto.url
    assert link.startswith(DOWNLOAD_PREFIX)
    file, name = offered(link.removeprefix(DOWNLOAD_PREFIX))
    assert name == "head_stats.parquet"
    with store.ScanReader(chosen) as reader:
        expected = reader.frame("SELECT * FROM head_stats ORDER BY layer, head, statistic")
    exported = pq.read_table(file).to_pandas().sort_values(["layer", "head", "statistic"]).reset_index(drop=True)
    assert exported.equals(expected)
    assert offered("not-a-token") is None


def test_hostile_uploads_get_a_message(clean_streamlit_caches, tmp_path):
    at = open_page(PAGE)
    at.radio(key="corpus_source").set_value("Upload a file").run()

    class Exploding:
        def __reduce__(self):
            return (print, ("pickle executed",))

    uploads = [("corpus.jsonl", pickle.dumps(Exploding()), "No text field"),
               ("corpus.parquet", b"PAR1 not parquet PAR1", "cannot be used"),
               ("corpus.csv", b"", "No text field"),
               ("corpus.txt", b"\xff\xfe\n\n", "no document")]
    for name, data, said in uploads:
        at.get("file_uploader")[0].set_value((name, data, "application/octet-stream"))
        at.run()
        assert not at.exception, (name, [e.value for e in at.exception])
        shown = " ".join(e.value for e in at.error)
        assert said in shown, (name, shown)
        assert "/tmp" not in shown and "kept" not in shown, shown  # no server path in a message
    # a file without a text column: the page asks which column holds the documents (it used to take the first)
    at.get("file_uploader")[0].set_value(("corpus.csv", b"id,body\n1,first text\n2,second text\n", "text/csv"))
    at.run()
    assert any("no column named text" in info.value for info in at.info)
    assert not any(b.key == "corpus_scan" for b in at.button)
    at.selectbox(key="corpus_field").set_value("body").run()
    assert at.button(key="corpus_scan").label == "Scan 2 documents"
    good = json.dumps({"text": "A good document."}).encode()
    at.get("file_uploader")[0].set_value(("corpus.jsonl", good, "application/json"))
    at.run()
    assert not at.error and at.button(key="corpus_scan").label == "Scan 1 document"


def test_a_head_of_a_server_scan_ranks_keys_and_opens_the_document_as_read(server_scans, bert, monkeypatch,
                                                                          clean_streamlit_caches):
    """Key tokens by weight per occurrence; an example opens in Explore heads cut to the scan's 12 tokens (the
    weights Explore then shows are the scan's); the scan chosen last is the one shown."""
    from attnviz.corpus.scan.runner import text_as_read
    from attnviz.models.capture import capture

    monkeypatch.setenv("ATTNVIZ_SCAN_ROOT", str(server_scans))
    at = open_page(PAGE)
    at.session_state["corpus_chosen"] = str(server_scans / "short.duckdb")
    at.run()
    assert at.selectbox(key="corpus_scan_choice").value.name == "short.duckdb"
    at.segmented_control(key="corpus_view").set_value("Head").run()
    at.radio(key="corpus_keys_by").set_value("per occurrence").run()
    assert not at.exception, [e.value for e in at.exception]
    per = at.dataframe[3].value
    assert list(per["per_occurrence"]) == sorted(per["per_occurrence"], reverse=True) and len(per)
    at.selectbox(key="corpus_criterion").set_value("far").run()
    with store.ScanReader(server_scans / "short.duckdb") as reader:
        example = reader.examples(0, 0, "far")[0]
        document = reader.document(example["doc"])
    at.button(key="corpus_open_0").click().run()
    sentence = at.session_state["sentence"]
    assert document["truncated"] and sentence == text_as_read(bert, document["text"], 12)
    assert len(capture(bert, sentence).tokens) == 12


def test_the_scan_opened_last_is_shown_and_a_choice_is_kept(server_scans, monkeypatch, clean_streamlit_caches):
    monkeypatch.setenv("ATTNVIZ_SCAN_ROOT", str(server_scans))
    at = open_page(PAGE)
    for name in ("short.duckdb", "long.duckdb"):
        at.session_state["corpus_chosen"] = str(server_scans / name)  # what Scan / Open and a finished scan set
        at.run()
        assert at.selectbox(key="corpus_scan_choice").value.name == name
    at.selectbox(key="corpus_scan_choice").set_value(server_scans / "short.duckdb").run()
    at.run()  # the reader's own choice stays: the page does not jump back to the scan opened last
    assert at.selectbox(key="corpus_scan_choice").value.name == "short.duckdb"


def test_a_scan_stopped_before_its_first_chunk_says_so(bert, tmp_path, monkeypatch, clean_streamlit_caches):
    corpus = Corpus("tests", [Document(text, f"line {i + 1}") for i, text in enumerate(TEXTS)])
    run_scan(corpus, bert, tmp_path / "empty.duckdb", ScanSettings(max_docs=6, max_tokens=12),
             should_stop=lambda: True)
    monkeypatch.setenv("ATTNVIZ_SCAN_ROOT", str(tmp_path))
    at = open_page(PAGE)
    assert not at.exception, [e.value for e in at.exception]
    assert any("holds no document yet" in info.value for info in at.info)


def test_a_scan_running_with_other_settings_is_named_as_such(monkeypatch, clean_streamlit_caches):
    """The progress shown is the running scan's; when the form names another scan, the page says so (the audit
    read the running scan's progress as the form's)."""
    import os

    from attnviz.corpus.background import ScanFolder
    from attnviz.corpus.jobs import Job

    monkeypatch.setattr(ScanFolder, "job", lambda self: Job("another-scan", os.getpid(), time.time()))
    at = open_page(PAGE)
    assert not at.exception, [e.value for e in at.exception]
    assert any("started with other settings" in info.value for info in at.info)
    assert at.button(key="corpus_scan").disabled
