"""Queries and keys in one picture: the normalisation leaves every weight as the model computes it (recomputed from
the normalised points, to 1e-6, on GPT-2, Llama with grouped-query attention, BERT and T5 with its position bias),
the projections and the trust measure behave as they say, and a head built to attend to the previous token is
trusted by its picture."""

import json
import math

import numpy as np
import pytest
import torch

from attnviz.core import qk_geometry
from attnviz.models.capture import capture
from attnviz.models.loading import load_model_dir
from attnviz.pagelogic import queries_keys
from tests.apptest_helpers import plotly_array
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
            points = queries_keys.head_points([record], layer, head)
            assert points.translated and points.shift is not None
            queries = points.queries.norm(dim=-1).mean()
            assert queries == pytest.approx(float(points.keys.norm(dim=-1).mean()), rel=1e-9)  # norms matched
            assert torch.allclose(points.queries.mean(0), points.keys.mean(0), atol=1e-9)  # centroids met
            expected = record.head_weights(layer, head).double()
            assert torch.allclose(queries_keys.weights_from_points(points, record, layer, head), expected, atol=1e-6)
            checked += 1
    assert checked == record.n_layers * record.n_heads
    if kind == "llama":  # grouped-query: two query heads read one K/V head, and their keys are that head's
        assert record.n_kv_heads < record.n_heads
        raw = queries_keys.raw_head(record, 0, 1, values=True)
        assert torch.equal(raw.keys, record.keys[0, record.kv_head(1)].float())
        assert torch.equal(raw.values, record.values[0, record.kv_head(1)].float())


def test_points_of_several_documents_share_one_shift_and_keep_each_documents_weights(bundles):
    records = [capture(bundles["gpt2"], text).records["self"] for text in (TEXT, "A second, shorter text.")]
    points = queries_keys.head_points(records, 1, 2)
    assert len(points.documents) == 2 and points.query_documents.count(1) == records[1].n_q
    for index, record in enumerate(records):
        expected = record.head_weights(1, 2).double()
        weights = queries_keys.weights_from_points(points, record, 1, 2, document=index)
        assert torch.allclose(weights, expected, atol=1e-6)


def test_a_soft_capped_head_is_scaled_but_not_translated():
    from types import SimpleNamespace

    assert not queries_keys.translation_is_exact(SimpleNamespace(softcaps=[50.0], sinks=[]), 0)
    assert not queries_keys.translation_is_exact(SimpleNamespace(softcaps=[], sinks=[torch.zeros(4)]), 0)
    assert queries_keys.translation_is_exact(SimpleNamespace(softcaps=[None], sinks=[None]), 0)
    q, k = torch.randn(5, 8), torch.randn(7, 8) + 3
    scaled_q, scaled_k, shift, scale = queries_keys.normalise(q, k, translate=False)
    assert shift is None and torch.allclose(scaled_q @ scaled_k.T, (q @ k.T).double(), atol=1e-9)


def _previous_token_points(n: int = 40, d: int = 16, seed: int = 0) -> queries_keys.HeadPoints:
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
    top_keys, top_weights = qk_geometry.strongest(weights, allowed)
    assert top_keys[1:, 0].tolist() == list(range(n - 1))  # built to attend to the previous token
    q, k, shift, scale = queries_keys.normalise(queries, keys)
    return queries_keys.HeadPoints(q, k, [str(i) for i in range(n)], [str(i) for i in range(n)], list(range(n)),
                            list(range(n)), [queries_keys.Document(range(n), range(n), allowed, top_keys, top_weights)],
                            shift, scale)


def test_a_previous_token_head_is_trusted_by_its_picture_and_a_shuffled_one_is_not():
    points = _previous_token_points()
    for method, k in (("PCA", 1), ("t-SNE", 5), ("UMAP", 5)):  # t-SNE, UMAP keep neighbourhoods, not places
        coordinates = queries_keys.project(points, method, seed=0)
        assert coordinates.shape == (80, 2)
        share = queries_keys.trust(points, coordinates)
        assert share[k] >= 0.9 and share[10] == 1.0, (method, share)
    # the same points with the queries' places shuffled: the picture no longer says where they attend
    coordinates = queries_keys.project(points, "PCA")
    shuffled = coordinates.clone()
    shuffled[:40] = coordinates[:40][torch.randperm(40, generator=torch.Generator().manual_seed(1))]
    assert queries_keys.trust(points, shuffled)[1] < 0.3
    assert queries_keys.project(points, "PCA", dims=3).shape == (80, 3)


