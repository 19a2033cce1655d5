"""The "Queries and keys" page as a user sees it: the picture of a head, the share that says how far to trust it
(as attnviz.pagelogic.queries_keys measures it on the same capture), every head of the layer, and the choices that
change
them."""

import numpy as np
import pytest

from attnviz.models.capture import capture
from attnviz.pagelogic import queries_keys
from attnviz.viz.queries_keys import quantised
from tests.apptest_helpers import figure_titled, figures, open_page, plotly_array
from tests.tiny_models import bundled_bert

PAGE = "app_pages/queries_keys.py"
SENTENCE = "The cat sat on the mat because it was tired."


@pytest.fixture(autouse=True)
def _clean(clean_streamlit_caches):
    yield


def test_a_heads_picture_and_its_trust_are_those_of_its_queries_and_keys():
    at = open_page(PAGE, timeout=180, sentence=SENTENCE)
    at.selectbox(key="qk_layer").set_value(2).run()
    at.selectbox(key="qk_head").set_value(5).run()
    assert not at.exception, [e.value for e in at.exception]
    record = capture(bundled_bert(), SENTENCE).records["self"]
    points = queries_keys.head_points([record], 2, 5)
    coordinates = queries_keys.project(points, "PCA")
    expected = queries_keys.trust(points, coordinates)
    shown = {m.label: m.value for m in at.metric}
    assert shown["strongest key is the nearest"] == f"{expected[1]:.0%}"
    assert shown["strongest key among the 10 nearest"] == f"{expected[10]:.0%}"
    spec = figure_titled(at, "self layer 2, head 5")
    assert [trace["name"] for trace in spec["data"]] == ["queries", "keys"]
    n = record.n_q
    drawn = quantised(coordinates.numpy())  # the projection on one int16 scale for both axes
    np.testing.assert_array_equal(plotly_array(spec["data"][0]["x"]), drawn[:n, 0])
    np.testing.assert_array_equal(plotly_array(spec["data"][1]["y"]), drawn[n:, 1])
    assert plotly_array(spec["data"][1]["customdata"]).tolist()[2] == [3 * 2 + 1, 2, 0]  # key 2
    grid = figure_titled(at, "self, layer 2: queries and keys of each head")
    assert len(grid["data"]) == 2 * 12  # queries and keys of every head of the layer
    titles = [a["text"] for a in grid["layout"]["annotations"]]
    assert titles[5] == f"head 5 · {expected[1]:.0%}"
    assert plotly_array(grid["data"][10]["customdata"]).tolist()[0] == [2, 5]  # a click opens layer 2, head 5
    at.toggle(key="qk_whole_model").set_value(True).run()
    grid = figure_titled(at, "self, every layer: queries and keys of each head")
    assert len(grid["data"]) == 2 * 6 * 12
    assert [a["text"] for a in grid["layout"]["annotations"]][2 * 12 + 5] == f"L2 H5 · {expected[1]:.0%}"


def test_3d_t_sne_and_colouring_by_position():
    at = open_page(PAGE, timeout=180, sentence=SENTENCE)
    at.segmented_control(key="qk_dims").set_value("3D").run()
    assert figures(at)[0]["data"][0]["type"] == "scatter3d"
    at.segmented_control(key="qk_dims").set_value("2D").run()
    at.segmented_control(key="qk_method").set_value("t-SNE").run()
    assert not at.exception, [e.value for e in at.exception]
    assert "(t-SNE)" in figures(at)[0]["layout"]["title"]["text"]
    at.segmented_control(key="qk_colour").set_value("position").run()
    assert figures(at)[0]["data"][0]["marker"]["colorscale"]


