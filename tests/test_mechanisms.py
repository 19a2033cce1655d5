"""Closed-form checks for the mechanism pages: positional encodings, sparse patterns, scaling, KV cache."""

import math

import pytest
import torch
import torch.nn.functional as F

from attnviz.core import kvcache, mask_patterns, masks, positional, scaling
from attnviz.core.units import human_bytes
from attnviz.pagelogic import masks as masks_page
from attnviz.pagelogic.positional import alibi_on_real_head
from attnviz.pagelogic.scaling import real_head_scalings

# --- positional -------------------------------------------------------------------------------------------------


def test_sinusoidal_values_at_known_positions():
    table = positional.sinusoidal(10, 4)
    # d_model = 4: frequencies 1 and 1/100.
    assert table[0].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert table[1, 0].item() == pytest.approx(math.sin(1))
    assert table[1, 1].item() == pytest.approx(math.cos(1))
    assert table[3, 2].item() == pytest.approx(math.sin(3 / 100))
    assert table[3, 3].item() == pytest.approx(math.cos(3 / 100))


def test_sinusoidal_shift_is_a_linear_map():
    table = positional.sinusoidal(64, 32)
    for k in (1, 7, 20):
        shift = positional.sinusoidal_shift_matrix(k, 32)
        torch.testing.assert_close(table[k:], table[:-k] @ shift.T)
        torch.testing.assert_close(shift @ shift.T, torch.eye(32, dtype=torch.float64))  # a rotation


def test_sinusoidal_dot_product_depends_on_distance_only():
    table = positional.sinusoidal(80, 16)
    torch.testing.assert_close(positional.dot_by_distance(table, 0)[:30], positional.dot_by_distance(table, 40)[:30])
    # Closed form: PE(p).PE(p+k) = sum_i cos(k * w_i).
    w = positional.sinusoidal_frequencies(16)
    torch.testing.assert_close(positional.dot_by_distance(table, 0)[5], torch.cos(5 * w).sum())


def test_rope_relative_property_and_norm():
    generator = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 16, generator=generator, dtype=torch.float64)
    scores = positional.rope_relative_scores(q, k, 12)
    for offset in range(-11, 12):
        diagonal = scores.diagonal(offset)
        torch.testing.assert_close(diagonal, diagonal[0].expand_as(diagonal))
    rotated = positional.apply_rope(q.expand(5, -1), torch.arange(5))
    torch.testing.assert_close(rotated.norm(dim=-1), q.norm().expand(5))  # rotations keep lengths


def test_rope_matches_transformers_llama():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    generator = torch.Generator().manual_seed(1)
    x = torch.randn(1, 2, 6, 8, generator=generator, dtype=torch.float64)  # [batch, heads, seq, head_dim]
    positions = torch.arange(6)
    angles = positions.double().unsqueeze(-1) * positional.rope_frequencies(8)
    emb = torch.cat((angles, angles), dim=-1)
    reference, _ = apply_rotary_pos_emb(x, x, emb.cos()[None], emb.sin()[None])
    torch.testing.assert_close(positional.apply_rope(x, positions), reference)


def test_rotate_pair():
    x, y = positional.rotate_pair((1.0, 0.0), math.pi / 2)
    assert x == pytest.approx(0.0, abs=1e-12) and y == pytest.approx(1.0)


def test_alibi_slopes_from_the_paper():
    assert positional.alibi_slopes(8).tolist() == [1 / 2**i for i in range(1, 9)]
    assert positional.alibi_slopes(16)[0].item() == pytest.approx(2**-0.5)
    # 12 heads: the 8 slopes of 8 heads, then every other slope of 16 heads.
    expected = [2 ** (-i) for i in range(1, 9)] + [2 ** (-(2 * i + 1) / 2) for i in range(4)]
    torch.testing.assert_close(positional.alibi_slopes(12), torch.tensor(expected, dtype=torch.float64))


def test_alibi_bias():
    bias = positional.alibi_bias(2, 4)  # 2 heads: slopes 2^-4 and 2^-8
    assert bias[0].tolist()[3] == [-3 / 16, -2 / 16, -1 / 16, 0.0]  # distances 3, 2, 1, 0
    assert bias[1, 3, 0].item() == pytest.approx(-3 / 256)
    symmetric = positional.alibi_bias(1, 3, causal=False)[0]
    torch.testing.assert_close(symmetric, symmetric.T)


