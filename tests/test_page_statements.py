"""Statements the pages make, checked on the architectures a user can load (not only the bundled BERT) and at
settings other than the defaults."""

import numpy as np
import pytest
import torch

from attnviz import kvcache, mask_patterns, masks, positional
from attnviz.models.capture import capture
from attnviz.models.loading import load_model_dir
from attnviz.pagelogic import explore_heads, heads_kv_cache
from attnviz.pagelogic import masks as masks_page
from attnviz.pagelogic.positional import alibi_on_real_head
from attnviz.pagelogic.scaling import mean_largest_weight, real_head_scalings
from attnviz.viz.heads import head_sharing
from tests.apptest_helpers import figure_titled, figures, open_page, plotly_array
from tests.tiny_models import make_tiny_checkpoint

TEXT = "The cat sat on the mat because it was tired."


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("statements")
    folders = {kind: make_tiny_checkpoint(kind, root / kind) for kind in ("gpt2", "bart", "t5")}
    return {kind: load_model_dir(folder) for kind, folder in folders.items()} | {"folders": folders}


def test_a_pattern_applied_to_a_decoder_head_never_reaches_the_future(tiny):
    record = capture(tiny["gpt2"], TEXT).records["self"]
    n = record.weights.shape[-1]
    for key in ("full", "sliding_bidirectional", "bigbird"):
        before, cut, after, lost = masks_page.apply_to_head(record, 0, 1, mask_patterns.build(key, n).mask)
        future = ~masks.causal(n)
        assert float(after[future].abs().max()) == 0.0, key  # the model's causal mask stays
        torch.testing.assert_close(after.sum(-1), torch.ones(n), atol=1e-5, rtol=0)
    _, _, after_full, lost_full = masks_page.apply_to_head(record, 0, 1, masks.full(n))
    torch.testing.assert_close(after_full, record.weights[0, 1], atol=1e-5, rtol=0)  # full changes nothing
    assert lost_full == pytest.approx(0.0, abs=1e-6)


def test_what_if_says_when_a_rule_moves_weight_onto_keys_the_model_blocked(tiny):
    record = capture(tiny["gpt2"], TEXT).records["self"]
    n = record.weights.shape[-1]
    full = masks.full(n)
    before, after = explore_heads.what_if(record, 0, full, unscaled=False)
    effect = explore_heads.what_if_effect(record, 0, before, after, full)
    future_share = float((after * ~masks.causal(n)).sum(-1).mean())
    assert effect.gained_on_blocked == pytest.approx(future_share) and future_share > 0.1
    caption = explore_heads.what_if_caption(effect, unscaled=False)
    assert "not something the model ever did" in caption and "renormalised" not in caption
    causal = masks.causal(n)
    before, after = explore_heads.what_if(record, 0, causal, unscaled=False)
    same = explore_heads.what_if_effect(record, 0, before, after, causal)
    assert same.gained_on_blocked == 0 and explore_heads.what_if_caption(same, False).startswith("The same rule")


def test_t5_heads_are_redrawn_with_their_position_bias_and_without_a_scale(tiny):
    result = capture(tiny["t5"], TEXT)
    for kind in ("encoder", "decoder"):
        record = result.records[kind]
        assert record.bias is not None and record.scales[0] == 1.0
        model, unscaled, _ = real_head_scalings(record, 1, 2, temperature=1.0).values()
        torch.testing.assert_close(model.float(), record.weights[1, 2], atol=1e-5, rtol=0)
        torch.testing.assert_close(model, unscaled)  # T5 has no 1/sqrt(d_k) to remove
        n = record.weights.shape[-1]
        before, _ = alibi_on_real_head(record, 1, 2, torch.zeros(n, n, dtype=torch.float64))
        torch.testing.assert_close(before.float(), record.weights[1, 2], atol=1e-5, rtol=0)
        assert isinstance(record.bias_rows(1)[2], torch.Tensor)
    before, after = explore_heads.what_if(result.records["encoder"], 0, None, unscaled=True)
    effect = explore_heads.what_if_effect(result.records["encoder"], 0, before, after, None)
    assert effect.scale_is_one and effect.largest_change < 1e-6
    assert "changes nothing" in explore_heads.what_if_caption(effect, unscaled=True)


def test_causality_is_read_from_the_attention_shown(tiny):
    bart = capture(tiny["bart"], TEXT)
    assert not bart.records["encoder"].is_causal() and bart.records["decoder"].is_causal()
    assert not bart.records["cross"].is_causal()
    assert capture(tiny["gpt2"], TEXT).records["self"].is_causal()


def test_the_alibi_tab_uses_a_bidirectional_bias_on_an_encoder_of_an_encoder_decoder(tiny):
    at = open_page("pages/positional.py", timeout=240, models={"bart": str(tiny["folders"]["bart"])}, model="bart",
                   pos_tab="ALiBi")
    assert not at.exception, [e.value for e in at.exception]
    bias = figure_titled(at, "Bias −m·distance")
    first = plotly_array(bias["data"][0]["z"])
    assert np.allclose(first, first.T)  # |i - j|: both ways
    assert any("bidirectional" in c.value for c in at.caption)


