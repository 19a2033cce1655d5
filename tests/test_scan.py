"""Scans: the statistics equal a brute-force computation from transformers' eager weights; partials merge to one
pass; a resumed scan equals an uninterrupted one; the searches find what a brute-force search finds; the command
line scans, stops and resumes."""

import math

import numpy as np
import pytest
import torch

from attnviz.core.analysis import MIN_LABELLED_QUERIES, UNLABELLED, is_punctuation, label_head
from attnviz.corpus.documents import Corpus, Document
from attnviz.corpus.scan import qk_sample, store
from attnviz.corpus.scan.heads import CRITERIA, LABELS, OFFSETS, SCAN_STATISTICS, Partial, document_partial
from attnviz.corpus.scan.runner import ScanRefused, ScanSettings, run_scan, scan_key

TEXTS = [
    "The cat sat on the mat, and the dog slept by the door.",
    "Attention weights say where a head looks; ablation says whether the model needs it.",
    "Paris is the capital of France. Berlin is the capital of Germany.",
    "A list, a tuple and a dict: three containers, each with its own rules!",
    "Short one.",
    "Induction heads copy: red blue green red blue green red blue green.",
]
MAX_TOKENS = 24


def small_corpus() -> Corpus:
    return Corpus("tests", [Document(text, f"line {i + 1}") for i, text in enumerate(TEXTS)])


@pytest.fixture(scope="module")
def gpt2(tiny_checkpoint):
    from attnviz.models.loading import load_model_dir

    return load_model_dir(tiny_checkpoint("gpt2"))


def tables(path) -> dict:
    """Every table and view of a scan, sorted, for comparing two scans."""
    with store.ScanReader(path) as reader:
        found = {}
        for table in ("documents", "tokens", "head_documents", "query_top_keys", "token_pairs", "key_tokens",
                      "head_stats", "label_state", "offset_state", "histogram_state", "examples"):
            frame = reader.frame(f"SELECT * FROM {table}")
            found[table] = frame.sort_values(list(frame.columns[:min(5, len(frame.columns))])).reset_index(drop=True)
        if qk_sample.has_sample(reader.connection):  # the sample of queries and keys, and its kept projections
            for table, columns in (("qk_documents", "*"), ("qk_vectors", "*"), ("qk_masks", "*"),
                                   ("qk_projections", "layer, head, method, dims, seed, with_values, coordinates, "
                                                      "trust")):
                found[table] = reader.frame(f"SELECT {columns} FROM {table} ORDER BY ALL")
        return found


def assert_same_tables(a: dict, b: dict, rtol: float = 1e-9, atol: float = 1e-12) -> None:
    """Equal tables: the same rows, floats equal to ``rtol`` (the order of additions; on Ray, each worker's own
    float32 matrix products with its own thread count)."""
    for name in a:
        left, right = a[name], b[name]
        assert list(left.columns) == list(right.columns), name
        assert len(left) == len(right), name
        for column in left.columns:
            x, y = left[column].to_numpy(), right[column].to_numpy()
            if x.dtype.kind == "f":
                np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=f"{name}.{column}")
            elif x.dtype == object and len(x) and isinstance(x[0], np.ndarray):
                for u, v in zip(x, y, strict=True):
                    np.testing.assert_allclose(np.asarray(u, dtype=float) if u.dtype.kind == "f" else 0,
                                               np.asarray(v, dtype=float) if v.dtype.kind == "f" else 0,
                                               rtol=rtol, atol=max(atol, 1e-5))
                    assert list(map(str, u)) == list(map(str, v)) or u.dtype.kind == "f"
            else:
                assert list(x) == list(y), f"{name}.{column}"


# ---------------------------------------------------------------------------------------------------------------
# The statistics against transformers' own eager weights, computed row by row in numpy