def test_learned_position_table_of_the_bundled_bert():
    from attnviz.models.position_tables import learned_position_table
    from tests.tiny_models import bundled_bert

    name, table = learned_position_table(bundled_bert().model)
    assert name == "embeddings.position_embeddings.weight" and table.shape == (512, 384)


def test_word_order_without_positions_is_a_permutation():
    from attnviz.interventions.word_order import word_order_experiment
    from tests.tiny_models import bundled_bert

    bundle = bundled_bert()
    text = "The cat sat on the mat because it was tired."
    without = word_order_experiment(bundle, text, seed=3, remove_positions=True)
    assert without["order"] != list(range(len(without["tokens"])))
    assert without["max_difference"] < 1e-5
    with_positions = word_order_experiment(bundle, text, seed=3, remove_positions=False)
    assert with_positions["max_difference"] > 0.05
    # The experiment restores the weights it zeroed.
    assert bundle.model.embeddings.position_embeddings.weight.abs().sum() > 0


def test_permutation_keeps_special_tokens_in_place():
    order = positional.permutation_of_words(8, seed=5)
    assert order[0] == 0 and order[-1] == 7 and sorted(order) == list(range(8))


# --- patterns ---------------------------------------------------------------------------------------------------


def scores_computed(key, n, **params):
    return int(mask_patterns.build(key, n, **params).mask.sum())


def test_pattern_densities_on_small_cases():
    n = 8
    assert masks.density(mask_patterns.build("full", n).mask) == 1.0
    assert scores_computed("causal", n) == 36
    assert scores_computed("sliding_causal", n, window=3) == 1 + 2 + 3 * 6
    assert scores_computed("sliding_bidirectional", n, radius=1) == 3 * n - 2
    assert scores_computed("dilated", n, window=2, dilation=2) == n + 2 * (n - 2)
    # one global token on top of a window of 1 on each side: row 0 and column 0 become full
    assert scores_computed("global_local", n, radius=1, global_tokens=1) == (3 * n - 2) + (n - 2) + (n - 2)
    for key in mask_patterns.PATTERNS:
        if key != "lsh":  # Reformer forbids attending to yourself
            assert mask_patterns.build(key, n).mask.diagonal().all(), key