def test_largest_weight_ignores_rows_that_see_one_key():
    weights = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    assert mean_largest_weight(weights, masks.causal(2)) == 0.5  # the one-hot first row of a causal head is left out


def test_kv_cache_of_a_checkpoint_uses_its_own_head_dim_and_the_decoder(tiny):
    t5 = kvcache.config_of_bundle(tiny["t5"])
    assert t5.head_dim == 8 and t5.architecture == "encoder-decoder"  # T5's d_kv, not d_model / heads (32 / 4)
    bart = kvcache.config_of_bundle(tiny["bart"])
    assert bart.n_layers == 2 and bart.architecture == "encoder-decoder"
    assert kvcache.cross_attention_cache_bytes(bart, 100, 1, "fp16") == 2 * 2 * 4 * 8 * 100 * 2
    assert kvcache.config_of_bundle(tiny["gpt2"]).architecture == "decoder"


def test_kv_page_says_an_encoder_keeps_no_cache():
    at = open_page("pages/heads_kv_cache.py")
    at.selectbox(key="kv_preset").set_value("Current checkpoint: all-MiniLM-L6-v2 (bundled BERT)").run()
    assert any("keeps no KV cache" in i.value for i in at.info)


def test_head_sharing_draws_the_real_groups_of_the_first_heads():
    figure = head_sharing(12, 4, title="GQA", max_heads=8)
    queries, kv = figure.data[-2], figure.data[-1]
    assert list(queries.hovertext)[:4] == [f"query head {h} reads K/V head {h // 3}" for h in range(4)]
    assert list(kv.hovertext) == [f"K/V head {g}: 3 query heads" for g in range(3)]


def test_dilated_layers_reach_only_multiples_of_the_dilation():
    n, query = 41, 20
    mask = mask_patterns.build("dilated", n, window=3, dilation=2).mask
    reach = masks_page.receptive_field_summary(mask, 4, query)
    reached = reach[-1].nonzero().flatten()
    assert bool(((reached - query) % 2 == 0).all())  # the gaps never fill in
    rule = masks_page.receptive_field_rule("dilated", window=3, dilation=2)
    assert "multiple of d = 2" in rule and "fill in from" not in rule


def test_lsh_cost_counts_the_rounds():
    assert "R" in mask_patterns.cost("lsh", n_buckets=2, n_rounds=8)
    density = masks.density(mask_patterns.build("lsh", 200, n_buckets=2, n_rounds=8).mask)
    assert density > 0.85  # nowhere near N^2 / 2: eight rounds nearly connect everything


def test_scaling_captions_follow_their_numbers_where_the_softmax_is_not_saturated():
    at = open_page("pages/scaling.py")
    at.select_slider(key="scale_keys").set_value(128).run()
    at.select_slider(key="scale_d").set_value(4).run()
    captions = [c.value for c in at.caption]
    jacobian = next(c for c in captions if "Jacobian's norm" in c)
    assert "not yet saturated" in jacobian and "passes little gradient" not in jacobian
    largest = next(c for c in captions if "the largest weight averages" in c)
    assert "one key takes most of the weight from about d_k" in largest


def test_sinusoidal_tab_with_few_positions_and_a_large_shift():
    at = open_page("pages/positional.py")
    at.slider(key="pos_sin_n").set_value(16).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.slider(key="pos_sin_k").max <= 15
    assert not any("−" in m.value and "positions =" in m.value for m in at.markdown)


def test_step_by_step_says_when_a_row_has_no_allowed_key():
    at = open_page("pages/step_by_step.py")
    at.radio(key="sbs_source").set_value("Type numbers by hand").run()
    at.text_area(key="sbs_text_Q").input("1 0\n0 1\n1 1\n0 0").run()
    at.text_area(key="sbs_text_K").input("1 0\n0 1").run()
    at.text_area(key="sbs_text_V").input("1\n2").run()
    at.selectbox(key="sbs_mask").set_value("causal").run()
    assert not at.exception and not at.error
    caption = next(c.value for c in at.caption if "row sums" in c.value)
    assert "0, 0, 1, 1" in caption and "no allowed key is set to 0" in caption
    at.selectbox(key="sbs_score_function").set_value("dot").run()
    assert not any("sqrt" in latex.value for latex in at.latex)  # the formula follows the score function
    assert figures(at)


def test_cross_attention_helpers_from_the_page_module():
    assert heads_kv_cache.variants_of(kvcache.PRESETS["GPT-2 (124M)"]) == {"MHA": 12, "GQA (4 K/V)": 4, "MQA": 1}
    assert positional.alibi_slopes(8).tolist()[0] == 0.5