def test_projections_refuse_what_they_cannot_do():
    points = _previous_token_points(n=6)
    with pytest.raises(ValueError, match="unknown projection"):
        queries_keys.project(points, "MDS")
    with pytest.raises(ValueError, match="2 or 3"):
        queries_keys.project(points, "PCA", dims=4)
    with pytest.raises(ValueError, match="no value vectors"):
        queries_keys.project(points, "PCA", with_values=True)


def _many_points(documents: int, n: int = 128, d: int = 16, seed: int = 0) -> queries_keys.HeadPoints:
    generator = torch.Generator().manual_seed(seed)
    vectors = []
    for name in range(documents):
        allowed = torch.ones(n, n, dtype=torch.bool).tril()
        weights = torch.softmax(torch.randn(n, n, generator=generator).masked_fill(~allowed, -1e9), -1)
        top_keys, top_weights = qk_geometry.strongest(weights, allowed)
        tokens = [f"␣word{i % 50}" for i in range(n)]
        vectors.append(qk_geometry.DocumentVectors(
            torch.randn(n, d, generator=generator), torch.randn(n, d, generator=generator), allowed, top_keys,
            top_weights, tokens, tokens, torch.randn(n, d, generator=generator), ["word"] * n, ["word"] * n,
            100 + name))
    return qk_geometry.pool(vectors)


def test_a_picture_of_tens_of_thousands_of_points_stays_under_2_mb_and_says_what_it_thinned():
    from attnviz.viz import queries_keys as figures

    small = _many_points(4)  # 512 queries, keys and values: every point, each hover with its token in context
    coordinates = queries_keys.project(small, "PCA", with_values=True)
    spec = json.loads(figures.head_scatter(small, coordinates, title="t", colour="token category").to_json())
    assert [len(plotly_array(trace["customdata"])) for trace in spec["data"][:3]] == [512, 512, 512]
    assert "<b>" in spec["data"][0]["text"][5] and "document %{customdata[2]}" in spec["data"][0]["hovertemplate"]
    key_130 = plotly_array(spec["data"][1]["customdata"])[130].tolist()
    assert key_130 == [3 * 130 + 1, 2, 101]  # key 130: position 2 of document 101
    drawn = figures.quantised(coordinates.numpy())
    width = float((coordinates.max(0).values - coordinates.min(0).values).max())
    # one scale for every axis: distances keep their proportions, to within one step of 65,534 across the picture
    rebuilt = (drawn.astype(float) + 32_767) / 65_534 * width + coordinates.min(0).values.numpy()
    assert np.abs(rebuilt - coordinates.numpy()).max() <= width / 65_534
    big = _many_points(160)  # 20,480 of each: 61,440 points
    coordinates = queries_keys.project(big, "PCA", with_values=True)
    figure = figures.head_scatter(big, coordinates, title="t", colour="token category", selected_query=20_000,
                                  found="word7")
    sent = figure.to_json()
    assert len(sent) < 2_000_000, len(sent)
    spec = json.loads(sent)
    assert len(plotly_array(spec["data"][0]["x"])) == 20_480 // 2
    assert "1 point in 2 drawn" in spec["layout"]["title"]["text"]
    assert "<b>" not in spec["data"][0]["text"][0]  # past 12,000 points, the token alone
    assert any(trace["name"] == "strongest 3 keys" for trace in spec["data"])


def test_token_categories():
    from attnviz.core.analysis import token_categories

    tokens = ["[CLS]", "the", "un", "##like", "##ly", "2024", ",", "cat", "##s", "[SEP]"]
    special = [True] + [False] * 8 + [True]
    assert token_categories(tokens, special) == ["special", "word", "word", "word piece", "word piece", "number",
                                                 "punctuation", "word", "word piece", "special"]
    gpt = ["The", "␣cat", "s", "␣sat", ".", "␣2", "␣un", "like", "ly"]
    assert token_categories(gpt, [False] * 9) == ["word", "word", "word piece", "word", "punctuation", "number",
                                                  "word", "word piece", "word piece"]


def _trust_by_brute_force(points: queries_keys.HeadPoints, coordinates: torch.Tensor, k: int) -> tuple[float, int]:
    """The trust share at ``k`` query by query: sort each query's allowed keys by distance in the picture and look
    for its strongest key among the first ``k``, over the queries with more than ``k`` allowed keys; and how many
    those are."""
    n_q, hits, counted = len(points.queries), 0, 0
    for document in points.documents:
        for local, query in enumerate(document.queries):
            allowed = document.allowed[local].nonzero().flatten().tolist()
            if len(allowed) <= k:
                continue
            counted += 1
            where = coordinates[query].numpy()
            distance = [np.linalg.norm(coordinates[n_q + document.keys.start + key].numpy() - where) for key in allowed]
            nearest = [allowed[i] for i in np.argsort(distance, kind="stable")[:k]]
            hits += int(document.top[local]) in nearest
    return (hits / counted if counted else math.nan), counted


