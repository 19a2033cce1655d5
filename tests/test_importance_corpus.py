"""Head importance over a corpus, into DuckDB: chunked runs give each document what one batch of every document
gives (the corpus means, not a chunk's), a stopped run resumes to the same tables, a document with nothing to
predict is NULL, the command line and the background process write the same database, and Ray gives the same
results as the run in this process."""

import json
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from attnviz.corpus import background
from attnviz.corpus.documents import Corpus, CorpusRefused, Document
from attnviz.corpus.importance import store as istore
from attnviz.corpus.importance.runner import ImportanceSettings, read_corpus_spec, run_importance
from attnviz.corpus.scan.runner import ScanRefused
from attnviz.interventions import edits as iv
from attnviz.interventions import importance as imp
from attnviz.models.shipped import BUNDLED_GPT_DIR
from tests.tiny_models import TINY_GPT_HEADS, TINY_GPT_LAYERS

TEXTS = ["The cat sat on the mat, and the dog slept by the door.",
         "Attention weights say where a head looks; ablation says whether the model needs it.",
         "Paris is the capital of France. Berlin is the capital of Germany.",
         "A list, a tuple and a dict: three containers, each with its own rules!",
         "x",  # one token: nothing to predict
         "Induction heads copy: red blue green red blue green red blue green.",
         "   ",  # empty
         "The model reads every token once, then again with one head removed."]
SETTINGS = ImportanceSettings(max_docs=8, max_tokens=24, chunk_docs=3)


def corpus() -> Corpus:
    return Corpus("tests", [Document(text, f"line {i + 1}") for i, text in enumerate(TEXTS)])


@pytest.fixture(scope="module")
def tiny_gpt():
    return iv.editable_lm(BUNDLED_GPT_DIR)


def table(path, sql: str) -> list[tuple]:
    with istore.ImportanceReader(path) as reader:
        return reader.connection.execute(sql).fetchall()


EFFECTS = "SELECT doc, method, module, head, value FROM head_effects ORDER BY ALL"


@pytest.fixture(scope="module")
def tiny_gpt_64():
    """The tiny GPT in float64: the chunked run's sums (of the corpus means, of each chunk's losses) are taken in
    another order than one batch's, and in float32 that alone moved a value by 1.43e-6 (mean ablation of document 7,
    L2H1), past a 1.4e-6 tolerance; in float64 the order moves it by about 1e-15."""
    model, tokenizer = iv.editable_lm(BUNDLED_GPT_DIR)
    return model.double(), tokenizer


def test_a_chunked_run_gives_each_document_what_one_batch_of_the_corpus_gives(tiny_gpt_64, tmp_path):
    model, tokenizer = tiny_gpt_64
    seen = []
    state = run_importance(corpus(), BUNDLED_GPT_DIR, tmp_path / "run.duckdb", SETTINGS, loaded=tiny_gpt_64,
                           progress=lambda s: seen.append((s.phase, s.done)))
    assert state.status == istore.STATUS_FINISHED and state.done == 8
    assert seen[0] == ("means", 0) and ("heads", 3) in seen and seen[-1] == ("heads", 8)
    # the reference: every document with text in one batch (so the mean is over the whole corpus)
    measured = [0, 1, 2, 3, 4, 5, 7]
    batch = imp.batch_of(tokenizer, [TEXTS[doc] for doc in measured], "next-token", SETTINGS.max_tokens)
    expected = {"zero": imp.ablation_map(model, batch, "zero"), "mean": imp.ablation_map(model, batch, "mean"),
                "gradient": imp.gradient_importance(model, batch)}
    rows = table(tmp_path / "run.duckdb", EFFECTS)
    assert len(rows) == 7 * 3 * TINY_GPT_LAYERS * TINY_GPT_HEADS  # documents with text x methods x heads; the empty
    # one has none
    for doc, method, module, head, value in rows:
        reference = float(expected[method].per_text[module, head, measured.index(doc)])
        if doc == 4:  # one token: no target, NULL (not NaN) in the database, for every method
            assert value is None
        else:
            assert value == pytest.approx(reference, rel=1e-9, abs=1e-12), (doc, method, module, head)
    documents = table(tmp_path / "run.duckdb", "SELECT doc, n_tokens, clean FROM documents ORDER BY doc")
    assert [row[0] for row in documents] == list(range(8))
    assert documents[6][1] == 0 and documents[6][2] is None and documents[4][2] is None
    with istore.ImportanceReader(tmp_path / "run.duckdb") as reader:
        maps = reader.maps()
        assert reader.methods() == ["zero", "mean", "gradient"] and reader.documents == 8
        assert [module.label for module in reader.modules()] == [f"layer {i}" for i in range(TINY_GPT_LAYERS)]
        mean, spread, count = maps["zero"]
        assert (count == 6).all()  # NULLs are not counted
        np.testing.assert_allclose(mean, np.nanmean(expected["zero"].per_text.numpy(), -1), rtol=1e-9, atol=1e-12)
        assert np.isfinite(spread).all()
        assert reader.settings["objective"] == "next-token" and reader.settings["status"] == "finished"
        top = reader.per_document("zero", 0, 1, count=3)
        assert len(top) == 3 and top["change"].abs().is_monotonic_decreasing


