"""Long inputs through every view and tab of Explore heads, on decoders, encoder-decoders and RoBERTa's offset
positions: nothing reaches the page as a traceback, no figure exceeds 2 MB, and what the captions say holds."""

import json

import numpy as np
import pytest
import torch

from attnviz.bench.tiny import copy_tokenizer
from attnviz.models.capture import capture
from attnviz.models.loading import load_model_dir
from attnviz.models.replay_check import replay_difference
from attnviz.pagelogic.explore_heads.compare import compare_figures
from attnviz.pagelogic.explore_heads.export import shown_matrix
from attnviz.pagelogic.explore_heads.long_texts import sample_text
from attnviz.pagelogic.explore_heads.matrices import POOL_LIMIT, dense_matrix, head_matrix, weights_heatmap, zoom_matrix
from attnviz.pagelogic.explore_heads.options import SCALES, VIEWS, ViewOptions
from attnviz.pagelogic.explore_heads.views import LINES_TOKEN_LIMIT, view_figure
from attnviz.pagelogic.explore_heads.whatif import what_if
from tests.apptest_helpers import figures, open_page, plotly_array
from tests.tiny_models import TOKENIZER_FILES, make_tiny_checkpoint

TWO_MB = 2_000_000


@pytest.fixture(scope="module")
def long_llama(tmp_path_factory):
    """A tiny Llama that reads 4,096 tokens."""
    from transformers import AutoModel, LlamaConfig

    from tests.tiny_models import VOCAB

    folder = tmp_path_factory.mktemp("long") / "llama-4k"
    torch.manual_seed(0)
    AutoModel.from_config(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=4096)).save_pretrained(folder)
    copy_tokenizer(folder)
    return folder


def page_on(folder, tokens: int, **state):
    models = {"all-MiniLM-L6-v2 (bundled BERT)": "unused", "long": str(folder)}
    return open_page("app_pages/explore_heads.py", timeout=300, models=models, model="long",
                     explore_source="Python's documentation", explore_sample_tokens=tokens, **state)


def test_every_tab_of_a_2048_token_capture_says_what_it_can_do(long_llama):
    at = page_on(long_llama, 2048)
    assert not at.exception, [e.value for e in at.exception]
    for tab in ("What-if", "Compare two sentences", "Head statistics", "Export"):
        at.session_state["explore_tab"] = tab
        at.run()
        assert not at.exception, (tab, [e.value for e in at.exception])
    at.session_state["explore_tab"] = "What-if"
    at.run()
    assert any("needs every head's" in i.value for i in at.info)
    for view in ("rollout", "grid", "lines", "average"):
        at.segmented_control(key="view").set_value(view).run()
        assert not at.exception, (view, [e.value for e in at.exception])
    assert not any("This page reads the first" in i.value for i in at.info)  # no notice meant for other pages


def test_no_figure_exceeds_2_mb_at_1000_tokens(long_llama):
    bundle = load_model_dir(long_llama)
    result = capture(bundle, sample_text(), max_tokens=1000)
    record = result.records["self"]
    assert record.dense_ok
    for view in VIEWS:
        figure, _ = view_figure(result, ViewOptions(view=view))
        assert len(figure.to_json()) < TWO_MB, view
    figures_, _ = compare_figures(result, result, "self", 0, 1)
    assert all(len(f.to_json()) < TWO_MB for f in figures_)
    before, after = what_if(record, 0, None, unscaled=True)
    for weights in (before[1], after[1]):
        matrix = dense_matrix(weights, record.query_tokens, record.key_tokens, how="max")
        assert len(weights_heatmap(matrix, "t", "fixed").to_json()) < TWO_MB


def test_zoom_window_keeps_its_size_at_the_end_and_names_positions(long_llama):
    result = capture(load_model_dir(long_llama), sample_text(), max_tokens=1000)
    options = ViewOptions(zoom_query=999, zoom_key=990, zoom_size=128)
    matrix = shown_matrix(result, options, zoomed=True)
    assert matrix.values.shape == (128, 128) and matrix.window == (872, 872, 128, 128)
    assert matrix.row_labels[0].startswith("872 ·")


def test_log_scale_leaves_masked_cells_out(long_llama):
    result = capture(load_model_dir(long_llama), "one two three four five six seven eight")
    matrix = shown_matrix(result, ViewOptions(scale="log"))
    values = matrix.values.numpy()
    assert np.isnan(values[np.triu_indices_from(values, 1)]).all()  # the future: no weight, no logarithm
    assert np.nanmin(values) > -12
    figure = weights_heatmap(matrix, "t", "log")
    assert figure.data[0].zmin > -12