def test_trust_leaves_out_a_causal_decoders_queries_that_cannot_miss(bundles):
    """A decoder's query i may attend to i + 1 keys: at k, queries 0..k-1 have their strongest key among their k
    nearest whatever the picture. In a picture that puts every query's strongest key (itself) farthest, no other
    query finds it: the share is 0 at every k, where counting the first k queries made it k / n."""
    record = capture(bundles["gpt2"], TEXT).records["self"]
    n = record.n_q
    assert record.is_causal() and n > 10
    points = queries_keys.head_points([record], 0, 0)
    counted = queries_keys.trust_counted(points)
    assert counted == {1: n - 1, 5: n - 5, 10: n - 10}
    # keys 0..n-1 in a row at x = 0..n-1, every query far to the left: its nearest keys are the first ones
    keys = torch.stack([torch.arange(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)], 1)
    queries = torch.tensor([[-100.0, 0.0]], dtype=torch.float64).repeat(n, 1)
    farthest = queries_keys.HeadPoints(points.queries, points.keys, points.query_tokens, points.key_tokens,
                                points.query_positions, points.key_positions,
                                [queries_keys.Document(range(n), range(n), points.documents[0].allowed,
                                                torch.arange(n)[:, None], torch.ones(n, 1))])
    assert queries_keys.trust(farthest, torch.cat([queries, keys])) == {1: 0.0, 5: 0.0, 10: 0.0}
    # the model's own strongest keys on a picture that says nothing (random places): the share of the counted
    # queries, as brute force finds it
    coordinates = torch.randn(2 * n, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    shares = queries_keys.trust(points, coordinates)
    for k in queries_keys.TRUST_KS:
        share, number = _trust_by_brute_force(points, coordinates, k)
        assert number == counted[k] and shares[k] == pytest.approx(share, abs=1e-12), k


def test_trust_of_a_k_that_no_query_exceeds_is_nan_and_said_so(bundles):
    record = capture(bundles["gpt2"], "Hi there").records["self"]  # a few tokens: no query has more than 5 keys
    n = record.n_q
    assert 2 <= n <= 5
    points = queries_keys.head_points([record], 0, 0)
    shares = queries_keys.trust(points, queries_keys.project(points, "PCA"))
    assert 0 <= shares[1] <= 1 and math.isnan(shares[5]) and math.isnan(shares[10])
    assert queries_keys.trust_counted(points) == {1: n - 1, 5: 0, 10: 0}
    said = queries_keys.trust_statement(queries_keys.trust_counted(points), n)
    assert f"of {n}: {n - 1} at k = 1, none at k = 5 (no share), none at k = 10 (no share)" in said
    assert "left out" in said


def test_an_encoders_queries_all_count_and_the_page_says_so(bundles):
    record = capture(bundles["bert"], TEXT).records["self"]
    points = queries_keys.head_points([record], 0, 0)
    assert queries_keys.trust_counted(points) == {k: record.n_q for k in queries_keys.TRUST_KS}  # each sees every key
    assert queries_keys.trust_statement(queries_keys.trust_counted(points), record.n_q) == \
        f"Each share is of all {record.n_q} queries: every one may attend to more than 10 keys."


def test_the_heads_caption_says_what_the_picture_shows():
    from attnviz.viz import queries_keys as figures

    assert "(a red circle)" in figures.head_caption("query or key", 2)
    for colour in figures.COLOURINGS[1:]:  # coloured by position, category or document: nothing is red
        caption = figures.head_caption(colour, 2)
        assert "red" not in caption and "Click a query (a circle; keys are diamonds)" in caption
    for colour in figures.COLOURINGS:  # a 3D picture passes on no click: it does not ask for one
        caption = figures.head_caption(colour, 3)
        assert not caption.startswith("Click") and "in 2D only" in caption
        assert ("red" in caption) == (colour == "query or key")
    # the figure draws what the captions say: queries round, keys diamonds, in 2D and 3D
    points = _previous_token_points(n=6)
    for dims in (2, 3):
        projected = queries_keys.project(points, "PCA", dims=dims)
        figure = figures.head_scatter(points, projected, title="t", colour="position")
        assert [trace.marker.symbol for trace in figure.data[:2]] == ["circle", "diamond"]
        assert not isinstance(figure.data[0].marker.color, str)  # a colour per position, not red
