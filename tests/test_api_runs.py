"""Corpus runs from a notebook (attnviz.api.runs): a scan and an importance run through the API write the tables
their runners write when called directly; the scan's detectors name the bundled tiny GPT's induction and
previous-token heads; an interrupt (from the progress callback, the stop button's SIGINT, or mid-chunk) stops a run
resumably, its file readable, and the same call resumes it to the tables of a run that was never stopped; settings
are checked by name and type; a model in memory is measured as the same model loaded from its folder."""

import signal

import numpy as np
import pandas as pd
import pytest
import torch
from tqdm.std import tqdm

from attnviz.api import run_control, run_files, runs
from attnviz.checkpoints.safety import CheckpointRefused
from attnviz.corpus.documents import Corpus, CorpusRefused, Document
from attnviz.corpus.importance import store as istore
from attnviz.corpus.importance.runner import ImportanceSettings, run_importance
from attnviz.corpus.options import SettingsRefused
from attnviz.corpus.scan import runner as scan_runner
from attnviz.corpus.scan import store
from attnviz.corpus.scan.heads import SCAN_STATISTICS
from attnviz.corpus.scan.runner import ScanRefused, ScanSettings, run_scan
from attnviz.models.loading import load_model_dir
from attnviz.models.shipped import BUNDLED_GPT_DIR, BUNDLED_GPT_NAME

DOCUMENTS = ["The cat sat on the mat, and the dog slept by the door.",
             "Paris is the capital of France. Berlin is the capital of Germany.",
             "A list, a tuple and a dict: three containers, each with its own rules!",
             "Induction heads copy: red blue green red blue green red blue green.",
             "The model reads every token once, then again with one head removed.",
             "Attention weights say where a head looks; ablation says whether it matters."]
SCAN = {"max_docs": 6, "max_tokens": 32, "chunk_docs": 2, "qk_points": 64}
IMPORTANCE = {"max_docs": 6, "max_tokens": 16, "chunk_docs": 2}
# Passages written twice: every query of the second copy has an earlier occurrence to copy from
PASSAGES = ["the quick brown fox jumps over the lazy dog near a quiet river bank",
            "she opened the old wooden door and walked into a room full of books",
            "many small birds sing in the tall green trees every morning in spring",
            "the train left the station late because of heavy snow on the tracks",
            "he wrote a long letter to his brother who lived in a distant city",
            "children played football in the park until the sun went down behind hills"]


def as_corpus(texts: list[str]) -> Corpus:
    """The documents as the API reads a list (each its own source, "document i"), built without the API."""
    return Corpus("tests", [Document(text, f"document {index}") for index, text in enumerate(texts)])


def tables(path, reader=store.ScanReader) -> dict[str, pd.DataFrame]:
    """Every table and view but the settings (which hold times), rows in one order; the qk projections' timings
    left out."""
    with reader(path) as opened:
        names = [name for name, in opened.connection.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() UNION ALL "
            "SELECT view_name FROM duckdb_views() WHERE database_name = current_database() AND NOT internal"
        ).fetchall() if name != "settings"]
        return {name: opened.connection.execute(f'SELECT * EXCLUDE (seconds) FROM "{name}" ORDER BY ALL'
                                                if name == "qk_projections" else
                                                f'SELECT * FROM "{name}" ORDER BY ALL').df() for name in names}


def assert_same_tables(found: dict, expected: dict) -> None:
    assert sorted(found) == sorted(expected)
    for name, frame in expected.items():  # float sums grouped by DuckDB may add in another order
        pd.testing.assert_frame_equal(found[name], frame, check_exact=False, rtol=1e-9, obj=name)


def key_of(path, reader=store.ScanReader) -> str:
    with reader(path) as opened:
        return opened.settings["key"]


@pytest.fixture(scope="module")
def direct_scan(tmp_path_factory):
    """The reference: run_scan called directly on the same documents, with the tiny GPT loaded here."""
    path = tmp_path_factory.mktemp("direct") / "scan.duckdb"
    bundle = load_model_dir(BUNDLED_GPT_DIR, name=BUNDLED_GPT_NAME)
    state = run_scan(as_corpus(DOCUMENTS), bundle, path, ScanSettings(**SCAN))
    assert state.status == store.STATUS_FINISHED
    return path


@pytest.fixture(scope="module")
def api_scan(tmp_path_factory):
    return runs.scan(DOCUMENTS, "tiny GPT", tmp_path_factory.mktemp("api") / "scan.duckdb", progress=False, **SCAN)


