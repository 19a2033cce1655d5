"""A scan's sample of queries, keys and values: whole documents drawn evenly across the corpus, the same whatever the
order or split; the vectors it keeps are the model's (a grouped-query model with RoPE: each query head with its K/V
head), its strongest keys and masks too; the weights recomputed from the kept vectors are the model's (to float16's
precision); PCA of every head is kept; a scan stopped while it samples resumes to the same tables; a projection
kept from a page reads back as made."""

import numpy as np
import pytest
import torch

from attnviz.core import qk_geometry
from attnviz.corpus.scan import qk_sample, store
from attnviz.corpus.scan.runner import ScanRefused, ScanSettings, run_scan
from attnviz.models import scoring
from attnviz.models.capture import capture
from tests.test_scan import MAX_TOKENS, TEXTS, assert_same_tables, small_corpus, tables


@pytest.fixture(scope="module")
def llama(tiny_checkpoint):
    from attnviz.models.loading import load_model_dir

    return load_model_dir(tiny_checkpoint("llama"))


def test_documents_are_drawn_evenly_and_alike_in_any_order_or_split():
    sizes = [(doc, 10 + doc % 7) for doc in range(1_000)]
    chosen = qk_sample.chosen_documents(sizes, 600)
    total = sum(n for doc, n in sizes if doc in chosen)
    assert 600 - 16 < total <= 600  # the next document in the drawing order would not have fitted
    ordered = sorted(sizes, key=lambda item: qk_sample.priority(item[0]))
    assert chosen == sorted(doc for doc, _ in ordered[:len(chosen)])  # a prefix of the drawing order
    assert qk_sample.chosen_documents(sizes[::-1], 600) == chosen
    # evenly across the corpus: each tenth of it holds a tenth of the documents, give or take one
    tenths = np.bincount(np.asarray(chosen) // 100, minlength=10)
    assert tenths.max() - tenths.min() <= 2, tenths
    assert qk_sample.chosen_documents([(doc, 1) for doc in range(1_000)], 4) == [0, 256, 512, 768]
    # merging the choices of two halves (as chunks, a resumed scan or Ray workers would) gives the same documents
    first, second = sizes[:400], sizes[400:]
    picked = set(qk_sample.chosen_documents(first, 600)) | set(qk_sample.chosen_documents(second, 600))
    assert qk_sample.chosen_documents([item for item in sizes if item[0] in picked], 600) == chosen
    # documents that could not be read (no tokens) are passed over, not counted
    assert qk_sample.chosen_documents([(doc, 0 if doc in chosen else n) for doc, n in sizes], 600) != chosen
    with pytest.raises(ScanRefused, match="between 0 and"):
        ScanSettings(qk_points=-1)


def test_the_kept_vectors_strongest_keys_and_masks_are_the_models(llama, tmp_path):
    path = tmp_path / "sample.duckdb"
    state = run_scan(small_corpus(), llama, path, ScanSettings(max_docs=10, max_tokens=MAX_TOKENS, qk_points=45))
    assert state.status == store.STATUS_FINISHED and state.sampled == state.sample_planned > 0
    with store.ScanReader(path) as reader:
        counts = dict(reader.connection.execute("SELECT doc, n_tokens FROM documents").fetchall())
        expected = qk_sample.chosen_documents(list(counts.items()), 45)
        facts = qk_sample.sample_facts(reader.connection)
        assert facts["documents"] == len(expected) and facts["tokens"] == sum(counts[d] for d in expected) <= 45
        assert reader.settings["qk_points"] == 45
        records = {doc: capture(llama, TEXTS[doc], max_tokens=MAX_TOKENS).records["self"] for doc in expected}
        checked = 0
        for layer in range(facts["n_layers"]):
            for head in range(facts["n_heads"]):
                kept, translate = qk_sample.head_vectors(reader.connection, layer, head, values=True)
                assert translate and [v.name for v in kept] == expected
                for vectors in kept:
                    record = records[vectors.name]
                    kv = record.kv_head(head)
                    assert kv == head // (record.n_heads // record.n_kv_heads)
                    for mine, theirs in ((vectors.queries, record.queries[layer, head]),
                                         (vectors.keys, record.keys[layer, kv]),
                                         (vectors.values, record.values[layer, kv])):
                        torch.testing.assert_close(mine, theirs.float(), rtol=1e-3, atol=1e-3)  # float16
                    weights = record.head_weights(layer, head)
                    allowed = record.mask_rows(layer)
                    assert torch.equal(vectors.allowed, allowed)
                    top_keys, top_weights = qk_geometry.strongest(weights, allowed)
                    assert torch.equal(vectors.strongest_keys, top_keys)
                    torch.testing.assert_close(vectors.strongest_weights, top_weights)
                    checked += 1
                # the weights computed again from the kept vectors, normalised: the model's, to float16's precision
                points = qk_sample.head_points(reader.connection, layer, head)
                for index, span in enumerate(points.documents):
                    record = records[kept[index].name]
                    logits = scoring.logits(points.queries[span.queries.start:span.queries.stop][None],
                                            points.keys[span.keys.start:span.keys.stop][None], record.scales[layer])
                    again = scoring.weights(logits, span.allowed[None])[0]
                    torch.testing.assert_close(again.float(), record.head_weights(layer, head), rtol=0, atol=5e-3)
                # PCA of every head is kept when the sample is, and is that of these points
                coordinates, trusted = qk_sample.stored_projection(reader.connection, layer, head, "PCA", 2, 0,
                                                                   False)
                again = qk_geometry.project(points, "PCA", 2)
                torch.testing.assert_close(coordinates, again, rtol=1e-5, atol=1e-5)
                assert trusted == pytest.approx(qk_geometry.trust(points, again))
        assert checked == facts["n_layers"] * facts["n_heads"] * len(expected)


def test_a_scan_stopped_while_it_samples_resumes_to_the_same_tables(bert, tmp_path):
    corpus, settings = small_corpus(), ScanSettings(max_docs=10, max_tokens=MAX_TOKENS, chunk_docs=10, qk_points=60)
    run_scan(corpus, bert, tmp_path / "whole.duckdb", settings)
    asked = []  # asked before the one chunk, then before each sampled document: stop after the first is kept
    state = run_scan(corpus, bert, tmp_path / "stopped.duckdb", settings,
                     should_stop=lambda: asked.append(1) or len(asked) > 2)
    assert state.status == store.STATUS_STOPPED and state.done == len(TEXTS) and state.sampled == 1
    with store.ScanReader(tmp_path / "stopped.duckdb") as reader:
        assert qk_sample.sample_facts(reader.connection)["documents"] == 1
    state = run_scan(corpus, bert, tmp_path / "stopped.duckdb", settings)
    assert state.status == store.STATUS_FINISHED and state.done_this_run == 0
    assert_same_tables(tables(tmp_path / "whole.duckdb"), tables(tmp_path / "stopped.duckdb"))
    # a scan that keeps nothing has no sample, and says so
    run_scan(corpus, bert, tmp_path / "none.duckdb", ScanSettings(max_docs=10, max_tokens=MAX_TOKENS, qk_points=0))
    with store.ScanReader(tmp_path / "none.duckdb") as reader:
        assert not qk_sample.has_sample(reader.connection)


def test_a_projection_made_on_a_page_is_kept_and_read_back(bert, tmp_path):
    path = tmp_path / "kept.duckdb"
    run_scan(small_corpus(), bert, path, ScanSettings(max_docs=10, max_tokens=MAX_TOKENS, qk_points=40))
    with store.ScanReader(path) as reader:
        points = qk_sample.head_points(reader.connection, 1, 2, values=True)
        assert qk_sample.stored_projection(reader.connection, 1, 2, "PCA", 3, 0, True) is None
    assert points.values is not None and points.values.shape == points.keys.shape
    coordinates = qk_geometry.project(points, "PCA", 3, with_values=True)
    assert coordinates.shape == (len(points.queries) + 2 * len(points.keys), 3)
    trusted = qk_geometry.trust(points, coordinates)
    with store.ScanReader(path):  # a reader holds the file: the page shows the projection without keeping it
        assert not qk_sample.save_projection(path, 1, 2, "PCA", 3, 0, True, coordinates, trusted, 0.01, attempts=2)
    assert qk_sample.save_projection(path, 1, 2, "PCA", 3, 0, True, coordinates, trusted, 0.01)
    with store.ScanReader(path) as reader:
        kept, kept_trust = qk_sample.stored_projection(reader.connection, 1, 2, "PCA", 3, 0, True)
    torch.testing.assert_close(kept, coordinates, rtol=1e-6, atol=1e-6)  # float32 kept
    assert kept_trust == trusted
