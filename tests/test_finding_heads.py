"""Finding heads and reading cells: hovers with ranks, numbers only where they fit, sentence boundaries, the
grid's scales, labels and filters, the statistic map, top-k lines, rollout through a chosen layer."""

import json

import numpy as np
import pytest
import torch

from attnviz.core import analysis
from attnviz.models.capture import capture
from attnviz.pagelogic.explore_heads.compare import compare_figures
from attnviz.pagelogic.explore_heads.grid import BADGES, THUMBNAIL, grid_thumbnails
from attnviz.pagelogic.explore_heads.matrices import dense_matrix, with_segments
from attnviz.pagelogic.explore_heads.options import ViewOptions, positions
from attnviz.pagelogic.explore_heads.qk import QK_BARS, query_key, query_key_figures
from attnviz.pagelogic.explore_heads.statistics import statistic_figure, statistics_table
from attnviz.pagelogic.explore_heads.views import view_figure
from attnviz.viz import style
from attnviz.viz.heads import attention_lines, head_grid, statistic_heatmap
from attnviz.viz.matrix import (
    CELL_TEXT_SIZE,
    FULL_WIDTH,
    HALF_WIDTH,
    SIGNED,
    heatmap_row,
    matrix_heatmap,
    ranks_in_rows,
    wrap_title,
)
from tests.tiny_models import bundled_bert


def test_ranks_in_rows_match_an_independent_ranking():
    values = np.random.default_rng(0).random((5, 9))
    values[2, 3] = np.nan  # a masked cell ranks last
    ranks = ranks_in_rows(values)
    for row in range(5):
        finite = [(v, j) for j, v in enumerate(values[row]) if not np.isnan(v)]
        expected = {j: rank + 1 for rank, (_, j) in enumerate(sorted(finite, reverse=True))}
        assert all(ranks[row, j] == r for j, r in expected.items())
    assert ranks[2, 3] == 9 and sorted(ranks[0].tolist()) == list(range(1, 10))


def test_weights_hover_names_both_tokens_the_weight_and_its_rank():
    labels = style.token_labels(["the", "cat", "sat"])
    figure = matrix_heatmap(np.array([[0.2, 0.5, 0.3]] * 3), labels, labels, title="t")
    trace = figure.data[0]
    assert "query %{y}" in trace.hovertemplate and "key %{x}" in trace.hovertemplate
    assert "weight %{z:.3g}" in trace.hovertemplate and "rank %{customdata} of 3" in trace.hovertemplate
    assert trace.customdata[0].tolist() == [3, 1, 2]
    assert "rank" not in matrix_heatmap(np.eye(3), labels, labels, title="t", scale=SIGNED).data[0].hovertemplate


def test_numbers_are_printed_at_a_fixed_size_only_where_they_fit():
    labels = style.token_labels([f"w{i}" for i in range(12)])
    values = np.random.default_rng(1).random((12, 12))
    wide = matrix_heatmap(values, labels, labels, title="t", width=FULL_WIDTH)
    assert wide.data[0].text is not None and wide.data[0].textfont.size == CELL_TEXT_SIZE
    narrow = matrix_heatmap(values, labels, labels, title="t", width=HALF_WIDTH)  # 24 px cells: "0.123" needs 42
    assert narrow.data[0].text is None
    tiny = matrix_heatmap(values[:2, :2], labels[:2], labels[:2], title="t", width=HALF_WIDTH)
    assert tiny.data[0].text is not None


def test_ticks_are_thinned_by_width_as_well_as_height():
    labels = style.token_labels([f"w{i}" for i in range(60)])
    values = np.random.default_rng(2).random((60, 60))
    full = matrix_heatmap(values, labels, labels, title="t", width=FULL_WIDTH, height=900)
    half = matrix_heatmap(values, labels, labels, title="t", width=HALF_WIDTH, height=900)
    assert len(half.layout.xaxis.tickvals) < len(full.layout.xaxis.tickvals) <= 48
    assert len(half.layout.xaxis.tickvals) * 18 <= HALF_WIDTH  # at least 18 px between x labels