@pytest.mark.parametrize("key,params", [
    ("sliding_causal", {"window": 4}), ("sliding_bidirectional", {"radius": 2}),
    ("sliding_window", {"left": 3, "right": 1}),
    ("dilated", {"window": 3, "dilation": 2}), ("dilated", {"window": 2, "dilation": 5}),
    ("global_local", {"radius": 2, "global_tokens": 0}),
])
def test_each_description_states_the_keys_an_inner_query_sees(key, params):
    """The caption's "N keys per query" is what the mask gives a query away from the edges, for any setting."""
    n = 40
    mask = mask_patterns.build(key, n, **params).mask
    inner = int(masks.keys_per_query(mask)[n // 2])
    described = mask_patterns.describe(key, **params)
    assert f"{inner} keys per query" in described or f"({inner} keys)" in described, (described, inner)


def test_dilated_window_is_2w_minus_1_keys_not_w():
    mask = mask_patterns.build("dilated", 30, window=3, dilation=2).mask
    assert masks.keys_per_query(mask)[15] == 5  # 2W - 1: W - 1 on each side and itself
    described = mask_patterns.describe("dilated", window=3, dilation=2)
    assert "5 keys per query" in described and "same cost" not in described
    assert mask_patterns.cost("dilated", window=3, dilation=2) == "O(N·(2W−1))"


def test_bidirectional_window_has_2r_plus_1_keys_for_every_r():
    for radius in range(0, 5):
        mask = mask_patterns.build("sliding_bidirectional", 20, radius=radius).mask
        assert masks.keys_per_query(mask)[10] == 2 * radius + 1  # never W + 1 for an even W


@pytest.mark.parametrize("key,params,per_layer", [
    ("sliding_causal", {"window": 3}, 2), ("sliding_bidirectional", {"radius": 2}, 4),
    ("sliding_bidirectional", {"radius": 1}, 2),
])
def test_receptive_field_rule_states_the_measured_growth(key, params, per_layer):
    n, query = 60, 30
    reach = masks_page.receptive_field_summary(mask_patterns.build(key, n, **params).mask, 4, query).sum(-1).tolist()
    assert [b - a for a, b in zip(reach, reach[1:], strict=False)] == [per_layer] * 3
    rule = masks_page.receptive_field_rule(key, **params)
    side = per_layer if key == "sliding_causal" else per_layer // 2
    assert f"= {side} " in rule and "W-1" not in rule, rule


def test_every_registered_pattern_states_its_own_reach():
    reaches = {key: mask_patterns.reach(key) for key in mask_patterns.PATTERNS}
    assert all(reaches.values()) and len(set(reaches.values())) == len(reaches)  # one statement per pattern
    # The (left, right) window states both sides, measured: 2 back and 1 ahead per layer.
    reach = masks_page.receptive_field_summary(
        mask_patterns.build("sliding_window", 40, left=2, right=1).mask, 3, 20)
    first = reach.float().argmax(-1).tolist()  # the earliest token reaching query 20 after 1, 2, 3 layers
    assert [20 - f for f in first] == [2, 4, 6]
    assert "2 tokens back and 1 ahead" in mask_patterns.reach("sliding_window", left=2, right=1)


def test_lsh_is_described_as_built():
    assert "log" not in mask_patterns.cost("lsh")  # the mask as built is not N log N
    assert "O(N log N)" in mask_patterns.describe("lsh")  # Reformer's own cost is named as Reformer's
    n = 400
    density = masks.density(mask_patterns.build("lsh", n, n_buckets=4, n_rounds=2).mask)
    assert density == pytest.approx(1 - (1 - 1 / 4) ** 2, abs=0.08)  # constant density: O(N^2) as built


def test_dilated_window_sees_every_other_token():
    mask = masks.dilated_sliding_window(9, window=3, dilation=2)
    assert mask[8].nonzero().flatten().tolist() == [4, 6, 8]
    assert not masks.dilated_sliding_window(9, 3, 2, causal=False)[4, 5]


def test_receptive_field_of_stacked_windows():
    # A causal window of 2 (itself and the previous token) reaches one token further back per layer.
    reach = masks.receptive_field(masks.sliding_window(10, 1, 0), 4)
    assert [int(reach[layer, 9].sum()) for layer in range(4)] == [2, 3, 4, 5]
    # Global token 0: any token reaches any other in two layers.
    glob = masks.receptive_field(masks.global_local(10, [0], 0, 0), 2)
    assert not glob[0].all() and glob[1].all()


def test_lsh_mask_is_seeded_symmetric_and_groups_identical_vectors():
    vectors = torch.randn(12, 8, generator=torch.Generator().manual_seed(0))
    vectors[5] = vectors[2]
    mask = masks.lsh(vectors, 4, 2, seed=1)
    assert torch.equal(mask, mask.T)
    assert mask[2, 5]
    assert torch.equal(mask, masks.lsh(vectors, 4, 2, seed=1))
    with pytest.raises(ValueError):
        masks.lsh(vectors, 3, 1)


def test_lsh_token_attends_to_itself_only_when_nothing_else_is_left():
    vectors = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    mask = masks.lsh(vectors, 8, 1, seed=2)
    others = (mask & ~torch.eye(64, dtype=torch.bool)).any(-1)
    assert torch.equal(mask.diagonal(), ~others)  # self only for a token alone in its bucket
    assert others.any() and not mask.diagonal().all()
    assert mask.any(-1).all()  # nobody is left without a key


def test_allowed_pairs_count_matches_built_masks():
    exact = [("full", {}), ("causal", {}), ("sliding_causal", {"window": 4}), ("sliding_bidirectional", {"radius": 3}),
             ("sliding_window", {"left": 5, "right": 2}), ("dilated", {"window": 3, "dilation": 4})]
    for key, params in exact:
        for n in (7, 64):
            assert mask_patterns.allowed_pairs(key, n, **params) == scores_computed(key, n, **params), (key, n)
    for key, params in (("global_local", {"radius": 2, "global_tokens": 2}), ("bigbird", {"block_size": 4})):
        estimate, built = mask_patterns.allowed_pairs(key, 64, **params), scores_computed(key, 64, **params)
        assert built <= estimate <= 1.25 * built, (key, estimate, built)  # an upper bound, said "≈" on the page


def test_score_memory_at_128k_fp16():
    table = masks_page.score_memory_table("sliding_causal", [131072], "fp16", window=4096)
    assert table["dense bytes"].iloc[0] == 131072**2 * 2 == 32 * 1024**3
    assert table["dense N×N scores"].iloc[0] == "32 GiB"
    # A causal window of W keys stores about N x W scores: 131072 x 4096 x 2 bytes, less the first W rows' triangle.
    assert table.iloc[0, 2] == human_bytes(2 * (131072 * 4096 - 4096 * 4095 / 2))


def test_registry_refuses_unknown_names_and_impossible_shapes():
    with pytest.raises(ValueError, match="unknown mask pattern"):
        mask_patterns.build("starfish", 8)
    with pytest.raises(ValueError, match="no parameter"):
        mask_patterns.build("causal", 8, window=3)
    with pytest.raises(ValueError, match="as many queries as keys"):
        mask_patterns.build("bigbird", 8, 12)
    with pytest.raises(ValueError, match="no rule"):
        mask_patterns.rule("lsh", 8)
    assert mask_patterns.build("causal", 4, 6).mask.shape == (4, 6)


def test_convention_demo_uses_pytorch_semantics():
    generator = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 6, 4, generator=generator, dtype=torch.float64)
    demo = masks_page.convention_demo(q, k)
    right, additive, keep, inverted = demo.weights.values()
    expected = F.scaled_dot_product_attention(q, k, torch.eye(6, dtype=torch.float64), is_causal=True)
    torch.testing.assert_close(right, expected)
    torch.testing.assert_close(additive, right)
    assert demo.future_weight["bool, True = may attend"] == 0
    assert demo.future_weight["float 1 = keep (added!)"] > 0.1  # the 0/1 float mask blocks nothing
    assert demo.future_weight["bool, True = masked (inverted!)"] > 0.5


# --- scaling ----------------------------------------------------------------------------------------------------


def test_dot_product_variance_matches_theory():
    for row in scaling.dot_product_variance([1, 16, 256], n_samples=20000):
        assert row["measured"] == pytest.approx(row["theory"], rel=0.06)
        assert row["measured_scaled"] == pytest.approx(1.0, rel=0.06)


def test_softmax_saturates_without_scaling():
    small, large = scaling.softmax_statistics([4, 1024], n_keys=32)
    assert large["entropy_unscaled"] < 0.3 < large["entropy_scaled"]
    assert large["max_weight_unscaled"] > 0.9
    assert large["jacobian_unscaled"] < small["jacobian_unscaled"]
    assert large["entropy_scaled"] == pytest.approx(small["entropy_scaled"], rel=0.1)


def test_jacobian_norm_closed_form():
    uniform = torch.full((4,), 0.25, dtype=torch.float64)
    # diag(p) - pp^T for uniform p over n: diagonal (1/n - 1/n^2), off-diagonal -1/n^2.
    expected = math.sqrt(4 * (0.25 - 0.0625) ** 2 + 12 * 0.0625**2)
    assert scaling.jacobian_norm(uniform).item() == pytest.approx(expected)
    assert scaling.jacobian_norm(torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)).item() == 0.0


