"""Activation and path patching over a corpus, into DuckDB: each document's example is its own text typed twice (a
pure function of its tokens, its number and the seed), each document's cells are what patch_map and path_patching
give on the same examples, a short document is recorded with its reason, a run stopped mid-chunk resumes to the same
database as one run straight through, Ray gives the same results, the command line (module and ``attnviz patch``)
runs and resumes, and the notebook API returns the maps' spread."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

from attnviz.corpus.documents import Corpus, Document, bundled_corpus
from attnviz.corpus.patching import store as pstore
from attnviz.corpus.patching.runner import (
    PatchingSettings,
    changed_position,
    document_example,
    load_model,
    ordinary_tokens,
    prepare,
    run_patching,
)
from attnviz.corpus.scan.runner import ScanRefused
from attnviz.interventions import activation_patching as ap
from attnviz.interventions import path_patching as pp
from attnviz.models.shipped import BUNDLED_GPT_DIR

PERIOD = 16
SETTINGS = PatchingSettings(max_docs=7, period=PERIOD, sites=("attn", "k"), receivers=("2.1:k",), chunk_docs=2)
SHORT = 2  # the short document's number
CELLS = "SELECT doc, kind, name, \"row\", head, position, value, share FROM cells ORDER BY ALL"
DOCUMENTS = "SELECT * FROM documents ORDER BY doc"


def corpus() -> Corpus:
    """Six documents of the bundled corpus (each of more than 16 tokens) and a short one, third."""
    documents = list(bundled_corpus().documents[:6])
    documents.insert(SHORT, Document("Too short to type twice.", "short"))
    return Corpus("tests", documents)


def table(path, sql: str) -> list[tuple]:
    with pstore.PatchingReader(path) as reader:
        return reader.connection.execute(sql).fetchall()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread for this module's runs (the tiny GPT's forwards are small; two threads on two busy cores
    took four times as long), set back after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_gpt():
    return load_model(BUNDLED_GPT_DIR)


@pytest.fixture(scope="module")
def whole(tiny_gpt, tmp_path_factory):
    """One run straight through, in this process."""
    path = tmp_path_factory.mktemp("patching") / "whole.duckdb"
    seen = []
    state = run_patching(corpus(), BUNDLED_GPT_DIR, path, SETTINGS, loaded=tiny_gpt,
                         progress=lambda s: seen.append(s.done))
    assert state.status == pstore.STATUS_FINISHED and state.done == 7 and state.skipped == 1
    assert seen[0] == 0 and seen[-1] == 7 and 2 in seen  # after every chunk
    return path


@pytest.fixture(scope="module")
def direct(tiny_gpt):
    """The measured documents' examples, and what patch_map and path_patching give on them directly."""
    model, tokenizer = tiny_gpt
    vocabulary, parts, _ = prepare(model, tokenizer, SETTINGS)
    examples = {}
    for doc, document in enumerate(corpus().documents):
        made = document_example(ordinary_tokens(tokenizer, document.text, PERIOD), PERIOD, doc=doc, seed=0,
                                vocabulary=vocabulary, bos=tokenizer.bos_token_id, change="copied")
        assert isinstance(made, str) == (doc == SHORT)
        if not isinstance(made, str):
            examples[doc] = made
    listed = list(examples.values())
    maps = {site: ap.patch_map(model, listed, site) for site in SETTINGS.sites}
    maps["2.1:k/frozen"] = pp.path_patching(model, listed, (2, 1), "k", mlps="frozen")
    return examples, maps