def test_a_scan_through_the_api_writes_the_tables_run_scan_writes(api_scan, direct_scan):
    assert isinstance(api_scan, run_files.ScanRun)
    assert (api_scan.status, api_scan.done, api_scan.planned) == ("finished", 6, 6)
    assert key_of(api_scan.path) == key_of(direct_scan)  # the same documents, model and limits
    assert_same_tables(tables(api_scan.path), tables(direct_scan))
    assert {"heads", "documents", "head_stats", "head_documents", "query_top_keys", "token_pairs", "key_tokens",
            "examples", "offset_state", "qk_vectors"} <= set(api_scan.tables())
    documents = api_scan.df("documents")
    assert len(documents) == 6
    assert list(documents.columns) == ["doc", "source", "text", "n_chars", "n_tokens", "truncated", "problem"]
    assert documents.sort_values("doc")["text"].tolist() == DOCUMENTS
    heads = api_scan.df()  # the default: one row per head, labelled
    assert len(heads) == 3 * 4 and list(heads.columns) == ["layer", "head", "label", "label_share",
                                                           *SCAN_STATISTICS]
    pd.testing.assert_frame_equal(heads, api_scan.heads())
    stats = api_scan.df("head_stats")
    assert len(stats) == 3 * 4 * len(SCAN_STATISTICS)
    entropy = stats[stats["statistic"] == "entropy"].set_index(["layer", "head"])["mean"]
    np.testing.assert_allclose(heads.set_index(["layer", "head"])["entropy"], entropy.loc[heads.set_index(
        ["layer", "head"]).index])
    assert len(api_scan.df("query_top_keys", limit=5)) == 5
    assert api_scan.sql("SELECT count(*) AS n FROM documents WHERE n_tokens > ?", [3])["n"][0] == 6
    with pytest.raises(ValueError, match="no table 'nope'.*documents"):
        api_scan.df("nope")
    said = repr(api_scan)
    assert "\n" not in said and api_scan.path.name in said and "finished" in said and "6/6" in said
    assert repr(run_files.open_scan(api_scan.path)) == said


def test_a_finished_scan_is_returned_as_it_is_when_asked_again(api_scan):
    before = tables(api_scan.path)
    again = runs.scan(DOCUMENTS, "tiny GPT", api_scan.path, progress=False, **SCAN)
    assert again.status == "finished" and again.done == 6
    # the model given as a bundle loaded once names the same scan as its name does
    bundle = load_model_dir(BUNDLED_GPT_DIR, name=BUNDLED_GPT_NAME)
    assert runs.scan(DOCUMENTS, bundle, api_scan.path, progress=False, **SCAN).status == "finished"
    assert_same_tables(tables(again.path), before)


@pytest.fixture(scope="module")
def repeated_scan(tmp_path_factory):
    texts = [f"{passage} {passage}" for passage in PASSAGES]
    return runs.scan(texts, "tiny GPT", tmp_path_factory.mktemp("repeated") / "scan.duckdb", progress=False,
                     max_tokens=64, chunk_docs=3, qk_points=0)


def test_detect_names_the_tiny_gpts_induction_and_previous_token_heads(repeated_scan):
    """docs/importance.md: the tiny GPT's strong induction heads are layer 2's heads 1 and 2 (a weaker one is layer
    1's head 3), its previous-token head layer 0's head 1 (tests/test_scan_detectors.py checks the scores against a
    brute force over transformers' eager weights)."""
    induction = repeated_scan.detect("induction")
    assert list(induction.columns) == ["layer", "head", "score", "transformerlens_mul"] and len(induction) == 12
    assert induction["score"].is_monotonic_decreasing
    strongest = induction.head(2)
    assert set(zip(strongest["layer"], strongest["head"], strict=True)) == {(2, 1), (2, 2)}
    assert (strongest["score"] > 0.7).all() and induction["score"].iloc[3] < 0.3
    assert tuple(induction.iloc[2][["layer", "head"]]) == (1, 3)  # the weaker one
    previous = repeated_scan.detect("previous-token")
    assert tuple(previous.iloc[0][["layer", "head"]]) == (0, 1) and previous["score"].iloc[0] > 0.9
    pd.testing.assert_frame_equal(repeated_scan.detect("induction_head"), induction)  # TransformerLens's names
    by_document = repeated_scan.detect("induction", over="documents")
    assert list(by_document.columns) == ["layer", "head", "score"]
    assert set(zip(by_document["layer"][:2], by_document["head"][:2], strict=True)) == {(2, 1), (2, 2)}
    labels = repeated_scan.heads().set_index(["layer", "head"])["label"]
    assert labels[(2, 1)] == labels[(2, 2)] == "induction head" and labels[(0, 1)] == "previous-token head"
    duplicate = repeated_scan.detect("duplicate-token")
    assert duplicate["score"].between(0, 1).all()


