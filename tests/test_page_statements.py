"""Statements the pages make, checked on the architectures a user can load (not only the bundled BERT) and at
settings other than the defaults."""

import numpy as np
import pytest
import torch

from attnviz.app import SCRIPT
from attnviz.core import kvcache, mask_patterns, masks, positional
from attnviz.models.capture import capture
from attnviz.models.loading import load_model_dir
from attnviz.pagelogic import heads_kv_cache
from attnviz.pagelogic import masks as masks_page
from attnviz.pagelogic.explore_heads.whatif import what_if, what_if_caption, what_if_effect
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
    before, after = what_if(record, 0, full, unscaled=False)
    effect = what_if_effect(record, 0, before, after, full)
    future_share = float((after * ~masks.causal(n)).sum(-1).mean())
    assert effect.gained_on_blocked == pytest.approx(future_share) and future_share > 0.1
    caption = what_if_caption(effect, unscaled=False)
    assert "not something the model ever did" in caption and "renormalised" not in caption
    causal = masks.causal(n)
    before, after = what_if(record, 0, causal, unscaled=False)
    same = what_if_effect(record, 0, before, after, causal)
    assert same.gained_on_blocked == 0 and what_if_caption(same, False).startswith("The same rule")


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
    before, after = what_if(result.records["encoder"], 0, None, unscaled=True)
    effect = what_if_effect(result.records["encoder"], 0, before, after, None)
    assert effect.scale_is_one and effect.largest_change < 1e-6
    assert "changes nothing" in what_if_caption(effect, unscaled=True)


def test_causality_is_read_from_the_attention_shown(tiny):
    bart = capture(tiny["bart"], TEXT)
    assert not bart.records["encoder"].is_causal() and bart.records["decoder"].is_causal()
    assert not bart.records["cross"].is_causal()
    assert capture(tiny["gpt2"], TEXT).records["self"].is_causal()