def test_sentence_pairs_colour_the_labels_and_mark_where_b_starts(pair):
    figure, _ = view_figure(pair, ViewOptions(view="head", layer=0, head=0))
    start_of_b = pair.segments.index(1)
    lines = [shape for shape in figure.layout.shapes if shape.type == "line"]
    assert {shape.x0 for shape in lines if shape.x0 == shape.x1} == {start_of_b - 0.5}
    assert {shape.y0 for shape in lines if shape.y0 == shape.y1} == {start_of_b - 0.5}
    ticks = list(figure.layout.xaxis.ticktext)
    assert all("#c2410c" in tick for tick in ticks[start_of_b:]) and "#c2410c" not in ticks[0]
    single = capture(pair_model := bundled_bert(), "The cat sat on the mat.")
    assert pair_model is not None
    figure, _ = view_figure(single, ViewOptions(view="head"))
    assert not figure.layout.shapes and "span" not in "".join(figure.layout.xaxis.ticktext)


def test_the_head_scale_stretches_the_head_to_its_maximum(pair):
    fixed, _ = view_figure(pair, ViewOptions(view="head", layer=2, head=3))
    head, _ = view_figure(pair, ViewOptions(view="head", layer=2, head=3, scale="head"))
    z_fixed, z_head = np.asarray(fixed.data[0].z, dtype=float), np.asarray(head.data[0].z, dtype=float)
    np.testing.assert_allclose(z_head, z_fixed / z_fixed.max(), rtol=1e-6)
    assert "scaled to this head's maximum" in head.layout.title.text
    assert "weight / head max" in head.data[0].hovertemplate


def test_grid_offers_zero_to_one_or_each_heads_maximum_and_says_which(pair):
    per_head, caption = view_figure(pair, ViewOptions(view="grid"))
    fixed, fixed_caption = view_figure(pair, ViewOptions(view="grid", grid_scale="fixed"))
    assert "each head scaled to its maximum" in per_head.layout.title.text and "own maximum" in caption
    assert "weights on 0–1" in fixed.layout.title.text and "0–1 scale" in fixed_caption
    assert np.nanmax(np.asarray(fixed.data[0].z, dtype=float)) < np.nanmax(np.asarray(per_head.data[0].z,
                                                                                       dtype=float))
    weights = torch.softmax(torch.randn(2, 2, 8, 8), dim=-1)
    raw = head_grid(weights, title="t", thumbnail=8, per_head_max=False)
    np.testing.assert_allclose(np.asarray(raw.data[0].z, dtype=float)[:8, :8], weights[0, 0].numpy(), rtol=1e-5)


def test_grid_hover_and_badges_name_each_heads_label_entropy_and_top_key(pair):
    figure, _ = view_figure(pair, ViewOptions(view="grid"))
    table = statistics_table(pair, "self")
    hover = figure.data[1].hovertext
    row = table[(table["layer"] == 0) & (table["head"] == 2)].iloc[0]
    text = hover[0 * 12 + 2]
    assert row["label"] in text and f"entropy {row['entropy (nats)']:.3g} nats" in text and row["top key"] in text
    badges = figure.data[2].text
    assert badges[2] == BADGES.get(row["label"], "")
    assert sum(bool(b) for b in badges) >= 1  # some head of the bundled BERT carries a label


def test_grid_honours_the_special_token_filter(pair):
    record = pair.records["self"]
    options = ViewOptions(view="grid", hide_special=True, renormalise=True)
    query_positions, key_positions = positions(pair, record, options)
    thumbnails = grid_thumbnails(record, query_positions=query_positions, key_positions=key_positions,
                                         renormalise=True)
    expected = analysis.keep_tokens(record.weights[1, 4], query_positions, key_positions, True)
    size_q, size_k = min(len(query_positions), THUMBNAIL), min(len(key_positions), THUMBNAIL)
    pooled = torch.nn.functional.adaptive_avg_pool2d(expected[None].float(), (size_q, size_k))[0]
    torch.testing.assert_close(thumbnails[1, 4], pooled, atol=1e-6, rtol=1e-5)
    figure, _ = view_figure(pair, options)
    assert "special tokens hidden" in figure.layout.title.text