def test_transformerlens_mul_is_the_weight_on_tls_pattern_over_every_query(repeated_scan):
    """TransformerLens's detect_head ("mul") on each text: the weight on its induction pattern (its duplicate-token
    pattern shifted one key right) over the sum of all weights, one per query; pooled over the documents here, from
    transformers' eager weights."""
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(BUNDLED_GPT_DIR, attn_implementation="eager", local_files_only=True,
                                      use_safetensors=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_GPT_DIR)
    on_pattern, queries = np.zeros((3, 4)), 0
    for passage in PASSAGES:
        ids = tokenizer(f"{passage} {passage}", truncation=True, max_length=64)["input_ids"]
        with torch.no_grad():
            attentions = model(input_ids=torch.tensor([ids]), output_attentions=True).attentions
        weights = torch.stack([layer[0] for layer in attentions]).double().numpy()  # [layers, heads, n, n]
        n = len(ids)
        duplicate = np.array([[ids[i] == ids[j] and j < i for j in range(n)] for i in range(n)])
        induction = np.zeros_like(duplicate)
        induction[:, 1:] = duplicate[:, :-1]
        on_pattern += (weights * np.tril(induction)).sum((-1, -2))
        queries += n
    found = repeated_scan.detect("induction").sort_values(["layer", "head"])
    np.testing.assert_allclose(found["transformerlens_mul"].to_numpy().reshape(3, 4), on_pattern / queries,
                               atol=3e-6)
    assert found.attrs["queries"] == queries and 0 < found.attrs["queries_with_target"] < queries


def test_detect_refuses_a_kind_the_scan_has_no_target_for(tmp_path):
    run = runs.scan(["The cat sat.", "A dog ran."], "tiny GPT", tmp_path / "plain.duckdb", progress=False,
                    max_tokens=16, qk_points=0)  # no token repeats within a document
    assert "induction" not in run.kinds() and "previous-token" in run.kinds()
    with pytest.raises(ValueError, match="no 'induction' score.*It has previous-token"):
        run.detect("induction")
    with pytest.raises(ValueError, match="no detector 'copying': the kinds are induction, duplicate-token"):
        run.detect("copying")


class InterruptedBar(tqdm):
    """A progress bar whose first update after a chunk raises what ``interrupt`` does (once)."""

    interrupt = None
    fired = False

    def update(self, n=1):
        shown = super().update(n)
        if self.n > 0 and not InterruptedBar.fired:
            InterruptedBar.fired = True
            type(self).interrupt()
        return shown


def raise_keyboard_interrupt():
    raise KeyboardInterrupt


def press_stop():
    """What the notebook's stop button does: SIGINT to the kernel."""
    signal.raise_signal(signal.SIGINT)


@pytest.mark.parametrize("interrupt", [raise_keyboard_interrupt, press_stop], ids=["progress callback", "SIGINT"])
def test_an_interrupt_stops_at_the_next_chunk_and_the_same_call_resumes(direct_scan, tmp_path, monkeypatch, capsys,
                                                                       interrupt):
    monkeypatch.setattr(run_control, "tqdm", type("Bar", (InterruptedBar,), {"interrupt": staticmethod(interrupt)}))
    monkeypatch.setattr(InterruptedBar, "fired", False)
    path = tmp_path / "scan.duckdb"
    notebooks_own = signal.getsignal(signal.SIGINT)  # Python's default; ignored where a shell started us in the back
    stopped = runs.scan(DOCUMENTS, "tiny GPT", path, **SCAN)
    assert InterruptedBar.fired
    assert signal.getsignal(signal.SIGINT) is notebooks_own  # the notebook's own handler is back
    assert (stopped.status, stopped.done, stopped.planned) == ("stopped", 2, 6)  # the first chunk, committed
    said = capsys.readouterr().out
    assert "Stopped: 2 of 6 documents" in said and "again" in said and str(path) in said
    reopened = run_files.open_scan(path)  # readable as it is
    assert len(reopened.df("documents")) == 2 and len(reopened.heads()) == 12
    monkeypatch.setattr(run_control, "tqdm", tqdm)
    resumed = runs.scan(DOCUMENTS, "tiny GPT", path, progress=False, **SCAN)
    assert (resumed.status, resumed.done) == ("finished", 6)
    assert_same_tables(tables(path), tables(direct_scan))