def eager_documents(bundle, texts, max_tokens):
    """Per document: (token ids, tokens, special flags, [layers, heads, n, n] float64 weights) from transformers'
    eager attention, run here (not through attnviz's capture)."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(bundle.folder, attn_implementation="eager", local_files_only=True,
                                      use_safetensors=True).eval()
    tokenizer = bundle.tokenizer
    documents = []
    for text in texts:
        encoded = tokenizer(text, truncation=True, max_length=max_tokens, return_tensors="pt",
                            return_special_tokens_mask=True)
        special = encoded.pop("special_tokens_mask")[0].bool().tolist()
        if bundle.architecture == "decoder":  # a decoder gets no token types (GPT-2 would embed BERT's zeros)
            encoded.pop("token_type_ids", None)
        with torch.no_grad():
            attentions = model(**encoded, output_attentions=True).attentions
        weights = torch.stack([a[0] for a in attentions]).double().numpy()
        ids = encoded["input_ids"][0].tolist()
        documents.append((ids, tokenizer.convert_ids_to_tokens(ids), special, weights))
    return documents


def brute_force(documents, layer, head, causal=False, separator_ids=()):
    """Every row's statistics of one head over all documents, one row at a time. ``causal``: the model's mask (a
    query sees the keys up to itself); ``separator_ids``: the tokenizer's [SEP] / </s> ids (none: every special
    token but the first)."""
    rows = {name: [] for name in SCAN_STATISTICS}
    offsets = {offset: [] for offset in OFFSETS}
    for ids, tokens, special, weights in documents:
        w = weights[layer, head]
        n = len(tokens)
        for i in range(n):
            row = w[i]
            seen = row[row > 0]
            entropy = float(-(seen * np.log(seen)).sum())
            rows["entropy"].append(entropy)
            allowed = i + 1 if causal else n
            if allowed > 1:
                rows["normalised_entropy"].append(entropy / math.log(allowed))
            earlier = [j for j in range(i) if ids[j] == ids[i] and not special[j]] if not special[i] else []
            if earlier:
                rows["duplicate"].append(sum(row[j] for j in earlier))
                rows["induction"].append(sum(row[j] for j in {j + 1 for j in earlier}))
            rows["mean_distance"].append(sum(row[j] * abs(i - j) for j in range(n)))
            rows["self"].append(row[i])
            if i > 0:
                rows["previous"].append(row[i - 1])
            if i < n - 1:
                rows["next"].append(row[i + 1])
            rows["first"].append(row[0])
            rows["separator"].append(sum(row[j] for j in range(1, n) if special[j] and (
                not separator_ids or ids[j] in separator_ids)))
            rows["punctuation"].append(sum(row[j] for j in range(n) if is_punctuation(tokens[j])))
            rows["special"].append(sum(row[j] for j in range(n) if special[j]))
            rows["max_weight"].append(row.max())
            for offset in OFFSETS:
                if 0 <= i + offset < n:
                    offsets[offset].append(row[i + offset])
    return rows, offsets


@pytest.mark.parametrize("which", ["bert", "gpt2"])
def test_statistics_equal_brute_force_from_eager_weights(which, bert, gpt2, tmp_path):
    bundle = bert if which == "bert" else gpt2
    corpus = small_corpus()
    path = tmp_path / "scan.duckdb"
    state = run_scan(corpus, bundle, path, ScanSettings(max_docs=10, max_tokens=MAX_TOKENS, chunk_docs=4))
    assert state.status == store.STATUS_FINISHED and state.done == len(TEXTS)
    documents = eager_documents(bundle, TEXTS, MAX_TOKENS)
    with store.ScanReader(path) as reader:
        assert (reader.n_layers, reader.n_heads) == documents[0][3].shape[:2]
        # the scan read the same tokens as the tokenizer gives
        top = reader.frame("SELECT doc, query, query_id FROM query_top_keys WHERE layer = 0 AND head = 0 "
                           "ORDER BY doc, query")
        for doc, (ids, *_) in enumerate(documents):
            assert top[top.doc == doc].query_id.tolist() == ids
        for layer, head in ((0, 0), (reader.n_layers - 1, reader.n_heads - 1), (1, 2)):
            causal = which == "gpt2"
            separators = {bundle.tokenizer.sep_token_id, bundle.tokenizer.eos_token_id} - {None}
            rows, offsets = brute_force(documents, layer, head, causal, separators)
            summary = reader.head_summary(layer, head).set_index("statistic")
            for name in SCAN_STATISTICS:
                values = np.asarray(rows[name])
                assert summary.loc[name, "mean"] == pytest.approx(values.mean(), rel=1e-4, abs=2e-5), name
                assert summary.loc[name, "spread"] == pytest.approx(values.std(), abs=2e-4), name
                assert summary.loc[name, "queries"] == len(values)
            profile = reader.offset_profile(layer, head).set_index("offset")["weight"]
            for offset in OFFSETS:
                expected = np.mean(offsets[offset]) if offsets[offset] else None
                if expected is None:
                    assert math.isnan(profile[offset]) or profile[offset] is None
                else:
                    assert profile[offset] == pytest.approx(expected, abs=2e-5)
            if which == "gpt2":  # causal: nothing attends to a later token
                assert all(profile[o] == 0 for o in OFFSETS if o > 0 and not math.isnan(profile[o]))
            # each document's label, by Explore's rules on that document's means
            labels = reader.label_shares(layer, head).set_index("label")["documents"]
            expected_labels = {}
            for ids, tokens, special, weights in documents:
                one_rows, _ = brute_force([(ids, tokens, special, weights)], layer, head, causal, separators)
                label = (label_head({name: float(np.mean(v)) if v else 0.0 for name, v in one_rows.items()})
                         if len(one_rows["normalised_entropy"]) >= MIN_LABELLED_QUERIES else UNLABELLED)
                expected_labels[label] = expected_labels.get(label, 0) + 1
            assert {k: int(v) for k, v in labels.items() if v} == expected_labels
            # the best "previous" example is the largest weight on a previous token anywhere in the corpus
            best = max((weights[layer, head, i, i - 1], doc, i) for doc, (_, _, _, weights) in enumerate(documents)
                       for i in range(1, weights.shape[-1]))
            example = reader.examples(layer, head, "previous")[0]
            assert example["score"] == pytest.approx(best[0], abs=1e-5)
            assert (example["doc"], example["query"], example["key"]) == (best[1], best[2], best[2] - 1)
            window = example["window_weights"]
            assert window[best[2] - example["window_start"] - 1] == pytest.approx(best[0], abs=1e-4)
            # token pairs: each query's three strongest keys, their weights summed by (query token, key token)
            pairs: dict = {}
            for ids, _, _, weights in documents:
                w = weights[layer, head]
                for i in range(len(ids)):
                    for j in np.argsort(-w[i], kind="stable")[:3]:
                        pairs[(ids[i], ids[j])] = pairs.get((ids[i], ids[j]), 0.0) + w[i, j]
            strongest = sorted(pairs.values(), reverse=True)[:5]
            found = reader.token_pairs(layer, head, limit=5)["weight"].tolist()
            np.testing.assert_allclose(found, strongest, atol=1e-4)
            # key tokens: all the weight each key token received, over every query
            received: dict = {}
            for ids, _, _, weights in documents:
                for j, token in enumerate(ids):
                    received[token] = received.get(token, 0.0) + weights[layer, head, :, j].sum()
            top_keys = reader.key_tokens(layer, head, limit=3)["weight"].tolist()
            np.testing.assert_allclose(top_keys, sorted(received.values(), reverse=True)[:3], atol=1e-4)
            assert sum(received.values()) == pytest.approx(summary.loc["entropy", "queries"], abs=1e-3)


# ---------------------------------------------------------------------------------------------------------------
# Merging, resuming, reusing


def random_weights(seed, heads, n, causal):
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(heads, n, n, generator=generator) * 3
    if causal:
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return scores.softmax(-1)


def partial_of(doc, n, layers=2, heads=3):
    pieces = ["[CLS]", *[f"w{(doc * 7 + i) % 5}" for i in range(n - 2)], "[SEP]"]
    weights = torch.stack([random_weights(doc * 10 + layer, heads, n, causal=doc % 2 == 1) for layer in range(layers)])
    return document_partial(doc, weights, pieces, pieces,
                            [True, *[False] * (n - 2), True], [100 + (doc * 7 + i) % 5 for i in range(n)], False)


def test_merging_partials_equals_one_pass_in_any_grouping():
    sizes = [5, 9, 3, 12, 7, 30, 4, 16]
    parts = [partial_of(doc, n) for doc, n in enumerate(sizes)]
    one_pass = Partial(2, 3)
    for part in [partial_of(doc, n) for doc, n in enumerate(sizes)]:
        one_pass.merge(part)
    left = Partial(2, 3).merge(parts[0]).merge(parts[1]).merge(parts[2])
    right = Partial(2, 3)
    for part in reversed(parts[3:]):  # another order too
        right.merge(part)
    merged = Partial(2, 3).merge(right).merge(left)
    for name in Partial.ARRAYS:
        np.testing.assert_allclose(getattr(merged, name), getattr(one_pass, name), rtol=1e-12, err_msg=name)
    assert merged.examples.keys() == one_pass.examples.keys()
    for slot, kept in one_pass.examples.items():
        assert [(e.doc, e.query, e.score) for e in merged.examples[slot]] == [(e.doc, e.query, e.score) for e in kept]
    assert int(one_pass.labels.sum()) == len(sizes) * 2 * 3  # one label per document and head
    assert sorted(d["doc"] for d in merged.documents) == list(range(len(sizes)))


def test_chunk_size_does_not_change_the_tables(bert, tmp_path):
    corpus = small_corpus()
    run_scan(corpus, bert, tmp_path / "one.duckdb", ScanSettings(max_docs=10, max_tokens=MAX_TOKENS, chunk_docs=10))
    run_scan(corpus, bert, tmp_path / "many.duckdb", ScanSettings(max_docs=10, max_tokens=MAX_TOKENS, chunk_docs=1))
    assert_same_tables(tables(tmp_path / "one.duckdb"), tables(tmp_path / "many.duckdb"))


def test_a_resumed_scan_equals_an_uninterrupted_one(gpt2, tmp_path):
    corpus = small_corpus()
    settings = ScanSettings(max_docs=10, max_tokens=MAX_TOKENS, chunk_docs=2)
    whole = tmp_path / "whole.duckdb"
    run_scan(corpus, gpt2, whole, settings)
    stopped = tmp_path / "stopped.duckdb"
    asked = []
    state = run_scan(corpus, gpt2, stopped, settings, should_stop=lambda: asked.append(1) or len(asked) > 1)
    assert state.status == store.STATUS_STOPPED and state.done == 2
    with store.ScanReader(stopped) as reader:
        assert reader.documents == 2 and reader.settings["status"] == store.STATUS_STOPPED
    state = run_scan(corpus, gpt2, stopped, settings)
    assert state.status == store.STATUS_FINISHED and state.done == len(TEXTS) and state.done_this_run == 4
    assert_same_tables(tables(whole), tables(stopped))
    # A finished scan asked again does nothing and changes nothing
    again = run_scan(corpus, gpt2, stopped, settings)
    assert again.done_this_run == 0
    assert_same_tables(tables(whole), tables(stopped))


def test_a_document_whose_weights_are_not_finite_is_reported_and_left_out(bert, tmp_path, monkeypatch):
    """A model that overflows on one document (NaN weights) must not spoil the sums of every head: that document
    is listed with its problem, and the tables equal a scan of the corpus without it."""
    from attnviz.corpus.scan import runner
    from attnviz.models.record import AttentionRecord

    replay = AttentionRecord.every_layer_weights

    def overflowing(record, *args, **kwargs):
        weights = replay(record, *args, **kwargs)
        return weights.fill_(float("nan")) if "mat" in record.query_tokens else weights

    monkeypatch.setattr(AttentionRecord, "every_layer_weights", overflowing)
    corpus = small_corpus()
    settings = ScanSettings(max_docs=10, max_tokens=MAX_TOKENS)
    run_scan(corpus, bert, tmp_path / "with.duckdb", settings)
    with store.ScanReader(tmp_path / "with.duckdb") as reader:
        documents = reader.frame("SELECT doc, n_tokens, problem FROM documents ORDER BY doc")
        stats = reader.frame("SELECT * FROM head_stats")
    assert documents["problem"].iloc[0] == runner.NONFINITE and documents["problem"].iloc[1:].isna().all()
    assert documents["n_tokens"].iloc[0] == 0
    assert np.isfinite(stats[["mean", "spread"]].to_numpy(dtype=float)[~stats["mean"].isna()]).all()
    assert stats["documents"].max() == len(TEXTS) - 1
    without = Corpus("tests", corpus.documents[1:])
    run_scan(without, bert, tmp_path / "without.duckdb", settings)
    with store.ScanReader(tmp_path / "without.duckdb") as reader:
        expected = reader.frame("SELECT * FROM head_stats")
    merged = stats.merge(expected, on=["layer", "head", "statistic"], suffixes=("", "_without"))
    assert len(merged) == len(stats)
    np.testing.assert_allclose(merged["mean"], merged["mean_without"], rtol=1e-9)


def test_a_file_of_another_scan_is_refused_and_keys_follow_the_inputs(bert, tmp_path):
    corpus = small_corpus()
    path = tmp_path / "scan.duckdb"
    run_scan(corpus, bert, path, ScanSettings(max_docs=2, max_tokens=MAX_TOKENS))
    with pytest.raises(ScanRefused, match="holds another scan"):
        run_scan(corpus, bert, path, ScanSettings(max_docs=2, max_tokens=MAX_TOKENS + 1))
    with pytest.raises(ScanRefused, match="every layer's weights of a document at once, up to 1,024 tokens"):
        run_scan(corpus, bert, tmp_path / "long.duckdb", ScanSettings(max_docs=2, max_tokens=4_096))
    assert not (tmp_path / "long.duckdb").exists()
    base = scan_key(corpus, bert.folder, ScanSettings(max_docs=2, max_tokens=24))
    assert base == scan_key(small_corpus(), bert.folder, ScanSettings(max_docs=2, max_tokens=24, chunk_docs=3))
    assert base != scan_key(corpus, bert.folder, ScanSettings(max_docs=3, max_tokens=24))
    other = Corpus("tests", [*corpus.documents[:-1], Document("changed", "line 6")])
    assert base != scan_key(other, bert.folder, ScanSettings(max_docs=2, max_tokens=24))


# ---------------------------------------------------------------------------------------------------------------
# Searches and exports


@pytest.fixture(scope="module")
def bert_scan(bert, tmp_path_factory):
    path = tmp_path_factory.mktemp("scan") / "bert.duckdb"
    run_scan(small_corpus(), bert, path, ScanSettings(max_docs=10, max_tokens=MAX_TOKENS, chunk_docs=3))
    return path


def test_query_search_finds_what_a_brute_force_search_finds(bert, bert_scan):
    documents = eager_documents(bert, TEXTS, MAX_TOKENS)
    layer, head, min_weight = 2, 5, 0.2
    expected = set()
    for doc, (_, tokens, _, weights) in enumerate(documents):
        for i, token in enumerate(tokens):
            j = int(weights[layer, head, i].argmax())
            if token == "the" and weights[layer, head, i, j] >= min_weight:
                expected.add((doc, i, tokens[j]))
    with store.ScanReader(bert_scan) as reader:
        found, sql = reader.search_queries(query_word="The", key_word=None, layer=layer, head=head,
                                           min_weight=min_weight)
        assert {(r.doc, r.query, r.key_token) for r in found.itertuples()} == expected and expected
        assert "query_top_keys" in sql
        key = next(iter(expected))[2]
        narrowed, _ = reader.search_queries(query_word="the", key_word=key, layer=layer, head=head,
                                            min_weight=min_weight)
        assert set(narrowed.key_token) == {key} and len(narrowed) == sum(e[2] == key for e in expected)


def test_head_search_and_label_map(bert_scan):
    with store.ScanReader(bert_scan) as reader:
        found, _ = reader.search_heads("[CLS]", 0.3)
        shares = reader.statistic_map("first")[0]  # [CLS] is every document's first token
        expected = {(layer, head) for layer, head in zip(*np.nonzero(shares > 0.3), strict=True)}
        assert {(r.layer, r.head) for r in found.itertuples()} == expected
        np.testing.assert_allclose(found["share"], [shares[r.layer, r.head] for r in found.itertuples()], atol=1e-6)
        total = sum(reader.statistic_map(label)[0] for label in LABELS)
        np.testing.assert_allclose(total, 1.0)  # every document gives each head one label


def test_every_table_exports_to_parquet(bert_scan, tmp_path):
    import duckdb

    with store.ScanReader(bert_scan) as reader:
        for table in store.EXPORTABLE:
            target = reader.export_parquet(table, tmp_path / f"{table}.parquet")
            with duckdb.connect() as connection:
                rows = connection.execute("SELECT count(*) FROM read_parquet(?)", [str(target)]).fetchone()[0]
            assert rows == reader.frame(f"SELECT count(*) AS n FROM {table}")["n"][0] and rows > 0
        with pytest.raises(ValueError):
            reader.export_parquet("pg_catalog.pg_tables; --", tmp_path / "x.parquet")


def test_examples_are_kept_per_criterion_best_first(bert_scan):
    with store.ScanReader(bert_scan) as reader:
        for criterion in CRITERIA:
            found = reader.examples(0, 1, criterion)
            scores = [e["score"] for e in found]
            assert scores == sorted(scores, reverse=True)
            assert len({e["doc"] for e in found}) == len(found)  # one per document
            for e in found:
                positions = list(e["window_positions"])
                assert len(e["window_tokens"]) == len(e["window_weights"]) == len(positions)
                assert positions == sorted(set(positions)) and positions[0] == e["window_start"]
                assert e["query"] in positions and e["key"] in positions  # the key is shown, however far


def test_an_example_window_shows_a_far_key_beside_the_query_context():
    """A key 40 tokens before its query: the window holds the query's context and, apart, the key's."""
    from attnviz.corpus.scan.heads import KEY_CONTEXT, WINDOW_AFTER, WINDOW_BEFORE, window_positions

    near = window_positions(50, 45, 100)
    assert near == list(range(50 - WINDOW_BEFORE, 50 + WINDOW_AFTER + 1))
    far = window_positions(50, 5, 100)
    assert far == [*range(5 - KEY_CONTEXT, 5 + KEY_CONTEXT + 1), *range(50 - WINDOW_BEFORE, 50 + WINDOW_AFTER + 1)]
    assert window_positions(3, 99, 100)[-1] == 99


def test_an_example_names_the_key_its_criterion_points_at(bert, bert_scan):
    """previous, next, self and first point at their position; separator and punctuation at the strongest key of
    that kind; every example's weight is the real weight on that key (transformers' eager weights)."""
    documents = eager_documents(bert, TEXTS, MAX_TOKENS)
    checked = set()
    with store.ScanReader(bert_scan) as reader:
        for layer, head in ((0, 1), (3, 7), (5, 0)):
            for criterion in CRITERIA:
                for e in reader.examples(layer, head, criterion):
                    _, tokens, special, weights = documents[e["doc"]]
                    row, query, key = weights[layer, head, e["query"]], e["query"], e["key"]
                    expected = {"previous": query - 1, "next": query + 1, "self": query, "first": 0}.get(criterion)
                    ids = documents[e["doc"]][0]
                    if criterion in ("duplicate", "induction"):  # the strongest of the query's targets
                        earlier = [j for j in range(query) if ids[j] == ids[query] and not special[j]]
                        targets = earlier if criterion == "duplicate" else sorted({j + 1 for j in earlier})
                        expected = max(targets, key=lambda j: row[j])
                        np.testing.assert_allclose(e["score"], sum(row[j] for j in targets), atol=1e-5)
                    elif criterion in ("separator", "punctuation"):
                        kind = ([flag and j > 0 for j, flag in enumerate(special)] if criterion == "separator"
                                else [is_punctuation(t) for t in tokens])
                        expected = max((j for j in range(len(row)) if kind[j]), key=lambda j: row[j])
                        np.testing.assert_allclose(e["score"], sum(row[j] for j in range(len(row)) if kind[j]),
                                                   atol=1e-5)  # the share of the whole kind; the key its largest
                    elif expected is not None:
                        np.testing.assert_allclose(e["score"], row[key], atol=1e-5)
                    if expected is not None:
                        assert key == expected, (criterion, e)
                    np.testing.assert_allclose(e["weight"], row[key], atol=1e-5)
                    checked.add(criterion)
    assert checked == set(CRITERIA)


def test_key_tokens_rank_by_weight_and_per_occurrence(bert_scan):
    with store.ScanReader(bert_scan) as reader:
        every = reader.frame("SELECT t.readable AS key_token, sum(weight) AS weight, sum(occurrences) AS occurrences "
                             "FROM key_parts k JOIN tokens t ON t.token_id = k.key_id WHERE layer = 1 AND head = 2 "
                             "GROUP BY ALL")
        by_weight = reader.key_tokens(1, 2, 5)
        assert by_weight["weight"].tolist() == sorted(every["weight"], reverse=True)[:5]
        per = reader.key_tokens(1, 2, 5, by="per occurrence", min_occurrences=3)
        often = every[every.occurrences >= 3]
        expected = sorted(often.weight / often.occurrences, reverse=True)[:5]
        np.testing.assert_allclose(per["per_occurrence"], expected)
        assert len(per) == min(5, len(often)) > 0


def test_words_keep_wordpieces_apart():
    assert store.word_of("##in") == "##in" and store.word_of("In") == "in"
    assert store.word_of("Ġthe") == store.word_of("▁the") == store.word_of("The") == "the"


# ---------------------------------------------------------------------------------------------------------------
# The command line


def test_the_command_line_scans_stops_and_resumes(tmp_path, capsys):
    import json

    from attnviz.corpus.scan.__main__ import main
    from attnviz.models.shipped import DEFAULT_MODEL_NAME

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS), encoding="utf-8")
    out, progress, stop = tmp_path / "scan.duckdb", tmp_path / "progress.json", tmp_path / "stop"
    stop.touch()
    arguments = [str(corpus), "--model", DEFAULT_MODEL_NAME, "--out", str(out), "--max-tokens", "16", "--chunk",
                 "2", "--progress-file", str(progress)]
    assert main([*arguments, "--stop-file", str(stop)]) == 0
    assert json.loads(progress.read_text())["status"] == store.STATUS_STOPPED
    stop.unlink()
    assert main(arguments) == 0
    said = json.loads(progress.read_text())
    assert said["status"] == store.STATUS_FINISHED and said["done"] == len(TEXTS)
    assert "finished: 6 of 6 documents" in capsys.readouterr().err
    with store.ScanReader(out) as reader:
        assert reader.documents == len(TEXTS) and reader.settings["max_tokens"] == 16
    assert main(["missing.txt", "--model", DEFAULT_MODEL_NAME, "--out", str(out), "--progress-file",
                 str(progress)]) == 2
    assert json.loads(progress.read_text())["status"] == "failed"
    capsys.readouterr()
    # an --out that is not a DuckDB file, or whose folder is missing: a message, no traceback
    (tmp_path / "notes.duckdb").write_text("not a database")
    for bad in (tmp_path / "notes.duckdb", tmp_path / "missing" / "scan.duckdb"):
        assert main([str(corpus), "--model", "all-minilm", "--out", str(bad), "--progress-file", str(progress)]) == 2
        said = json.loads(progress.read_text())
        assert said["status"] == "failed" and "cannot be written as a scan's database" in said["error"]
    # a bundled model by the start of its name; an unknown name lists the bundled ones
    assert main([str(corpus), "--model", "no-such-model", "--out", str(tmp_path / "x.duckdb")]) == 2
    assert DEFAULT_MODEL_NAME in capsys.readouterr().err


def test_a_scan_stopped_in_its_sample_is_grouped_when_it_finishes(bert, tmp_path):
    """A stop during the queries-and-keys sample leaves every document scanned; the run that then finishes the
    sample must still copy the file compactly (each token pair once), as an uninterrupted scan does."""
    import duckdb

    settings = ScanSettings(max_docs=6, max_tokens=MAX_TOKENS, chunk_docs=2, qk_points=64)
    path, whole = tmp_path / "stopped.duckdb", tmp_path / "whole.duckdb"
    asked = []
    stop_in_sample = lambda: asked.append(1) or len(asked) > 3 + 1  # noqa: E731 - after the 3 chunks, in the sample
    state = run_scan(small_corpus(), bert, path, settings, should_stop=stop_in_sample)
    assert state.status == store.STATUS_STOPPED and state.done == 6 and 0 < state.sampled < state.sample_planned
    kept_before, planned = state.sampled, state.sample_planned
    seen = []
    resumed = run_scan(small_corpus(), bert, path, settings, progress=lambda s: seen.append((s.sampled,
                                                                                             s.sample_planned)))
    assert resumed.status == store.STATUS_FINISHED
    sample = [entry for entry in seen if entry[1]]
    assert sample[0] == (kept_before, planned) and sample[-1] == (planned, planned)  # counted from before the stop
    run_scan(small_corpus(), bert, whole, settings)
    for file in (path, whole):
        with duckdb.connect(str(file), read_only=True) as connection:
            rows, distinct = connection.execute(
                "SELECT count(*), (SELECT count(*) FROM (SELECT DISTINCT layer, head, query_id, key_id "
                "FROM pair_parts)) FROM pair_parts").fetchone()
            assert rows == distinct > 0, file.name
    assert_same_tables(tables(whole), tables(path))
    assert path.stat().st_size <= 1.05 * whole.stat().st_size  # copied afresh, not grouped in place


def test_a_scan_being_rewritten_is_not_listed(tmp_path):
    """rewrite_compactly writes ``.<key>.compact.duckdb`` beside the scan before renaming it over: a page that lists
    the folder meanwhile must not try to open it."""
    from attnviz.corpus.background import ScanFolder

    folder = ScanFolder(tmp_path / "scans")
    (folder.folder / "abc.duckdb").write_bytes(b"")
    (folder.folder / ".abc.compact.duckdb").write_bytes(b"")
    assert [path.name for path in folder.scans()] == ["abc.duckdb"]


def test_a_finished_scan_keeps_each_token_pair_once_sorted_by_head(bert, tmp_path):
    """The chunks write their own parts; the finished file holds each (head, query token, key token) once, by head
    then weight (grouped while the file is copied compactly), with the same totals as the chunks wrote."""
    import duckdb

    path = tmp_path / "scan.duckdb"
    settings = ScanSettings(max_docs=10, max_tokens=MAX_TOKENS, chunk_docs=2, qk_points=0)
    run_scan(small_corpus(), bert, path, settings)
    with duckdb.connect(str(path), read_only=True) as connection:
        for table, key in (("pair_parts", "layer, head, query_id, key_id"), ("key_parts", "layer, head, key_id")):
            rows, distinct = connection.execute(
                f"SELECT count(*), (SELECT count(*) FROM (SELECT DISTINCT {key} FROM {table})) FROM {table}").fetchone()
            assert rows == distinct > 0, table
            ordered = connection.execute(f"SELECT layer, head, weight FROM {table}").fetchall()
            assert ordered == sorted(ordered, key=lambda row: (row[0], row[1], -row[2])), table
        pairs = connection.execute("SELECT sum(count) FROM pair_parts").fetchone()[0]
        queries = connection.execute("SELECT count(*) FROM query_top_keys").fetchone()[0]
    assert pairs == 3 * queries  # each query's three strongest keys, every one counted once (no short document)


def test_an_uploaded_corpus_keeps_a_readable_name_inside_its_folder(tmp_path):
    from attnviz.corpus.background import ScanFolder

    folder = ScanFolder(tmp_path / "scans")
    kept = folder.keep_corpus(b"a,b\n", "../../my notes (v2).csv")
    assert kept.parent == folder.folder and kept.name.startswith("my_notes_v2-") and kept.suffix == ".csv"
    assert folder.keep_corpus(b"a,b\n", "../../my notes (v2).csv") == kept  # the same file is kept once
    assert folder.keep_corpus(b"x", "....csv").name.startswith("corpus-")


def test_a_scan_in_another_dtype_is_another_scan(bert):
    """A half-precision checkpoint scanned in fp32 never resumes (or reopens) a scan made as stored: the key holds
    the dtype as loaded. float32, the common case, keeps the keys scans had before."""
    from attnviz.corpus.importance.runner import ImportanceSettings, importance_key

    settings = ScanSettings(max_docs=2, max_tokens=24)
    assert scan_key(small_corpus(), bert.folder, settings) == scan_key(small_corpus(), bert.folder, settings,
                                                                         "float32")
    assert scan_key(small_corpus(), bert.folder, settings, "bfloat16") != scan_key(small_corpus(), bert.folder,
                                                                                   settings, "float32")
    runs = ImportanceSettings(max_docs=2, max_tokens=24)
    assert importance_key(small_corpus(), bert.folder, runs) == importance_key(small_corpus(), bert.folder, runs,
                                                                               "stored")
    assert importance_key(small_corpus(), bert.folder, runs, "fp32") != importance_key(small_corpus(), bert.folder,
                                                                                       runs)