def test_top_key_is_the_key_with_the_largest_mean_weight(pair):
    record = pair.records["self"]
    table = statistics_table(pair, "self")
    column_means = record.weights[3, 5].double().mean(0)
    row = table[(table["layer"] == 3) & (table["head"] == 5)].iloc[0]
    top = int(column_means.argmax())
    assert row["top key"] == style.token_label(top, pair.tokens[top])
    assert row["top key share"] == pytest.approx(float(column_means[top]), abs=1e-9)


def test_statistic_map_is_every_heads_value_and_clicks_name_the_head(pair):
    table = statistics_table(pair, "self")
    figure, caption = statistic_figure(table, "previous token", sorted(table["label"].unique()), (0, 2))
    z = np.asarray(figure.data[0].z, dtype=float)
    for _, row in table.iterrows():
        assert z[int(row["layer"]), int(row["head"])] == pytest.approx(row["previous token"])
    points = figure.data[1]
    assert [list(c) for c in points.customdata][:3] == [[0, 0], [0, 1], [0, 2]]
    assert "click to open" in points.hovertext[2] and table.iloc[2]["label"] in points.hovertext[2]
    only = statistic_figure(table, "self", ["previous-token head"], (0, 2))[0]
    kept = ~np.isnan(np.asarray(only.data[0].z, dtype=float))
    assert kept.sum() == (table["label"] == "previous-token head").sum()
    with pytest.raises(ValueError, match="unknown statistic"):
        statistic_figure(table, "nonsense", [], (0, 0))
    assert statistic_heatmap(np.zeros((2, 3)), title="t", statistic="s").data[0].z.shape == (2, 3)


def test_top_k_lines_keep_each_querys_strongest_keys(pair):
    record = pair.records["self"]
    figure = attention_lines(record.weights[0], pair.tokens, pair.tokens, [2], title="t", top_k=2, min_weight=0.0)
    meta = figure.layout.meta
    per_query = {}
    for query, key, weight in meta["lines"]:
        per_query.setdefault(query, []).append((weight, key))
    weights = record.weights[0, 2]
    for query, lines in per_query.items():
        assert len(lines) == 2
        assert {key for _, key in lines} == set(weights[query].topk(2).indices.tolist())
    assert figure.data[meta["highlight"]].name == "highlight"
    assert all(figure.data[i].mode == "lines" for i in meta["line_traces"])
    json.loads(figure.to_json())  # the meta travels with the figure


def test_rollout_runs_through_the_chosen_layer_by_default_the_last(pair):
    record = pair.records["self"]
    last, _ = view_figure(pair, ViewOptions(view="rollout"))
    first, _ = view_figure(pair, ViewOptions(view="rollout", rollout_layer=0))
    rolled = analysis.attention_rollout(record.weights)
    np.testing.assert_allclose(np.asarray(last.data[0].z, dtype=float), rolled[-1].numpy(), atol=1e-6)
    np.testing.assert_allclose(np.asarray(first.data[0].z, dtype=float), rolled[0].numpy(), atol=1e-6)
    assert f"layers 0..{record.n_layers - 1}" in last.layout.title.text
    with pytest.raises(ValueError, match="layers 0 to"):
        view_figure(pair, ViewOptions(view="rollout", rollout_layer=99))