def test_max_subtraction_is_exact_and_stable():
    x = torch.tensor([1000.0, 999.0, 0.0])
    assert torch.isnan(scaling.naive_softmax(x)).any()
    torch.testing.assert_close(scaling.stable_softmax(x), torch.softmax(x.double(), -1).float())
    table = scaling.stability_table([10, 100], {"fp16": torch.float16, "fp32": torch.float32})
    fp16_naive_100 = next(r for r in table if r["max logit"] == 100 and r["dtype"] == "fp16" and r["method"] == "naive")
    assert not fp16_naive_100["finite"]
    assert all(r["finite"] and r["right"] for r in table if r["method"] == "max-subtracted")


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_stability_table_reports_the_real_largest_logit_and_it_explains_overflow(seed):
    dtypes = {"fp16": torch.float16, "fp32": torch.float32}
    table = scaling.stability_table([5, 10, 11, 12, 50, 88, 89, 100], dtypes, seed)
    for row in table:
        threshold = scaling.exp_overflow_threshold(dtypes[row["dtype"]])
        assert row["max logit"] == pytest.approx(float(torch.tensor(row["max logit"])), abs=0.05)
        if row["method"] == "naive" and row["max logit"] > threshold:
            assert not row["finite"]  # the page's threshold is the one the table shows
        if row["method"] == "naive" and row["max logit"] < threshold - math.log(8):  # 8 logits cannot sum to overflow
            assert row["finite"] and row["right"]
    labelled_100 = [r["max logit"] for r in table if r["dtype"] == "fp32" and abs(r["max logit"] - 100) < 1]
    assert labelled_100 and all(m == 100 for m in labelled_100)  # not 70.7