def test_a_run_stopped_at_a_head_resumes_to_the_same_tables(tiny_gpt, tmp_path):
    run_importance(corpus(), BUNDLED_GPT_DIR, tmp_path / "whole.duckdb", SETTINGS, loaded=tiny_gpt)
    for stop_after in (1, 30):  # during the means pass; during the second chunk's heads
        asked = []

        def should_stop(stop_after=stop_after, asked=asked):
            asked.append(1)
            return len(asked) > stop_after

        path = tmp_path / f"stopped-{stop_after}.duckdb"
        state = run_importance(corpus(), BUNDLED_GPT_DIR, path, SETTINGS, loaded=tiny_gpt, should_stop=should_stop)
        assert state.status == istore.STATUS_STOPPED and state.done < 8
        kept = table(path, "SELECT count(*) FROM documents")[0][0]
        assert kept % 3 == 0  # whole chunks only: a chunk stopped at a head is dropped
        state = run_importance(corpus(), BUNDLED_GPT_DIR, path, SETTINGS, loaded=tiny_gpt)
        assert state.status == istore.STATUS_FINISHED and state.done == 8 and state.done_this_run == 8 - kept
        whole, resumed = table(tmp_path / "whole.duckdb", EFFECTS), table(path, EFFECTS)
        assert [row[:4] for row in whole] == [row[:4] for row in resumed]
        for a, b in zip(whole, resumed, strict=True):
            assert (a[4] is None and b[4] is None) or a[4] == pytest.approx(b[4], rel=1e-5, abs=1e-7)


def test_runs_refuse_what_they_cannot_do(tiny_gpt, tmp_path):
    run_importance(corpus(), BUNDLED_GPT_DIR, tmp_path / "run.duckdb", SETTINGS, loaded=tiny_gpt)
    other = ImportanceSettings(max_docs=4, max_tokens=24, chunk_docs=3)
    with pytest.raises(ScanRefused, match="holds another run"):
        run_importance(corpus(), BUNDLED_GPT_DIR, tmp_path / "run.duckdb", other, loaded=tiny_gpt)
    for wrong in (dict(max_docs=0), dict(chunk_docs=65), dict(max_tokens=1000), dict(methods=("zero", "magic"))):
        with pytest.raises(ScanRefused):
            ImportanceSettings(**wrong)
    with pytest.raises(CorpusRefused, match="no document"):
        run_importance(Corpus("empty", [Document(" ", "line 1")]), BUNDLED_GPT_DIR, tmp_path / "e.duckdb",
                       SETTINGS, loaded=tiny_gpt)
    (tmp_path / "junk.duckdb").write_bytes(b"not a database")
    with pytest.raises(CorpusRefused, match="not a scan"):
        read_corpus_spec(f"scan:{tmp_path / 'junk.duckdb'}")


def test_the_documents_of_a_scan_are_a_corpus(bert, tmp_path):
    from attnviz.corpus.scan.runner import ScanSettings, run_scan

    run_scan(corpus(), bert, tmp_path / "scan.duckdb", ScanSettings(max_docs=4, max_tokens=12))
    read = read_corpus_spec(f"scan:{tmp_path / 'scan.duckdb'}")
    assert [document.text for document in read.documents] == TEXTS[:4]
    assert read.name.startswith("the documents of scan")
    # what the page reads to name a run: the same fingerprint and size, from the texts' hashes alone
    from attnviz.corpus.importance.runner import scan_corpus_facts

    facts = scan_corpus_facts(tmp_path / "scan.duckdb")
    assert (facts.fingerprint, facts.count, facts.name) == (read.fingerprint, 4, read.name) and not facts.documents
    assert facts.characters == sum(len(text) for text in TEXTS[:4])


def test_the_background_process_writes_what_the_run_here_writes(tiny_gpt, tmp_path):
    folder = background.ScanFolder(tmp_path / "jobs")
    file = tmp_path / "corpus.txt"
    file.write_text("\n".join(TEXTS[:4]) + "\n")
    settings = ImportanceSettings(max_docs=4, max_tokens=16, chunk_docs=2, methods=("zero", "gradient"))
    job = folder.start_importance("k", str(file), BUNDLED_GPT_DIR, settings, model_name="tiny")
    deadline = time.time() + 240
    while folder.job() is not None and time.time() < deadline:
        time.sleep(0.5)
    progress = folder.progress("k")
    assert progress and progress["status"] == "finished", folder.log_tail("k")
    assert progress["phase"] == "heads" and progress["done"] == 4 and job.key == "k"
    here = tmp_path / "here.duckdb"
    run_importance(read_corpus_spec(str(file)), BUNDLED_GPT_DIR, here, settings, loaded=tiny_gpt)
    there = table(folder.database("k"), EFFECTS)
    assert [row[:4] for row in there] == [row[:4] for row in table(here, EFFECTS)]
    assert np.allclose([row[4] for row in there], [row[4] for row in table(here, EFFECTS)], rtol=1e-4, atol=1e-6)
    assert table(folder.database("k"), "SELECT value FROM settings WHERE key = 'model'")[0][0] == json.dumps("tiny")