def test_narrow_panel_titles_wrap_instead_of_overlapping():
    assert wrap_title("head 11: m = 0.00391", 10) == "head 11: m<br>= 0.00391"
    assert wrap_title("a<br>bb cc", 4) == "a<br>bb<br>cc"
    figure = heatmap_row([np.eye(3)] * 3, ["head 0: m = 0.5", "head 6: m = 0.0625", "head 11: m = 0.00391"],
                         ["a", "b", "c"], ["a", "b", "c"], title="t", width=HALF_WIDTH)
    titles = [annotation.text for annotation in figure.layout.annotations]
    assert all(max(len(line) for line in t.split("<br>")) * 7 <= (HALF_WIDTH - 120) // 3 + 7 for t in titles)


def test_the_query_key_view_does_the_arithmetic_of_one_score(pair):
    record = pair.records["self"]
    anatomy = query_key(record, 2, 5, 3, 1)
    q, k = record.queries[2, 5, 3].float(), record.keys[2, 5, 1].float()
    assert anatomy.dot == pytest.approx(float(q @ k), rel=1e-6)
    assert anatomy.scale == pytest.approx(1 / 32 ** 0.5)  # BERT: 1/sqrt(d_head), d_head = 384 / 12
    assert anatomy.score == pytest.approx(anatomy.dot * anatomy.scale, rel=1e-6)
    torch.testing.assert_close(anatomy.weights, record.weights[2, 5, 3], atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.softmax(anatomy.scores, -1), anatomy.weights, atol=1e-6, rtol=0)
    vectors, row, caption = query_key_figures(anatomy, record, 2, 5, 3, 1)
    assert np.asarray(vectors.data[0].z, dtype=float).shape == (3, 32)
    assert f"{anatomy.dot:.4g}" in caption and "rank" in caption
    assert row.data[0].marker.color[1] == "#ff7f0e"
    with pytest.raises(ValueError, match="outside"):
        query_key(record, 0, 0, 99, 0)


def test_the_query_key_view_includes_t5s_position_bias(tmp_path):
    from attnviz.models.loading import load_model_dir
    from tests.tiny_models import make_tiny_checkpoint

    bundle = load_model_dir(make_tiny_checkpoint("t5", tmp_path / "t5"))
    record = capture(bundle, "the cat sat on the mat").records["encoder"]
    anatomy = query_key(record, 0, 1, 2, 4)
    bias = record.bias_rows(0, 2, 3)[1, 0, 4]
    assert anatomy.score == pytest.approx(anatomy.dot * anatomy.scale + float(bias), rel=1e-5, abs=1e-6)
    _, _, caption = query_key_figures(anatomy, record, 0, 1, 2, 4)
    assert "position bias" in caption


def test_the_query_key_row_counts_and_ranks_only_the_keys_the_query_may_see(tmp_path):
    """A causal model on 80 tokens: query 2 may see 3 keys. The row shows those 3 (not the 60 largest of 80, most
    of them masked zeros), its rank counts among them, and a hidden key is said to be hidden; a late query's row
    still shows its strongest visible keys only."""
    from transformers import GPT2Config

    from attnviz.bench.tiny import VOCAB
    from attnviz.models.loading import load_model_dir
    from tests.tiny_models import make_tiny_checkpoint

    config = GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=32, n_layer=1, n_head=2)
    bundle = load_model_dir(make_tiny_checkpoint("gpt2", tmp_path / "gpt2", config=config))
    record = capture(bundle, " ".join(["word"] * 79)).records["self"]
    assert record.n_k > QK_BARS and record.is_causal()
    anatomy = query_key(record, 0, 0, 2, 1)
    assert anatomy.visible.tolist() == [True] * 3 + [False] * (record.n_k - 3)
    _, row, caption = query_key_figures(anatomy, record, 0, 0, 2, 1)
    assert len(row.data[0].x) == 3 and f"the 3 keys it may see (of {record.n_k})" in row.layout.title.text
    weights = record.head_weights(0, 0, 2, 3)[0, :3]
    assert f"rank {int((weights > weights[1]).sum()) + 1} of the 3 keys it may see" in caption
    _, _, hidden = query_key_figures(query_key(record, 0, 0, 2, 40), record, 0, 0, 2, 40)
    assert "mask hides this key" in hidden and "rank" not in hidden
    late = query_key(record, 0, 0, record.n_q - 1, 0)
    _, row, _ = query_key_figures(late, record, 0, 0, record.n_q - 1, 0)
    assert QK_BARS - 1 <= len(row.data[0].x) <= QK_BARS and f"of the {record.n_k} it may see" in row.layout.title.text


def test_compare_and_what_if_heatmaps_mark_sentence_b_too(pair):
    figures, _ = compare_figures(pair, pair, "self", 0, 0)
    start_of_b = pair.segments.index(1)
    for figure in figures[:2]:
        assert {s.x0 for s in figure.layout.shapes if s.type == "line" and s.x0 == s.x1} == {start_of_b - 0.5}
    record = pair.records["self"]
    matrix = with_segments(dense_matrix(record.weights[0, 0], record.query_tokens,
                                                        record.key_tokens), pair, record,
                                   list(range(record.n_q)), list(range(record.n_k)))
    assert matrix.row_segments == pair.segments == matrix.col_segments