def test_an_interrupt_mid_chunk_keeps_the_committed_chunks_and_resumes(direct_scan, tmp_path, monkeypatch, capsys):
    """A second press of stop (or an interrupt where no handler runs) lands inside a chunk: that chunk is dropped,
    the file is marked stopped, never left half-written."""
    measured = scan_runner.scan_chunk
    calls = []

    def interrupted_on_the_second_chunk(*arguments, **keywords):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return measured(*arguments, **keywords)

    monkeypatch.setattr(scan_runner, "scan_chunk", interrupted_on_the_second_chunk)
    path = tmp_path / "scan.duckdb"
    stopped = runs.scan(DOCUMENTS, "tiny GPT", path, progress=False, **SCAN)
    assert (stopped.status, stopped.done) == ("stopped", 2)
    assert "Stopped: 2 of 6" in capsys.readouterr().out
    monkeypatch.setattr(scan_runner, "scan_chunk", measured)
    resumed = runs.scan(DOCUMENTS, "tiny GPT", path, progress=False, **SCAN)
    assert resumed.status == "finished"
    assert_same_tables(tables(path), tables(direct_scan))


def test_settings_are_checked_by_name_and_type(api_scan, tmp_path):
    path = tmp_path / "never.duckdb"
    with pytest.raises(SettingsRefused, match=r"'max_doc': no setting of that name \(the settings are max_docs, "
                                              r"max_tokens, chunk_docs, qk_points\).*also takes path"):
        runs.scan(DOCUMENTS, "tiny GPT", path, max_doc=3)
    with pytest.raises(SettingsRefused, match="max_docs must be int, not '3'"):
        runs.scan(DOCUMENTS, "tiny GPT", path, max_docs="3")
    with pytest.raises(SettingsRefused, match="max_tokens must be int, not True"):
        runs.scan(DOCUMENTS, "tiny GPT", path, max_tokens=True)
    with pytest.raises(ScanRefused, match="at least 2 tokens"):
        runs.scan(DOCUMENTS, "tiny GPT", path, max_tokens=1)
    with pytest.raises(SettingsRefused, match="'maxtokens'.*the settings are max_docs, max_tokens, chunk_docs, "
                                              "methods"):
        runs.importance(DOCUMENTS, "tiny GPT", path, maxtokens=3)
    with pytest.raises(ScanRefused, match="methods are zero, mean, gradient, not bogus"):
        runs.importance(DOCUMENTS, "tiny GPT", path, methods=("zero", "bogus"))
    with pytest.raises(ValueError, match="split must be one of 'line', 'paragraph'"):
        runs.scan(DOCUMENTS, "tiny GPT", path, split="word")
    with pytest.raises(CorpusRefused, match="no corpus file at 'The cat sat.'.*list of strings"):
        runs.scan("The cat sat.", "tiny GPT", path)
    with pytest.raises(CheckpointRefused, match="model='no such model' is not a folder here.*tiny GPT"):
        runs.scan(DOCUMENTS, "no such model", path)
    assert not path.exists()
    # a file that holds another scan is refused with what differs; one that is no scan is never written into
    with pytest.raises(ScanRefused, match="holds another scan: max_tokens 32 there, 16 here"):
        runs.scan(DOCUMENTS, "tiny GPT", api_scan.path, **{**SCAN, "max_tokens": 16})
    other = tmp_path / "other.duckdb"
    runs.importance(DOCUMENTS[:2], "tiny GPT", other, progress=False, max_tokens=8, methods="zero")
    with pytest.raises(ScanRefused, match="cannot be resumed as a scan"):
        runs.scan(DOCUMENTS, "tiny GPT", other, **SCAN)