def test_the_command_line_says_what_is_wrong(tmp_path):
    result = subprocess.run([sys.executable, "-m", "attnviz.corpus.importance", str(tmp_path / "missing.txt"),
                             "--model", str(BUNDLED_GPT_DIR), "--out", str(tmp_path / "x.duckdb"), "--quiet",
                             "--progress-file", str(tmp_path / "p.json")], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and "no corpus file" in result.stderr
    assert json.loads((tmp_path / "p.json").read_text())["status"] == "failed"


def importance_on_ray(path: str) -> dict:
    """The run on Ray, in the child process of :mod:`tests.ray_child` (a cluster of its own)."""
    from attnviz.corpus.importance.on_ray import run_importance_on_ray

    seen = []
    state = run_importance_on_ray(corpus(), BUNDLED_GPT_DIR, path, SETTINGS, address=None, workers=2,
                                  loaded=iv.editable_lm(BUNDLED_GPT_DIR), progress=lambda s: seen.append(s.done))
    return {"status": state.status, "seen": seen}


@pytest.mark.slow
@pytest.mark.serial
def test_ray_gives_the_same_results_as_the_run_here(tiny_gpt, tmp_path):
    from tests.ray_child import on_ray

    run_importance(corpus(), BUNDLED_GPT_DIR, tmp_path / "here.duckdb", SETTINGS, loaded=tiny_gpt)
    answer = on_ray("tests.test_importance_corpus:importance_on_ray", path=str(tmp_path / "ray.duckdb"))
    assert answer["status"] == istore.STATUS_FINISHED and answer["seen"][-1] == 8
    here, there = table(tmp_path / "here.duckdb", EFFECTS), table(tmp_path / "ray.duckdb", EFFECTS)
    assert [row[:4] for row in here] == [row[:4] for row in there]
    for a, b in zip(here, there, strict=True):
        assert (a[4] is None and b[4] is None) or a[4] == pytest.approx(b[4], rel=1e-5, abs=1e-7)


def test_corpus_means_weigh_every_token_alike(tiny_gpt):
    """The means pass, chunk by chunk, equals the mean over every real token of one batch of all the texts."""
    from attnviz.corpus.importance.runner import corpus_means

    model, tokenizer = tiny_gpt
    documents = list(enumerate(corpus().documents))
    means = corpus_means(model, tokenizer, "next-token", documents, SETTINGS)
    texts = [document.text for document in corpus().documents if document.text.strip()]
    batch = imp.batch_of(tokenizer, texts, "next-token", SETTINGS.max_tokens)
    expected, _ = iv.head_means(model, batch.inputs, batch.real)
    for name, mean in expected.items():
        assert torch.allclose(means[name], mean, atol=1e-6)


def test_a_scans_top_label_per_head_is_its_most_frequent(bert, tmp_path):
    import pandas as pd

    from attnviz.corpus.scan.runner import ScanSettings, run_scan
    from attnviz.corpus.scan.store import ScanReader

    texts = Corpus("tests", [document for document in corpus().documents if document.text.strip()])
    run_scan(texts, bert, tmp_path / "scan.duckdb", ScanSettings(max_docs=8, max_tokens=12))
    with ScanReader(tmp_path / "scan.duckdb") as reader:
        top = reader.top_labels()
        frame = reader.connection.execute("SELECT * FROM label_state").df()
    assert len(top) == 6 * 12
    for (layer, head), (label, share) in top.items():
        rows = frame[(frame["layer"] == layer) & (frame["head"] == head)]
        assert rows["documents"].max() == int(rows[rows["label"] == label]["documents"].iloc[0])
        assert share == pytest.approx(rows["documents"].max() / rows["documents"].sum())
    assert isinstance(frame, pd.DataFrame)


def test_the_docs_name_the_columns_a_run_really_has(tiny_gpt, tmp_path):
    """docs/importance.md's table of the run's DuckDB file names exactly the tables and columns a real run's file
    has (it named "tokens read" and "measure" where the columns are n_tokens and method)."""
    import re
    from pathlib import Path

    path = tmp_path / "run.duckdb"
    run_importance(corpus(), BUNDLED_GPT_DIR, path, ImportanceSettings(max_docs=2, max_tokens=8, methods=("zero",)),
                   loaded=tiny_gpt)
    real: dict[str, list[str]] = {}
    for name, column in table(path, "SELECT table_name, column_name FROM information_schema.columns "
                                    "ORDER BY table_name, ordinal_position"):
        real.setdefault(name, []).append(column)
    doc = (Path(__file__).parents[1] / "docs" / "importance.md").read_text()
    named = {}
    for line in doc.splitlines():
        found = re.match(r"\s*\| `(\w+)`[^|]*\| (.+) \|\s*$", line)
        if found:
            named[found.group(1)] = re.findall(r"`(\w+)`", found.group(2))
    assert named, "the doc's table of columns was not found"
    assert set(named) == set(real)
    for name, columns in named.items():
        assert columns == real[name], name
