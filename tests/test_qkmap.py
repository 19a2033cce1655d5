"""Queries and keys in one picture: the normalisation leaves every weight as the model computes it (recomputed from
the normalised points, to 1e-6, on GPT-2, Llama with grouped-query attention, BERT and T5 with its position bias),
the projections and the trust measure behave as they say, and a head built to attend to the previous token is
trusted by its picture."""

import math

import pytest
import torch

from attnviz.models.capture import capture
from attnviz.models.loading import load_model_dir
from attnviz.pagelogic import qkmap
from tests.tiny_models import make_tiny_checkpoint

TEXT = "The cat sat on the mat because it was tired, and the dog slept."


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("qk")
    return {kind: load_model_dir(make_tiny_checkpoint(kind, root / kind)) for kind in ("gpt2", "llama", "bert", "t5")}


@pytest.mark.parametrize("kind", ["gpt2", "llama", "bert", "t5"])
def test_weights_recomputed_from_the_normalised_points_equal_the_models(bundles, kind):
    captured = capture(bundles[kind], TEXT)
    record_kind = "encoder" if kind == "t5" else "self"
    record = captured.records[record_kind]
    checked = 0
    for layer in range(record.n_layers):
        for head in range(record.n_heads):
            points = qkmap.head_points([record], layer, head)
            assert points.translated and points.shift is not None
            queries = points.queries.norm(dim=-1).mean()
            assert queries == pytest.approx(float(points.keys.norm(dim=-1).mean()), rel=1e-9)  # norms matched
            assert torch.allclose(points.queries.mean(0), points.keys.mean(0), atol=1e-9)  # centroids met
            expected = record.head_weights(layer, head).double()
            assert torch.allclose(qkmap.weights_from_points(points, record, layer, head), expected, atol=1e-6)
            checked += 1
    assert checked == record.n_layers * record.n_heads
    if kind == "llama":  # grouped-query: two query heads read one K/V head, and their keys are that head's
        assert record.n_kv_heads < record.n_heads
        raw = qkmap.raw_head(record, 0, 1)[1]
        assert torch.equal(raw, record.keys[0, record.kv_head(1)].float())


def test_points_of_several_documents_share_one_shift_and_keep_each_documents_weights(bundles):
    records = [capture(bundles["gpt2"], text).records["self"] for text in (TEXT, "A second, shorter text.")]
    points = qkmap.head_points(records, 1, 2)
    assert len(points.documents) == 2 and points.query_documents.count(1) == records[1].n_q
    for index, record in enumerate(records):
        expected = record.head_weights(1, 2).double()
        assert torch.allclose(qkmap.weights_from_points(points, record, 1, 2, document=index), expected, atol=1e-6)


def test_a_soft_capped_head_is_scaled_but_not_translated():
    from types import SimpleNamespace

    assert not qkmap.translation_is_exact(SimpleNamespace(softcaps=[50.0], sinks=[]), 0)
    assert not qkmap.translation_is_exact(SimpleNamespace(softcaps=[], sinks=[torch.zeros(4)]), 0)
    assert qkmap.translation_is_exact(SimpleNamespace(softcaps=[None], sinks=[None]), 0)
    q, k = torch.randn(5, 8), torch.randn(7, 8) + 3
    scaled_q, scaled_k, shift, scale = qkmap.normalise(q, k, translate=False)
    assert shift is None and torch.allclose(scaled_q @ scaled_k.T, (q @ k.T).double(), atol=1e-9)


def _previous_token_points(n: int = 40, d: int = 16, seed: int = 0) -> qkmap.HeadPoints:
    """Keys on a circle, each query at its previous key's angle (further out): the top key of query i is key i - 1;
    the circle's plane rotated into d dimensions at random."""
    generator = torch.Generator().manual_seed(seed)
    rotation, _ = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=torch.float64))
    angles = torch.arange(n, dtype=torch.float64) * 2 * math.pi / n
    circle = torch.stack([angles.cos(), angles.sin()], -1)  # [n, 2]
    keys = torch.cat([circle, torch.zeros(n, d - 2, dtype=torch.float64)], 1) @ rotation
    queries = 3.0 * torch.cat([circle.roll(1, 0), torch.zeros(n, d - 2, dtype=torch.float64)], 1) @ rotation
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    weights = torch.softmax((queries @ keys.T).masked_fill(~allowed, float("-inf")), -1)
    top = weights.argmax(-1)
    assert top[1:].tolist() == list(range(n - 1))  # built to attend to the previous token
    q, k, shift, scale = qkmap.normalise(queries, keys)
    return qkmap.HeadPoints(q, k, [str(i) for i in range(n)], [str(i) for i in range(n)], list(range(n)),
                            list(range(n)), [qkmap.Document(range(n), range(n), allowed, top, weights)], shift, scale)


def test_a_previous_token_head_is_trusted_by_its_picture_and_a_shuffled_one_is_not():
    points = _previous_token_points()
    for method, k in (("PCA", 1), ("t-SNE", 5)):  # t-SNE keeps neighbourhoods, not exact places
        coordinates = qkmap.project(points, method, seed=0)
        assert coordinates.shape == (80, 2)
        share = qkmap.trust(points, coordinates)
        assert share[k] >= 0.9 and share[10] == 1.0, (method, share)
    # the same points with the queries' places shuffled: the picture no longer says where they attend
    coordinates = qkmap.project(points, "PCA")
    shuffled = coordinates.clone()
    shuffled[:40] = coordinates[:40][torch.randperm(40, generator=torch.Generator().manual_seed(1))]
    assert qkmap.trust(points, shuffled)[1] < 0.3
    assert qkmap.project(points, "PCA", dims=3).shape == (80, 3)


def test_projections_refuse_what_they_cannot_do():
    points = _previous_token_points(n=6)
    with pytest.raises(ValueError, match="unknown projection"):
        qkmap.project(points, "MDS")
    with pytest.raises(ValueError, match="2 or 3"):
        qkmap.project(points, "PCA", dims=4)
    try:
        import umap  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="umap-learn"):
            qkmap.project(points, "UMAP")