def test_an_importance_run_through_the_api_writes_what_run_importance_writes(tmp_path, monkeypatch):
    direct = tmp_path / "direct.duckdb"
    state = run_importance(as_corpus(DOCUMENTS), BUNDLED_GPT_DIR, direct, ImportanceSettings(**IMPORTANCE),
                           name=BUNDLED_GPT_NAME)
    assert state.status == istore.STATUS_FINISHED
    # interrupted after its first chunk of the heads' pass, then resumed: the same tables as one uninterrupted run
    monkeypatch.setattr(run_control, "tqdm", type("Bar", (InterruptedBar,), {"interrupt": staticmethod(
        raise_keyboard_interrupt)}))
    monkeypatch.setattr(InterruptedBar, "fired", False)
    path = tmp_path / "api.duckdb"
    stopped = runs.importance(DOCUMENTS, "tiny GPT", path, **{**IMPORTANCE, "max_tokens": np.int64(16)})
    assert (stopped.status, stopped.done) == ("stopped", 2)
    monkeypatch.setattr(run_control, "tqdm", tqdm)
    run = runs.importance(DOCUMENTS, "tiny GPT", path, progress=False, **IMPORTANCE)
    assert isinstance(run, run_files.ImportanceRun) and (run.status, run.done, run.planned) == ("finished", 6, 6)
    assert key_of(path, istore.ImportanceReader) == key_of(direct, istore.ImportanceReader)
    assert_same_tables(tables(path, istore.ImportanceReader), tables(direct, istore.ImportanceReader))
    assert run.objective == "next-token" and run.methods() == ["zero", "mean", "gradient"]
    # map(): the page's numbers (ImportanceReader.maps), one row per measure and head
    found = run.map()
    assert len(found) == 3 * 12 and list(found.columns) == ["method", "module", "kind", "layer", "head", "mean",
                                                            "spread", "documents"]
    with istore.ImportanceReader(direct) as reader:
        maps = reader.maps()
    for method, (mean, spread, count) in maps.items():
        one = run.map(method)
        np.testing.assert_allclose(one["mean"].to_numpy().reshape(3, 4), mean, rtol=1e-9)
        np.testing.assert_allclose(one["spread"].to_numpy().reshape(3, 4), spread, rtol=1e-9)
        assert (one["documents"].to_numpy().reshape(3, 4) == count).all()
    effects = run.df("head_effects")
    assert len(effects) == 6 * 3 * 12 and {"doc", "method", "module", "head", "value"} == set(effects.columns)
    assert set(run.df().columns) == {"method", "module", "head", "mean", "spread", "documents"}  # the view
    with pytest.raises(ValueError, match="no 'nope' map; it holds zero, mean, gradient"):
        run.map("nope")
    assert "finished" in repr(run) and "next-token" in repr(run)
    bundle = load_model_dir(BUNDLED_GPT_DIR, name=BUNDLED_GPT_NAME)  # the same run as the model's name names
    assert runs.importance(DOCUMENTS, bundle, path, progress=False, **IMPORTANCE).status == "finished"
    assert repr(run_files.open_importance(path)) == repr(run)


@pytest.fixture(scope="module")
def gpt_in_memory():
    """The tiny GPT as a notebook holds it: loaded by transformers, with its default (SDPA) attention."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (AutoModelForCausalLM.from_pretrained(BUNDLED_GPT_DIR).eval(),
            AutoTokenizer.from_pretrained(BUNDLED_GPT_DIR))


def test_an_importance_run_of_a_model_in_memory_equals_its_checkpoints(gpt_in_memory, tmp_path, monkeypatch):
    model, tokenizer = gpt_in_memory
    monkeypatch.chdir(tmp_path)
    implementation = model.config._attn_implementation
    settings = {**IMPORTANCE, "methods": ("zero", "gradient")}
    model.train()
    run = runs.importance(DOCUMENTS, model, tokenizer=tokenizer, progress=False, **settings)
    assert model.config._attn_implementation == implementation and model.training  # both for the run only
    model.eval()
    assert run.path.parent == tmp_path and run.path.name.startswith("importance-tiny-gpt-documents-")
    from_folder = runs.importance(DOCUMENTS, "tiny GPT", tmp_path / "folder.duckdb", progress=False, **settings)
    np.testing.assert_allclose(run.map()["mean"], from_folder.map()["mean"], atol=1e-5)
    again = runs.importance(DOCUMENTS, model, tokenizer=tokenizer, progress=False, **settings)
    assert again.path == run.path and again.status == "finished"  # the same weights find the same file
    with pytest.raises(ScanRefused, match="a model in memory cannot go to Ray"):
        runs.importance(DOCUMENTS, model, tokenizer=tokenizer, ray="auto")


def test_a_scan_of_a_model_in_memory_equals_its_checkpoints(gpt_in_memory, api_scan, tmp_path, monkeypatch):
    capture = pytest.importorskip("attnviz.api.capture")
    if not hasattr(capture, "bundle_of"):
        pytest.skip("attnviz.api.capture.bundle_of is not there yet")
    model, tokenizer = gpt_in_memory
    monkeypatch.chdir(tmp_path)
    run = runs.scan(DOCUMENTS, model, tokenizer=tokenizer, progress=False, **SCAN)
    assert run.status == "finished" and run.path.parent == tmp_path
    columns = ["layer", "head", *SCAN_STATISTICS]
    np.testing.assert_allclose(run.heads()[columns].to_numpy(dtype=float),
                               api_scan.heads()[columns].to_numpy(dtype=float), atol=1e-5)
    with pytest.raises(ScanRefused, match="a model in memory cannot go to Ray"):
        runs.scan(DOCUMENTS, model, tokenizer=tokenizer, ray="auto")