def test_overflow_thresholds():
    assert scaling.exp_overflow_threshold(torch.float16) == pytest.approx(11.09, abs=0.01)
    assert scaling.exp_overflow_threshold(torch.float32) == pytest.approx(88.72, abs=0.01)


# --- KV cache ---------------------------------------------------------------------------------------------------


def test_kv_cache_bytes_for_known_configs():
    llama70 = kvcache.PRESETS["Llama 2 70B"]
    # 2 x 80 layers x 8 KV heads x 128 dims x 2 bytes = 320 KiB per token in fp16.
    cache = kvcache.kv_cache_bytes(llama70, seq_len=4096, batch=1, dtype="fp16")
    assert cache["per_token"] == 2 * 80 * 8 * 128 * 2 == 327680
    assert cache["total"] == 327680 * 4096
    gpt2 = kvcache.PRESETS["GPT-2 (124M)"]
    assert kvcache.kv_cache_bytes(gpt2, 1024, 1, "fp32")["total"] == 2 * 12 * 12 * 64 * 1024 * 4


def test_per_token_cost_does_not_grow_with_the_batch():
    gpt2 = kvcache.PRESETS["GPT-2 (124M)"]
    one, eight = (kvcache.kv_cache_bytes(gpt2, 1024, batch, "fp16") for batch in (1, 8))
    assert one["per_token"] == eight["per_token"] == 2 * 12 * 12 * 64 * 2
    assert eight["total"] == 8 * one["total"]


def test_mistral_rolling_buffer_caps_the_cache_at_its_window():
    mistral = kvcache.PRESETS["Mistral 7B (v0.1)"]
    at_window = kvcache.kv_cache_bytes(mistral, 4096, 1, "fp16")
    at_32k = kvcache.kv_cache_bytes(mistral, 32768, 1, "fp16")
    assert at_32k["total"] == at_window["total"] == 2 * 32 * 8 * 128 * 4096 * 2
    assert at_32k["cached_tokens"] == 4096
    llama = kvcache.PRESETS["Llama 3 8B"]
    assert kvcache.kv_cache_bytes(llama, 8192, 1, "fp16")["cached_tokens"] == 8192  # no window: every token


def test_a_length_beyond_the_context_is_flagged():
    gpt2 = kvcache.PRESETS["GPT-2 (124M)"]
    assert kvcache.beyond_context(gpt2, 131072) and not kvcache.beyond_context(gpt2, 1024)


def test_attention_parameters_match_our_module():
    from attnviz.core.attention import MultiHeadAttention

    config = kvcache.AttentionConfig("toy", 2, 64, 8, 2, 8, 128)
    module = MultiHeadAttention(64, 8, n_kv_heads=2)
    assert kvcache.attention_parameters(config)["per layer"] == sum(p.numel() for p in module.parameters())
    assert kvcache.with_kv_heads(config, 1).kind == "MQA" and kvcache.with_kv_heads(config, 8).kind == "MHA"
    with pytest.raises(ValueError):
        kvcache.with_kv_heads(config, 3)