def test_a_to_b_in_a_causal_model_says_why_it_is_empty(long_llama):
    result = capture(load_model_dir(long_llama), "the first sentence here", "and a second one")
    figure, caption = view_figure(result, ViewOptions(block="A→B"))
    assert "Every weight here is 0" in caption


def test_roberta_reads_as_many_tokens_as_its_position_table_allows(tmp_path):
    bundle = load_model_dir(make_tiny_checkpoint("roberta", tmp_path / "roberta"))
    assert bundle.max_positions == 66 - 1  # 66 rows, positions start after the padding index 0
    result = capture(bundle, " ".join(["word"] * 200))
    assert len(result.tokens) == 65 and replay_difference(result.records["self"]) < 1e-5


def test_special_tokens_of_the_decoder_are_hidden_too(tmp_path):
    result = capture(load_model_dir(make_tiny_checkpoint("bart", tmp_path / "bart")), "a source text", "a target")
    assert result.decoder_special[0] and result.decoder_special[-1]
    options = ViewOptions(kind="cross", hide_special=True)
    matrix = shown_matrix(result, options)
    assert not any("[CLS]" in label or "[SEP]" in label for label in matrix.row_labels + matrix.col_labels)


def test_replay_bound_follows_the_dtype_and_catches_a_small_scale_error(tmp_path):
    from dataclasses import replace

    from transformers import AutoModel

    folder = make_tiny_checkpoint("llama", tmp_path / "llama")
    bundle = load_model_dir(folder)  # kept: the replay check runs the model's own kernel again
    record = capture(bundle, "the tolerance must be tight in fp32").records["self"]
    check = replay_difference(record)
    assert check.passed and check < 1e-5 and check.allowed < 1e-4
    wrong = replace(record, scales=[scale * 1.05 for scale in record.scales])  # a 5% error in the scale
    assert not replay_difference(wrong).passed
    half = tmp_path / "bf16"
    AutoModel.from_pretrained(folder, dtype=torch.bfloat16).save_pretrained(half)
    for name in TOKENIZER_FILES:
        if (folder / name).exists():
            (half / name).write_bytes((folder / name).read_bytes())
    bundle16 = load_model_dir(half)
    record16 = capture(bundle16, "bf16 rounds far more").records["self"]
    assert replay_difference(record16).passed  # no false alarm for bf16


def test_a_rule_mask_is_shared_and_not_kept_dense(tmp_path):
    from transformers import AutoModel

    from tests.test_capture_modifiers import _config

    folder = tmp_path / "mistral"
    AutoModel.from_config(_config("mistral")).save_pretrained(folder)
    copy_tokenizer(folder)
    bundle = load_model_dir(folder)
    record = capture(bundle, "a sliding window mask is a rule, not a tensor").records["self"]
    assert record.layer_masks[0] is record.layer_masks[1]  # checked once, shared by the layers
    assert all(kernel.attention_mask is None for kernel in record.kernels)  # rebuilt when the check runs
    assert replay_difference(record) < 1e-5


def test_falcon_with_alibi_matches_its_eager_weights_on_the_path_transformers_gives_it(tmp_path):
    """ALiBi inside Falcon: before transformers 5.25 in its own code (shown from eager weights), since then added
    to the mask it gives the attention interface (recorded and replayed, the bias included)."""
    from transformers import AutoModel, FalconConfig

    from attnviz.models import architectures

    folder = tmp_path / "falcon"
    torch.manual_seed(0)
    AutoModel.from_config(FalconConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                       alibi=True)).save_pretrained(folder)
    bundle = load_model_dir(folder)
    assert bundle.capture_path == architectures.path_of("falcon")
    record = capture(bundle, "ALiBi inside Falcon's own code").records["self"]
    reference = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    ids = bundle.tokenizer.ids(bundle.tokenizer.tokenize("ALiBi inside Falcon's own code"),
                               "ALiBi inside Falcon's own code")
    with torch.no_grad():
        expected = reference(input_ids=torch.tensor([ids]), output_attentions=True).attentions[0][0]
    torch.testing.assert_close(record.weights[0], expected)
    assert torch.all(record.weights[0].triu(diagonal=1) == 0)
    if bundle.capture_path == "interface":
        assert replay_difference(record) < 1e-5


def test_statistics_follow_the_stand_in_tokenizer(tmp_path):
    folder = make_tiny_checkpoint("gpt2", tmp_path / "bare", with_tokenizer=False)
    models = {"all-MiniLM-L6-v2 (bundled BERT)": "unused", "bare": str(folder)}
    at = open_page("app_pages/explore_heads.py", models=models, model="bare", explore_tab="Head statistics")
    words = next(d.value for d in at.dataframe if "entropy (nats)" in d.value.columns)
    at.radio(key="fallback_tokenizer").set_value("bytes").run()
    per_byte = next(d.value for d in at.dataframe if "entropy (nats)" in d.value.columns)
    assert not words["entropy (nats)"].equals(per_byte["entropy (nats)"])  # not a stale table
    assert json.dumps(list(figures(at)[0]["layout"]["title"]["text"]))  # a figure is drawn
    assert plotly_array is not None


