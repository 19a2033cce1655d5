"""The Explore page's computations: views, filters, compare, what-if, exports, bertviz (without a browser)."""

import io
import json

import numpy as np
import pytest
import torch

from attnviz.core import analysis, masks
from attnviz.models.capture import capture
from attnviz.pagelogic.explore_heads.bertviz_view import bertviz_html
from attnviz.pagelogic.explore_heads.compare import compare_figures
from attnviz.pagelogic.explore_heads.export import capture_npz, figure_html, matrix_csv, matrix_json, shown_matrix
from attnviz.pagelogic.explore_heads.options import VIEWS, ViewOptions, filtered, positions
from attnviz.pagelogic.explore_heads.statistics import statistics_table
from attnviz.pagelogic.explore_heads.views import VIEW_BUILDERS, view_figure
from attnviz.pagelogic.explore_heads.whatif import MODEL_OWN_MASK, what_if, what_if_mask
from tests.apptest_helpers import plotly_array


@pytest.mark.parametrize("view", list(VIEWS))
def test_every_view_builds(pair, view):
    figure, caption = view_figure(pair, ViewOptions(view=view, layer=1, head=2))
    assert figure.layout.title.text and caption


def test_head_view_is_the_captured_matrix(pair):
    figure, _ = view_figure(pair, ViewOptions(view="head", layer=3, head=7))
    expected = pair.records["self"].weights[3, 7].numpy()
    np.testing.assert_allclose(np.asarray(figure.data[0].z, dtype=float), expected, atol=1e-7)


def test_hiding_special_tokens_and_renormalising(pair):
    options = ViewOptions(view="head", layer=0, head=0, hide_special=True, renormalise=True)
    record = pair.records["self"]
    kept = filtered(record.weights[0, 0], pair, record, options)
    assert not any("[CLS]" in label or "[SEP]" in label for label in kept.query_labels + kept.key_labels)
    torch.testing.assert_close(kept.weights.sum(-1), torch.ones(len(kept.query_labels)))
    options.renormalise = False
    raw = filtered(pair.records["self"].weights[0, 0], pair, pair.records["self"], options).weights
    assert torch.all(raw.sum(-1) < 1)


def test_sentence_blocks(pair):
    record = pair.records["self"]
    options = ViewOptions(block="A→B")
    kept = filtered(record.weights[0, 0], pair, record, options)
    assert all(pair.segments[i] == 0 for i in kept.query_positions)
    assert all(pair.segments[j] == 1 for j in kept.key_positions)
    assert "9 · it" in kept.key_labels and "1 · the" in kept.query_labels


def test_filters_that_leave_nothing_say_so(bert):
    single = capture(bert, "hello")
    with pytest.raises(ValueError, match="no tokens"):
        positions(single, single.records["self"], ViewOptions(block="A→B"))


def test_lines_view_follows_tokens(pair):
    figure, _ = view_figure(pair, ViewOptions(view="lines", layer=2, head=5, follow=[2]))
    line_traces = [t for t in figure.data if t.mode == "lines" and t.x and t.x[0] is not None]
    starts = {y for t in line_traces for y in t.y[0::3]}
    assert starts == {2}


def test_grid_thumbnails_pool_long_inputs(bert):
    long = capture(bert, " ".join(["word"] * 300))
    figure, _ = view_figure(long, ViewOptions(view="grid"))
    z = plotly_array(figure.to_plotly_json()["data"][0]["z"])
    assert z.shape == (6 * 25 - 1, 12 * 25 - 1)  # 24-cell thumbnails with 1-cell gaps


def test_statistics_table(pair):
    table = statistics_table(pair, "self")
    assert len(table) == 72 and set(table.columns) >= {"layer", "head", "label", "entropy (nats)", "previous token"}
    assert table["label"].isin(
        list(analysis.LABEL_RULES) + ["broad head", "mixed"]
    ).all()


def test_compare_lines_up_equal_length_texts(bert):
    a = capture(bert, "The cat sat on the mat.")
    b = capture(bert, "The dog sat on the mat.")
    figures, caption = compare_figures(a, b, "self", 2, 3)
    assert len(figures) == 3 and "B − A" in figures[2].layout.title.text
    difference = np.asarray(figures[2].data[0].z, dtype=float)
    expected = (b.records["self"].weights[2, 3] - a.records["self"].weights[2, 3]).numpy()
    np.testing.assert_allclose(difference, expected, atol=1e-7)
    assert "2 · cat / dog" in figures[2].layout.yaxis.ticktext
    c = capture(bert, "A much longer sentence than the first one was.")
    figures, caption = compare_figures(a, c, "self", 0, 0)
    assert len(figures) == 2 and "do not line up" in caption