def test_cross_attention_example_aligns_related_words():
    from attnviz.pagelogic.heads_kv_cache import cross_attention_example
    from tests.tiny_models import bundled_bert

    result = cross_attention_example(bundled_bert(), "the cat sat on the mat", "a kitten rested")
    weights = result["weights"]
    assert weights.shape == (1, 3, 6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 3))
    assert result["source_tokens"][int(weights[0, 1].argmax())] == "cat"  # kitten -> cat


def test_real_head_helpers_reproduce_the_model():
    from attnviz.models.capture import capture
    from tests.tiny_models import bundled_bert

    record = capture(bundled_bert(), "The cat sat on the mat.").records["self"]
    raw = record.scores(2, heads=[5], scale=1.0, dtype=torch.float64)[0]  # unscaled q.k in fp64
    allowed = record.mask_rows(2)
    assert allowed.all() and raw.shape == (9, 9)
    versions = real_head_scalings(record, 2, 5, temperature=1.0)
    model, unscaled, same = versions.values()
    torch.testing.assert_close(model.float(), record.weights[2, 5], atol=1e-5, rtol=0)
    torch.testing.assert_close(same, model)
    assert scaling.entropy(unscaled).mean() < scaling.entropy(model).mean()
    before, with_zero_bias = alibi_on_real_head(record, 2, 5, torch.zeros(9, 9, dtype=torch.float64))
    torch.testing.assert_close(before, with_zero_bias)
    _, with_alibi = alibi_on_real_head(record, 2, 5, positional.alibi_bias(1, 9, causal=False)[0] * 8)
    distance = (torch.arange(9).unsqueeze(1) - torch.arange(9)).abs().double()
    assert (with_alibi * distance).sum(-1).mean() < (before * distance).sum(-1).mean()  # pulled toward neighbours
    before_head, cut, after, lost = masks_page.apply_to_head(record, 2, 5, masks.causal(9))
    torch.testing.assert_close(cut, record.weights[2, 5] * masks.causal(9))
    assert lost == pytest.approx(float(1 - cut.sum(-1).mean()))
    torch.testing.assert_close(after.sum(-1), torch.ones(9))


def test_toy_rope_separates_repeated_words():
    q = torch.ones(3, 4, dtype=torch.float64)  # three identical tokens
    plain, rotated = positional.toy_attention_with_and_without_rope(q, q.clone())
    torch.testing.assert_close(plain, torch.full((3, 3), 1 / 3, dtype=torch.float64))
    assert not torch.allclose(rotated[0], rotated[2])


@pytest.mark.parametrize("kind", ["gpt_oss", "gemma2"])
def test_the_scaling_and_positional_panels_are_the_models_weights_with_sinks_and_softcapping(tiny_checkpoint, kind):
    """One scoring path: the Scaling page's "model" panel and the Positional page's "the model's head" are the
    weights the model computes, attention sinks (gpt-oss: rows sum to less than 1) and soft-capping (Gemma 2)
    included; a zero ALiBi bias changes nothing and a real one still moves weight toward neighbours."""
    from attnviz.models.capture import capture
    from attnviz.models.loading import load_model_dir

    record = capture(load_model_dir(tiny_checkpoint(kind)), "The cat sat on the mat because it was tired."
                     ).records["self"]
    for layer in range(record.n_layers):
        for head in range(record.n_heads):
            model, unscaled, same = real_head_scalings(record, layer, head, temperature=1.0).values()
            torch.testing.assert_close(model, record.weights[layer, head])
            torch.testing.assert_close(same, model)
            before, zero = alibi_on_real_head(record, layer, head, torch.zeros(record.n_q, record.n_k))
            torch.testing.assert_close(before, record.weights[layer, head])
            torch.testing.assert_close(zero, before)
    if kind == "gpt_oss":
        assert (record.weights.sum(-1) < 1 - 1e-3).any()  # the sinks take a share of the row: not renormalised away
        assert (real_head_scalings(record, 0, 0, 1.0)["no scaling"].sum(-1) < 1 - 1e-6).any()