def test_the_replay_check_finds_the_module_in_a_reloaded_model(tmp_path):
    folder = make_tiny_checkpoint("gpt2", tmp_path / "gpt2")
    record = capture(load_model_dir(folder), "the first copy is unloaded").records["self"]  # its model is gone
    with pytest.raises(RuntimeError, match="no longer loaded"):
        replay_difference(record)
    assert replay_difference(record, model=load_model_dir(folder).model) < 1e-5  # same weights, found by name


@pytest.fixture(scope="module")
def capture_600(long_llama):
    from attnviz.pagelogic.explore_heads.long_texts import sample_text

    return capture(load_model_dir(long_llama), sample_text(), max_tokens=600)


def test_pooled_cells_are_the_max_or_the_mean_of_their_block_of_weights(capture_600):
    record = capture_600.records["self"]
    weights = record.head_weights(1, 3)  # [600, 600]
    from attnviz.core import analysis

    edges = analysis.bin_edges(600, POOL_LIMIT)
    for how, reduce in (("max", torch.amax), ("mean", torch.mean)):
        matrix = head_matrix(capture_600, record, ViewOptions(layer=1, head=3, pooling=how), [3])
        assert matrix.pooled_from == (600, 600) and matrix.values.shape == (len(edges), len(edges))
        for row in (0, 100, len(edges) - 1):
            for col in (0, 57, len(edges) - 1):
                (r0, r1), (c0, c1) = edges[row], edges[col]
                block = weights[r0 : r1 + 1, c0 : c1 + 1]
                expected = float(reduce(block)) if how == "max" else float(block.mean())
                assert float(matrix.values[row, col]) == pytest.approx(expected, abs=1e-6), (how, row, col)


def test_the_zoom_window_holds_the_exact_weights(capture_600):
    record = capture_600.records["self"]
    options = ViewOptions(layer=0, head=1, zoom_query=300, zoom_key=250, zoom_size=64)
    matrix = zoom_matrix(capture_600, record, options, [1])
    expected = record.head_weights(0, 1)[300:364, 250:314]
    torch.testing.assert_close(matrix.values, expected, atol=1e-6, rtol=0)
    assert matrix.window == (300, 250, 64, 64)


def test_the_lines_view_draws_a_readable_window_and_says_so(capture_600):
    """600 tokens: a window of LINES_TOKEN_LIMIT queries (movable), and of the 600 keys the LINES_TOKEN_LIMIT these
    queries give the most weight, in text order; a figure whose labels stay readable (22 px a row)."""
    limit = LINES_TOKEN_LIMIT
    record = capture_600.records["self"]
    figure, caption = view_figure(capture_600, ViewOptions(view="lines", layer=0, head=0,
                                                                           lines_start=300))
    queries = next(trace for trace in figure.data if trace.name == "queries")
    keys = next(trace for trace in figure.data if trace.name == "keys")
    assert len(queries.y) == limit and len(keys.y) == limit
    assert f"Queries 300–{300 + limit - 1} of 600 are drawn" in caption
    assert [row[0] for row in queries.customdata] == list(range(300, 300 + limit))  # the window asked for
    # the keys: the most weight received from those queries, computed here from the record's own weights
    received = record.head_weights(0, 0)[300:300 + limit].sum(0)  # [600]
    expected = sorted(torch.topk(received, limit).indices.tolist())
    share = float(received[expected].sum() / received.sum())
    assert f"({share:.0%} of it)" in caption
    assert [int(label.split(" ")[0]) for label in keys.text] == expected  # labelled "position · token"
    assert figure.layout.height <= 70 + 22 * limit
    last, _ = view_figure(capture_600, ViewOptions(view="lines", lines_start=10_000))
    assert next(t for t in last.data if t.name == "queries").customdata[-1][0] == 599  # clamped to the end
    followed, caption = view_figure(capture_600, ViewOptions(view="lines", follow=[500]))
    assert "are drawn: move the window" not in caption


@pytest.mark.parametrize("scale", ["row", "log", "head"])
def test_the_title_says_which_colour_scale_is_on(capture_600, scale):
    figure, _ = view_figure(capture_600, ViewOptions(layer=1, head=0, scale=scale))
    assert f"colour: {SCALES[scale]}" in figure.layout.title.text
    plain, _ = view_figure(capture_600, ViewOptions(layer=1, head=0))
    assert "colour:" not in plain.layout.title.text