def test_what_if_causal_mask_on_the_real_model(pair):
    record = pair.records["self"]
    n = record.weights.shape[-1]
    before, after = what_if(record, 2, masks.causal(n), unscaled=False)
    torch.testing.assert_close(before, record.weights[2])
    assert torch.all(after.triu(diagonal=1) == 0)
    torch.testing.assert_close(after.sum(-1), torch.ones(12, n))
    same, replayed = what_if(record, 2, None, unscaled=False)
    assert (same - replayed).abs().max() < 1e-5


def test_what_if_without_scaling_sharpens(pair):
    from attnviz.core.analysis import row_entropy

    record = pair.records["self"]
    before, after = what_if(record, 4, None, unscaled=True)
    assert row_entropy(after).mean() < row_entropy(before).mean()  # larger logits -> peakier softmax
    _, hotter = what_if(record, 4, None, unscaled=False, temperature=3.0)
    assert row_entropy(hotter).mean() > row_entropy(before).mean()


def test_what_if_masks():
    assert what_if_mask(MODEL_OWN_MASK, 4, 4) is None
    assert what_if_mask("sliding_window", 6, 6, left=1).sum() == 11
    assert what_if_mask("bigbird", 8, 8, block_size=2).shape == (8, 8)
    with pytest.raises(ValueError):
        what_if_mask("bigbird", 4, 6)
    with pytest.raises(ValueError, match="unknown what-if mask"):
        what_if_mask("lsh", 6, 6)


def test_every_view_has_one_builder():
    assert set(VIEW_BUILDERS) == set(VIEWS)


def test_exports(pair):
    data = np.load(io.BytesIO(capture_npz(pair)))
    assert data["self_weights"].shape == (6, 12, 14, 14)
    assert list(data["tokens"]) == pair.tokens
    shown = shown_matrix(pair, ViewOptions(layer=1, head=2))
    payload = json.loads(matrix_json(pair, ViewOptions(layer=1, head=2), shown))
    assert payload["query_labels"][0] == "0 · [CLS]" and len(payload["values"]) == 14
    torch.testing.assert_close(torch.tensor(payload["values"]), pair.records["self"].weights[1, 2])
    csv = matrix_csv(shown)
    assert csv.splitlines()[0].startswith(",0 · [CLS]")
    figure, _ = view_figure(pair, ViewOptions())
    html = figure_html(figure)
    assert "<script src=" not in html.replace('<script src="data:', "")  # nothing from a CDN: it opens offline
    assert "Plotly" in html and len(html) > 1_000_000


def test_exports_are_what_is_shown_after_filters(pair):
    options = ViewOptions(layer=0, head=3, hide_special=True)
    shown = shown_matrix(pair, options)
    payload = json.loads(matrix_json(pair, options, shown))
    assert "[CLS]" not in " ".join(payload["query_labels"]) and payload["filters"].startswith("special tokens hidden")
    np.testing.assert_allclose(np.array(payload["values"]).sum(-1), 1.0, atol=1e-6)  # renormalised, as shown


def test_bertviz_html_and_injection_is_inert(bert):
    hostile = capture(bert, "hello </script><script>alert(1)</script> & bye")
    html = bertviz_html(hostile, "self", "head view")
    assert "require" in html
    assert hostile.tokens[2] == "<"  # BERT's tokenizer keeps the angle brackets as tokens...
    assert '"<"' not in html and '">"' not in html  # ...which never reach bertviz's <script> as markup
    assert "\\u2039" in html  # they arrive as look-alike characters (JSON-escaped)


def test_the_replay_check_in_bf16_passes_the_real_replay_and_fails_a_wrong_scale():
    """The bound comes from bf16's rounding of each output (its weights, values and score sizes), not from a
    fraction of max|V|: 16 eps x max|V| (0.125 max|V|) let a 20% wrong scale pass on a real model."""
    from dataclasses import replace

    from attnviz.models.loading import load_model_dir
    from attnviz.models.replay_check import replay_difference
    from attnviz.models.shipped import default_model_dir

    bundle = load_model_dir(default_model_dir())  # a fresh copy, cast below: the shared one stays fp32
    bundle.model.to(torch.bfloat16)
    record = capture(bundle, "The cat sat on the mat because it was tired.").records["self"]
    assert record.values.dtype == torch.bfloat16
    check = replay_difference(record)
    assert check.passed and check > 0, (float(check), check.share)  # bf16 rounds, and within its bound
    old_tolerance = 16 * torch.finfo(torch.bfloat16).eps * max(float(record.values[i].abs().max())
                                                                 for i in range(record.n_layers))
    for factor in (0.8, 1.2):
        wrong = replay_difference(replace(record, scales=[scale * factor for scale in record.scales]))
        assert not wrong.passed, (factor, float(wrong), wrong.share)
        assert wrong > check  # a real error, larger than rounding's
        assert wrong < old_tolerance  # which the old tolerance let pass