def test_the_alibi_tab_uses_a_bidirectional_bias_on_an_encoder_of_an_encoder_decoder(tiny):
    at = open_page("app_pages/positional.py", timeout=240, models={"bart": str(tiny["folders"]["bart"])}, model="bart",
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
    at = open_page("app_pages/heads_kv_cache.py")
    at.selectbox(key="kv_preset").set_value("Current checkpoint: all-MiniLM-L6-v2 (bundled BERT)").run()
    assert any("keeps no KV cache" in i.value for i in at.info)


def test_head_sharing_draws_each_drawn_query_heads_real_group():
    figure = head_sharing(12, 4, title="GQA", max_heads=8)
    queries, kv = figure.data[-2], figure.data[-1]
    for text in queries.hovertext:  # "query head h reads K/V head g": g is h's group of 3 (Llama's grouping)
        head, group = int(text.split()[2]), int(text.split()[-1])
        assert group == head // 3
    assert len(queries.hovertext) == 8 and all(t.endswith(": 3 query heads") for t in kv.hovertext)


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
    at = open_page("app_pages/scaling.py")
    at.select_slider(key="scale_keys").set_value(128).run()
    at.select_slider(key="scale_d").set_value(4).run()
    captions = [c.value for c in at.caption]
    jacobian = next(c for c in captions if "Jacobian's norm" in c)
    assert "not yet saturated" in jacobian and "passes little gradient" not in jacobian
    largest = next(c for c in captions if "the largest weight averages" in c)
    assert "one key takes most of the weight from about d_k" in largest


def test_sinusoidal_tab_with_few_positions_and_a_large_shift():
    at = open_page("app_pages/positional.py")
    at.slider(key="pos_sin_n").set_value(16).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.slider(key="pos_sin_k").max <= 15
    assert not any("−" in m.value and "positions =" in m.value for m in at.markdown)


def test_step_by_step_says_when_a_row_has_no_allowed_key():
    at = open_page("app_pages/step_by_step.py")
    at.radio(key="sbs_source").set_value("Type numbers by hand").run()
    at.text_area(key="sbs_text_Q_4_0").input("1 0\n0 1\n1 1\n0 0").run()
    at.text_area(key="sbs_text_K_4_0").input("1 0\n0 1").run()
    at.text_area(key="sbs_text_V_4_0").input("1\n2").run()
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


# Round two (issue 24): items 7, 12, 16, 17 and 20, each at the setting where the page was wrong.


def test_a_page_reading_the_first_tokens_counts_the_text_and_what_explore_reads():
    from transformers import AutoConfig, AutoTokenizer

    from attnviz.models.shipped import default_model_dir

    folder = default_model_dir()
    explore_reads = AutoConfig.from_pretrained(folder).max_position_embeddings  # what BERT reads
    tokenizer = AutoTokenizer.from_pretrained(folder)
    for text in (" ".join(["The quick brown fox jumps over the lazy dog."] * 110)[:4990],  # about 1,100 tokens
                 " ".join(["The cat sat on the mat."] * 30)):  # between 96 and 512
        count = len(tokenizer(text)["input_ids"])  # the whole text, [CLS] and [SEP] included
        at = open_page("app_pages/masks.py", sentence=text)
        notice = next(i.value for i in at.info if "reads the first" in i.value)
        assert f"first 96 of the text's {count:,} tokens" in notice, (count, notice)
        if count > explore_reads:
            assert f"Explore heads reads the first {explore_reads:,}" in notice and "all of them" not in notice
        else:
            assert "Explore heads reads all of them" in notice


def test_masks_page_says_which_rows_no_key_survives_in():
    from attnviz.models.shipped import BUNDLED_GPT_NAME

    # BigBird with no global, window or random block: no key is left for any query.
    at = open_page("app_pages/masks.py", masks_pattern="bigbird", masks_global_blocks=0, masks_window_blocks=0,
                   masks_random_blocks=0)
    n = len(at.selectbox(key="masks_query").options)
    built = mask_patterns.build("bigbird", n, **{k: at.session_state[f"masks_{k}"] for k in
                                                 ("block_size", "global_blocks", "window_blocks", "random_blocks",
                                                  "seed")})
    assert not bool(built.mask.any())
    caption = next(c.value for c in at.caption if "loses" in c.value)
    assert "every row stays empty" in caption and "fill each row again." not in caption

    # LSH on the tiny GPT: hashed with its own layer-0 keys of head 0, under its causal mask.
    at = open_page("app_pages/masks.py", model=BUNDLED_GPT_NAME, masks_pattern="lsh")
    bundle = load_model_dir(at.session_state["models"][BUNDLED_GPT_NAME])
    record = capture(bundle, at.session_state["sentence"], max_tokens=96).records["self"]
    keys = record.keys[0, 0].float()
    params = {k: at.session_state[f"masks_{k}"] for k in ("n_buckets", "n_rounds", "seed")}
    mask = mask_patterns.build("lsh", record.n_q, vectors=keys / keys.norm(dim=-1, keepdim=True).clamp_min(1e-6),
                               **params).mask & masks.causal(record.n_q)
    empty = (~mask.any(-1)).nonzero().flatten().tolist()
    caption = next(c.value for c in at.caption if "loses" in c.value)
    if empty:
        assert f"except the {len(empty)} of {record.n_q} rows" in caption
        assert f"{empty[0]}" in caption.split("rows that keep no key")[1]
    else:
        assert "fill each row again." in caption


def test_scaling_says_saturated_only_where_one_key_takes_most_of_the_weight():
    from attnviz.core import scaling

    for d_k in (2, 512):
        at = open_page("app_pages/scaling.py")
        at.select_slider(key="scale_keys").set_value(8).run()
        at.select_slider(key="scale_d").set_value(d_k).run()
        weights = torch.softmax(scaling.random_scores(d_k, 8, scaling.QUERIES_PER_POINT, 0), dim=-1)
        largest = float(weights.amax(-1).mean())  # the unscaled softmax's largest weight, averaged
        jacobian = next(c.value for c in at.caption if "Jacobian's norm" in c.value)
        if largest > 0.5:
            assert "saturated (one key takes" in jacobian and "not saturated" not in jacobian
        else:
            assert "saturated (one key takes" not in jacobian and "little gradient" not in jacobian
            assert "not saturated" in jacobian or "not yet saturated" in jacobian
            assert f"{largest:.2f}" in jacobian or "no smaller" in jacobian
    assert largest > 0.5  # d_k = 512 is saturated: both branches were checked


def test_checkpoints_page_states_the_dense_views_limit_of_the_current_model(tmp_path):
    import math

    from transformers import GPT2Config

    from attnviz.models.record import DENSE_CELLS, DENSE_LIMIT
    from attnviz.models.shipped import bundled_models
    from tests.tiny_models import VOCAB

    config = GPT2Config(vocab_size=VOCAB, n_positions=1024, n_embd=24, n_layer=12, n_head=12)  # GPT-2 small's shape
    folder = make_tiny_checkpoint("gpt2", tmp_path / "wide-gpt2", config=config)
    models = {name: str(path) for name, path in bundled_models().items()} | {"wide-gpt2": str(folder)}
    at = open_page("app_pages/checkpoints.py", models=models, model="wide-gpt2")
    limit = min(DENSE_LIMIT, math.isqrt(DENSE_CELLS // (config.n_layer * config.n_head)))  # 745
    caption = next(c.value for c in at.caption if "rollout, compare, what-if" in c.value)
    assert f"up to {limit:,} tokens with wide-gpt2" in caption and limit < DENSE_LIMIT
    # ... and that is where the record stops materialising every head.
    bundle = load_model_dir(folder)
    text = " ".join(["word"] * 2000)
    at_limit = capture(bundle, text, max_tokens=limit).records["self"]
    past = capture(bundle, text, max_tokens=limit + 1).records["self"]
    assert at_limit.n_q == limit and at_limit.dense_ok and not past.dense_ok


def test_sidebar_model_help_names_every_bundled_model():
    from streamlit.testing.v1 import AppTest

    from attnviz.models.shipped import bundled_models

    at = AppTest.from_file(str(SCRIPT), default_timeout=120).run()  # app.py draws the sidebar
    assert not at.exception, [e.value for e in at.exception]
    help_text = at.selectbox(key="model").help
    for name in bundled_models():
        assert name in help_text


# --- Heads and KV cache: sliding and full layers, cross-attention pairs, GQA vs MQA (issue 24: 3, 4, 9) --------


def _drawn_groups(figure) -> dict[int, list[int]]:
    """K/V head -> the query heads drawn reading it, from the figure's hover texts."""
    groups: dict[int, list[int]] = {}
    for text in figure.data[-2].hovertext:
        words = text.split()
        groups.setdefault(int(words[-1]), []).append(int(words[2]))
    return groups


def test_gqa_and_mqa_diagrams_differ_when_only_some_query_heads_are_drawn():
    """Llama 2 70B: 64 query heads, 8 K/V heads. With 8 query heads drawn, GQA must show several K/V heads each
    shared by several query heads, MQA one K/V head for all, MHA one K/V head per query head."""
    from attnviz.core.attention import kv_head_of_query_head

    drawn = {}
    for name, kv_heads in (("MHA", 64), ("GQA", 8), ("MQA", 1)):
        groups = _drawn_groups(head_sharing(64, kv_heads, title=name, max_heads=8))
        mapping = kv_head_of_query_head(64, kv_heads)
        assert all(mapping[q] == g for g, queries in groups.items() for q in queries)  # the real groups
        assert sum(len(q) for q in groups.values()) <= 8
        drawn[name] = groups
    assert len(drawn["MQA"]) == 1
    assert len(drawn["GQA"]) > 1 and all(len(q) > 1 for q in drawn["GQA"].values())
    assert all(len(q) == 1 for q in drawn["MHA"].values()) and len(drawn["MHA"]) > 1


def test_cross_attention_caption_says_only_what_the_tiny_gpt_tokens_do():
    """The caption lists each decoder token's strongest key as computed here from the bundled tiny GPT's own
    embeddings (one head, identity projections: softmax of √d · cosine); its whole-word embeddings started from
    BERT's, so kitten finds cat."""
    from attnviz.core.tokens_display import BYTE_LEVEL, readable_token
    from attnviz.models.shipped import BUNDLED_GPT_DIR

    bundle = load_model_dir(BUNDLED_GPT_DIR)
    source, target = TEXT, "A kitten rested on the rug."
    example = heads_kv_cache.cross_attention_example(bundle, source, target, n_heads=1)
    caption = heads_kv_cache.cross_attention_caption(example, "identity", 1)
    embeddings = bundle.model.get_input_embeddings().weight.detach().float()
    ids = {text: bundle.tokenizer(text, add_special_tokens=False)["input_ids"] for text in (source, target)}
    unit = {text: torch.nn.functional.normalize(embeddings[ids[text]], dim=-1) for text in ids}
    weights = torch.softmax(embeddings.shape[1] ** 0.5 * unit[target] @ unit[source].T, dim=-1)
    source_tokens = bundle.tokenizer.convert_ids_to_tokens(ids[source])
    target_tokens = bundle.tokenizer.convert_ids_to_tokens(ids[target])
    assert "Ġkitten" in target_tokens and "Ġcat" in source_tokens  # whole words (the app's own sentences)
    shown = {token: readable_token(token, BYTE_LEVEL) for token in source_tokens + target_tokens}
    for row, token in enumerate(target_tokens[:8]):
        best = int(weights[row].argmax())
        if token.replace("Ġ", "").isalnum() and source_tokens[best].replace("Ġ", "").isalnum():
            # The tokens as every page shows them: "␣rested", never the tokenizer's "Ġrested"
            assert f"{shown[token]} → {shown[source_tokens[best]]} ({float(weights[row, best]):.2f})" in caption
    assert "Ġ" not in caption
    kitten = target_tokens.index("Ġkitten")
    best, runner_up = weights[kitten].topk(2).values.tolist()
    assert source_tokens[int(weights[kitten].argmax())] == "Ġcat" and best > 2 * runner_up  # 0.48 against 0.20
    assert "␣kitten → ␣cat" in caption
    # a word that finds nothing alike is not said to find cat: the caption follows the weights, not the example
    other = heads_kv_cache.cross_attention_example(bundle, source, "A compiler parsed the module.", n_heads=1)
    found = [other["source_tokens"][int(row.argmax())] for row in other["weights"][0]]
    assert ("→ ␣cat" in heads_kv_cache.cross_attention_caption(other, "identity", 1)) == ("Ġcat" in found)


def test_kv_page_sums_a_checkpoints_sliding_and_full_layers(tmp_path):
    """A tiny Gemma 2 with a window of 4: layer 0 slides, layer 1 attends to everything (its config's layer
    types); the page's total is the sum over the layers, and it says which layers slide."""
    from attnviz.core.units import DTYPE_BYTES, human_bytes
    from tests.tiny_models import tiny_config

    config = tiny_config("gemma2")
    config.sliding_window = 4
    folder = make_tiny_checkpoint("gemma2", tmp_path / "tiny-gemma2", config=config)
    at = open_page("app_pages/heads_kv_cache.py", models={"tiny-gemma2": str(folder)}, model="tiny-gemma2")
    at.selectbox(key="kv_preset").set_value("Current checkpoint: tiny-gemma2").run()
    assert not at.exception, [e.value for e in at.exception]
    seq_len, dtype = int(at.select_slider(key="kv_seq").value), at.selectbox(key="kv_dtype").value
    by_hand = sum(2 * config.num_key_value_heads * config.head_dim * DTYPE_BYTES[dtype]
                  * (min(seq_len, 4) if kind == "sliding_attention" else seq_len) for kind in config.layer_types)
    table = next(frame.value for frame in at.table if "KV cache, all layers" in frame.value.columns)
    own = table[table["variant"].str.endswith("← this model")].iloc[0]
    assert own["KV cache, all layers"] == human_bytes(by_hand)
    note = next(i.value for i in at.info if "window of 4 tokens" in i.value)
    sliding = config.layer_types.count("sliding_attention")
    assert f"{sliding} layer" in note and f"{seq_len:,}" in note and "in every layer" not in note