def test_a_token_search_rings_its_points_and_documents_share_one_picture():
    at = open_page(PAGE, timeout=180, sentence=SENTENCE)
    at.text_input(key="qk_find").set_value("the").run()
    rings = next(trace for trace in figures(at)[0]["data"] if trace["name"].startswith("“the”"))
    record = capture(bundled_bert(), SENTENCE).records["self"]
    expected = sum("the" in token.lower() for token in record.query_display) * 2  # each as a query and a key
    assert rings["name"] == f"“the” ({expected})" and len(plotly_array(rings["x"])) == expected
    at.segmented_control(key="qk_source").set_value("Documents of the bundled corpus").run()
    at.slider(key="qk_documents").set_value(3).run()
    at.select_slider(key="qk_tokens").set_value(32).run()
    assert not at.exception, [e.value for e in at.exception]
    from attnviz.corpus.documents import bundled_corpus

    n = sum(capture(bundled_bert(), document.text, max_tokens=32).records["self"].n_q
            for document in bundled_corpus().documents[:3])
    assert f"{n} queries and {n} keys" in figures(at)[0]["layout"]["title"]["text"]  # 3 documents, 32 tokens at most
    at.segmented_control(key="qk_colour").set_value("document").run()
    colours = plotly_array(figures(at)[0]["data"][0]["marker"]["color"])
    assert sorted(set(colours.tolist())) == [0, 1, 2]


def test_a_scans_sample_comes_from_its_database_and_a_projection_made_here_is_kept(tmp_path, monkeypatch):
    from attnviz.corpus.documents import bundled_corpus
    from attnviz.corpus.scan import qk_sample, store
    from attnviz.corpus.scan.runner import ScanSettings, run_scan

    at = open_page(PAGE, timeout=180, sentence=SENTENCE)
    at.segmented_control(key="qk_source").set_value("A scan's sample").run()
    assert "No finished scan" in " ".join(info.value for info in at.info)  # none yet: says where to make one
    root = tmp_path / "scans"
    root.mkdir()
    path = root / "bert.duckdb"
    run_scan(bundled_corpus(), bundled_bert(), path, ScanSettings(max_docs=12, max_tokens=32, qk_points=120))
    monkeypatch.setenv("ATTNVIZ_SCAN_ROOT", str(root))  # the server's scans, offered to every browser
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    with store.ScanReader(path) as reader:
        facts = qk_sample.sample_facts(reader.connection)
        _, trusted = qk_sample.stored_projection(reader.connection, 0, 0, "PCA", 2, 0, False)
    assert 0 < facts["tokens"] <= 120 and facts["documents"] >= 3
    title = figures(at)[0]["layout"]["title"]["text"]
    assert f"{facts['tokens']} queries and {facts['tokens']} keys (PCA)" in title
    shown = {m.label: m.value for m in at.metric}
    assert shown["strongest key is the nearest"] == f"{trusted[1]:.0%}"  # the trust the scan kept
    grid = figure_titled(at, "self, layer 0: queries and keys of each head")
    assert len(grid["data"]) == 2 * 12
    # a t-SNE made on the page is kept in this browser's own file for the scan, with the trust shown: the server's
    # scan itself is never written (it is opened read-only, with external access off)
    before = (path.stat().st_size, path.stat().st_mtime_ns, path.read_bytes())
    at.selectbox(key="qk_layer").set_value(2).run()
    at.segmented_control(key="qk_method").set_value("t-SNE").run()
    assert not at.exception, [e.value for e in at.exception]
    assert (path.stat().st_size, path.stat().st_mtime_ns, path.read_bytes()) == before
    with store.ScanReader(path) as reader:
        assert qk_sample.stored_projection(reader.connection, 2, 0, "t-SNE", 2, 0, False) is None
        key = reader.settings["key"]
    from attnviz.checkpoints.keep import BrowserStore
    from attnviz.corpus.background import ScanFolder

    mine = ScanFolder(BrowserStore(at.session_state["browser_key"]).folder / "scans").projections(path, key)
    kept, kept_trust = qk_sample.kept_projection(mine, 2, 0, "t-SNE", 2, 0, False)
    assert kept.shape == (2 * facts["tokens"], 2)
    assert {m.label: m.value for m in at.metric}["strongest key is the nearest"] == f"{kept_trust[1]:.0%}"
    # values as a third set, and colours by token category with their legend
    at.segmented_control(key="qk_method").set_value("PCA").run()
    at.toggle(key="qk_values").set_value(True).run()
    at.segmented_control(key="qk_colour").set_value("token category").run()
    data = figures(at)[0]["data"]
    assert [trace["name"] for trace in data[:3]] == ["queries", "keys", "values"]
    assert len(plotly_array(data[2]["x"])) == facts["tokens"]
    assert {"special", "word"} <= {trace["name"] for trace in data[3:]}  # [CLS]/[SEP] and words
    assert "<b>" in data[0]["text"][1]  # a hover shows the token in its context
    # a click on a query of the third document: its strongest keys said, and that document opens in Explore heads
    with store.ScanReader(path) as reader:
        points = qk_sample.head_points(reader.connection, 2, 0)
    third = points.documents[2]
    query = third.queries.start + 1
    at.session_state["qk_picture"] = {"selection": {"points": [{"customdata": [3 * query, 1, 0]}]}}
    at.run()
    strongest = points.key_tokens[third.keys.start + int(third.strongest_keys[1, 0])]
    said = next(c.value for c in at.caption if "attends most to" in c.value)
    doc = points.document_name(2)
    assert said.startswith(f"Query 1 of document {doc}, “{points.query_tokens[query]}”, attends most to "
                           f"“{strongest}”"), said
    button = next(b for b in at.button if b.key == "qk_open")
    assert button.label == f"Open document {doc} in Explore heads on this head"
    button.click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["sentence"] == bundled_corpus().documents[doc].text and at.session_state["layer"] == 2