def test_each_document_gets_what_patching_it_directly_gives(whole, direct):
    examples, maps = direct
    with pstore.PatchingReader(whole) as reader:
        assert reader.names() == ["attn", "k", "2.1:k/frozen"]
        assert reader.measured() == list(examples)
        for name, found in maps.items():
            shares, values = reader.shares(name), reader.values(name)
            assert shares.shape == found.shares.shape  # [documents, *grid]
            torch.testing.assert_close(shares, found.shares, rtol=1e-12, atol=1e-12, equal_nan=True)
            torch.testing.assert_close(values, found.values, rtol=1e-12, atol=1e-12, equal_nan=True)
            assert reader.rows(name) == found.rows
        assert reader.shares("attn").shape == (6, 3, 1 + PERIOD + PERIOD // 2)  # [documents, layers, positions]
        documents = reader.documents_frame()
    measured = documents[documents["skipped"].isna()]
    reference = maps["attn"]
    assert measured["clean"].tolist() == pytest.approx(reference.clean.tolist(), rel=1e-12)
    assert measured["corrupted"].tolist() == pytest.approx(reference.corrupted.tolist(), rel=1e-12)
    assert measured["foil"].tolist() == reference.foils == measured["replacement"].tolist()  # change="copied"
    assert measured["answer"].tolist() == [example.answer for example in examples.values()]
    assert (measured["n_tokens"] == PERIOD).all()
    # the short document: recorded, its reason said, no cells
    short = documents.set_index("doc").loc[SHORT]
    assert short["source"] == "short" and "fewer than the period (16)" in short["skipped"]
    assert 0 < short["n_tokens"] < PERIOD and short["clean"] != short["clean"]  # NULL: NaN in pandas
    assert table(whole, f"SELECT count(*) FROM cells WHERE doc = {SHORT}")[0][0] == 0
    # the view: the mean share over the documents, as spread() gives it
    mean = ap.spread(reference.shares).mean
    view = table(whole, "SELECT \"row\", position, share, documents FROM patching WHERE name = 'attn'")
    for row, position, share, count in view:
        assert share == pytest.approx(float(mean[row, position]), rel=1e-9, abs=1e-12) and count == 6


def test_a_documents_example_is_its_text_typed_twice():
    tokens, vocabulary = list(range(100, 120)), list(range(1, 1000))
    made = document_example(tokens, PERIOD, doc=3, seed=5, vocabulary=vocabulary, bos=0, change="copied")
    assert made == document_example(tokens, PERIOD, doc=3, seed=5, vocabulary=vocabulary, bos=0, change="copied")
    assert made.clean == [0, *tokens[:16], *tokens[:8]] and made.answer == tokens[8]
    changed = [at for at, (a, b) in enumerate(zip(made.clean, made.corrupted, strict=True)) if a != b]
    assert changed == [1 + 8] == [changed_position(PERIOD, 0, "copied")]
    assert made.foil == made.corrupted[9] and made.foil not in made.clean
    previous = document_example(tokens, PERIOD, doc=3, seed=5, vocabulary=vocabulary, bos=None, change="previous")
    assert previous.clean == [*tokens[:16], *tokens[:8]] and previous.foil is None
    assert [at for at, (a, b) in enumerate(zip(previous.clean, previous.corrupted, strict=True)) if a != b] == [7]
    drawn = {document_example(tokens, PERIOD, doc=doc, seed=seed, vocabulary=vocabulary, bos=0,
                              change="copied").foil for doc in range(6) for seed in (0, 1)}
    assert len(drawn) > 6  # seeded by the document and the seed
    assert "fewer than the period" in document_example(tokens[:15], PERIOD, doc=0, seed=0, vocabulary=vocabulary,
                                                       bos=0, change="copied")


def test_a_run_stopped_mid_chunk_resumes_to_the_same_database(whole, tiny_gpt, tmp_path):
    path = tmp_path / "stopped.duckdb"
    committed, asked = [], []

    def should_stop():  # the third question after the first chunk was committed: inside the second chunk
        if committed and committed[-1] > 0:
            asked.append(1)
        return len(asked) >= 3

    state = run_patching(corpus(), BUNDLED_GPT_DIR, path, SETTINGS, loaded=tiny_gpt, should_stop=should_stop,
                         progress=lambda s: committed.append(s.done))
    assert state.status == pstore.STATUS_STOPPED and state.done == 2
    assert table(path, "SELECT count(*) FROM documents")[0][0] == 2  # the second chunk, stopped, was dropped
    assert json.loads(table(path, "SELECT value FROM settings WHERE key = 'status'")[0][0]) == "stopped"
    state = run_patching(corpus(), BUNDLED_GPT_DIR, path, SETTINGS, loaded=tiny_gpt)
    assert state.status == pstore.STATUS_FINISHED and state.done == 7 and state.done_this_run == 5
    assert table(path, CELLS) == table(whole, CELLS)
    assert table(path, DOCUMENTS) == table(whole, DOCUMENTS)
    assert table(path, "SELECT * FROM maps") == table(whole, "SELECT * FROM maps")


def test_runs_refuse_what_they_cannot_do(whole, tiny_gpt, tmp_path):
    for wrong in (dict(period=2), dict(sites=("resid", "magic")), dict(receivers=("2.1",)),
                  dict(receivers=("2.1:z",)), dict(mlps=("held",)), dict(sites=(), receivers=()),
                  dict(chunk_docs=0), dict(change="every")):
        with pytest.raises(ScanRefused):
            PatchingSettings(**wrong)
    copy = tmp_path / "copy.duckdb"
    shutil.copy(whole, copy)
    with pytest.raises(ScanRefused, match="holds another run"):
        run_patching(corpus(), BUNDLED_GPT_DIR, copy, PatchingSettings(max_docs=3, period=PERIOD, sites=("k",)),
                     loaded=tiny_gpt)
    for receiver in ("0.1:k", "3.0:q", "2.9:v"):  # layer 0 has no sender; the tiny GPT has 3 layers of 4 heads
        with pytest.raises(ScanRefused, match="receiver"):
            run_patching(corpus(), BUNDLED_GPT_DIR, tmp_path / "r.duckdb",
                         PatchingSettings(period=PERIOD, receivers=(receiver,)), loaded=tiny_gpt)
    with pytest.raises(ScanRefused, match="positions"):
        run_patching(corpus(), BUNDLED_GPT_DIR, tmp_path / "p.duckdb", PatchingSettings(period=200), loaded=tiny_gpt)
    assert not (tmp_path / "r.duckdb").exists() and not (tmp_path / "p.duckdb").exists()  # refused before writing


def test_the_command_line_runs_and_resumes(whole, tmp_path, capsys):
    """``python -m attnviz.corpus.patching`` stopped by its stop file, then ``attnviz patch`` resumes it: the three
    documents it reads get the cells the run here gave them."""
    file = tmp_path / "corpus.jsonl"
    file.write_text("".join(json.dumps({"text": document.text}) + "\n" for document in corpus().documents))
    (tmp_path / "stop").write_text("")
    out = tmp_path / "cli.duckdb"
    options = [str(file), "--model", str(BUNDLED_GPT_DIR), "--out", str(out), "--max-docs", "3", "--period",
               str(PERIOD), "--sites", "attn,k", "--receivers", "2.1:k", "--chunk", "1", "--quiet"]
    result = subprocess.run([sys.executable, "-m", "attnviz.corpus.patching", *options, "--stop-file",
                             str(tmp_path / "stop"), "--progress-file", str(tmp_path / "p.json")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "p.json").read_text())["status"] == "stopped"
    assert table(out, "SELECT count(*) FROM documents")[0][0] == 0

    from attnviz.app import command

    assert command.main(["patch", *options]) == 0
    assert json.loads(table(out, "SELECT value FROM settings WHERE key = 'status'")[0][0]) == "finished"
    some = CELLS.replace("ORDER BY", "WHERE doc < 3 ORDER BY")
    assert table(out, some) == table(whole, some)
    assert table(out, "SELECT doc, skipped IS NULL FROM documents ORDER BY doc") == [(0, True), (1, True),
                                                                                      (2, False)]
    assert command.main(["patch", *options, "--receivers", "9.9:k", "--out", str(tmp_path / "w.duckdb")]) == 2
    assert "receiver 9.9:k" in capsys.readouterr().err


def test_the_api_resumes_a_run_and_gives_its_spread(whole, direct, tmp_path):
    from attnviz.api.patching_runs import PatchingRun, open_patching, patch_corpus

    copy = tmp_path / "api.duckdb"
    shutil.copy(whole, copy)  # the same corpus, model and settings: the same run, finished, returned as it is
    run = patch_corpus(corpus(), str(BUNDLED_GPT_DIR), copy, progress=False, max_docs=7, period=PERIOD,
                       sites="attn,k", receivers=["2.1:k"], chunk_docs=2)
    assert isinstance(run, PatchingRun) and run.status == "finished" and run.done == 7 and run.planned == 7
    _, maps = direct
    for name, found in maps.items():
        got, expected = run.spread(name), found.share_spread
        for part in ("mean", "std", "low", "high"):
            torch.testing.assert_close(getattr(got, part), getattr(expected, part), rtol=1e-9, atol=1e-12,
                                       equal_nan=True)
        assert got.examples == 6
    summary = open_patching(copy).summary("2.1:k/frozen")
    assert len(summary) == 2 * 4 and list(summary["row_label"].unique()) == ["layer 0", "layer 1"]
    assert summary["mean"].tolist() == pytest.approx(maps["2.1:k/frozen"].share_spread.mean.reshape(-1).tolist())
    assert run.documents()["skipped"].notna().sum() == 1 and "patching" in run.tables()

    # a new run from a list of texts, its sites as a list; another file with other settings is refused
    fresh = patch_corpus([document.text for document in corpus().documents[:2]], str(BUNDLED_GPT_DIR),
                         tmp_path / "fresh.duckdb", progress=True, max_docs=2, period=PERIOD, sites=["head"])
    assert fresh.status == "finished" and fresh.shares("head").shape == (2, 3, 4)
    with pytest.raises(ScanRefused, match="holds another patching run"):
        patch_corpus(corpus(), str(BUNDLED_GPT_DIR), copy, progress=False, max_docs=7, period=PERIOD, sites="head")
    with pytest.raises(ValueError, match="no setting"):
        patch_corpus(corpus(), str(BUNDLED_GPT_DIR), tmp_path / "x.duckdb", progress=False, periods=3)


def patching_on_ray(path: str) -> dict:
    """The run on Ray, in the child process of :mod:`tests.ray_child` (a cluster of its own)."""
    from attnviz.corpus.patching.on_ray import run_patching_on_ray

    seen = []
    state = run_patching_on_ray(corpus(), BUNDLED_GPT_DIR, path, SETTINGS, address=None, workers=2,
                                loaded=load_model(BUNDLED_GPT_DIR), progress=lambda s: seen.append(s.done))
    return {"status": state.status, "seen": seen, "skipped": state.skipped}


@pytest.mark.slow
@pytest.mark.serial
def test_ray_gives_the_same_results_as_the_run_here(whole, tmp_path):
    from tests.ray_child import on_ray

    state = on_ray("tests.test_patching_corpus:patching_on_ray", path=str(tmp_path / "ray.duckdb"))
    assert state["status"] == pstore.STATUS_FINISHED and state["seen"][-1] == 7 and state["skipped"] == 1
    here, there = table(whole, CELLS), table(tmp_path / "ray.duckdb", CELLS)
    assert [row[:6] for row in here] == [row[:6] for row in there]
    for a, b in zip(here, there, strict=True):
        assert a[6] == pytest.approx(b[6], rel=1e-5, abs=1e-6)
        assert (a[7] is None and b[7] is None) or a[7] == pytest.approx(b[7], rel=1e-5, abs=1e-6)
    documents = "SELECT doc, source, n_tokens, answer, foil, replacement, skipped FROM documents ORDER BY doc"
    assert table(whole, documents) == table(tmp_path / "ray.duckdb", documents)