def test_a_decoders_trust_leaves_out_its_first_queries_and_says_so_and_a_click_follows_a_query(tmp_path):
    """A causal decoder's query i may attend to i + 1 keys: at k, its first k queries cannot miss, so the page
    counts the others and says how many. A click arrives as the browser sends a typed array's row (an object)."""
    from attnviz.models.loading import load_model_dir
    from tests.tiny_models import make_tiny_checkpoint

    folder = make_tiny_checkpoint("gpt2", tmp_path / "tiny-gpt2")
    at = open_page(PAGE, timeout=240, sentence=SENTENCE, models={"tiny-gpt2": str(folder)}, model="tiny-gpt2")
    assert not at.exception, [e.value for e in at.exception]
    record = capture(load_model_dir(folder), SENTENCE).records["self"]
    n = record.n_q
    assert record.is_causal() and n > 10
    points = queries_keys.head_points([record], 0, 0)
    expected = queries_keys.trust(points, queries_keys.project(points, "PCA"))
    metrics = {m.label: m for m in at.metric}
    for k, label in ((1, "strongest key is the nearest"), (10, "strongest key among the 10 nearest")):
        assert metrics[label].value == f"{expected[k]:.0%}"
    assert metrics["strongest key among the 10 nearest"].proto.help.startswith(
        f"Of the {n - 10:,} queries that may attend to more than 10 keys")
    said = " ".join(c.value for c in at.caption)
    assert f"Each share counts only the queries that may attend to more than k keys, of {n}: {n - 1} at k = 1, " \
           f"{n - 5} at k = 5, {n - 10} at k = 10." in said
    assert "Click a query (a red circle)" in said
    at.session_state["qk_picture"] = {"selection": {"points": [{"customdata": {"0": 3 * 4, "1": 4, "2": 0}}]}}
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    strongest = points.key_tokens[int(points.documents[0].strongest_keys[4, 0])]
    assert any(c.value.startswith(f"Query 4, “{points.query_tokens[4]}”, attends most to “{strongest}”")
               for c in at.caption)
    assert any(trace["name"] == "strongest 3 keys" for trace in figures(at)[0]["data"])
    at.segmented_control(key="qk_colour").set_value("position").run()  # nothing red now: the caption says so
    said = " ".join(c.value for c in at.caption)
    assert "red" not in said and "Click a query (a circle; keys are diamonds)" in said
