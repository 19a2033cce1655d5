"""Per-layer attention facts (attnviz.models.layer_facts) against what the models really do, and the KV-cache sizes
the Heads and KV cache page states for models that mix sliding-window and full layers."""

from types import SimpleNamespace

import pytest
import torch

from attnviz.core import kvcache
from attnviz.core.units import DTYPE_BYTES, human_bytes
from attnviz.models.architectures import ARCHITECTURES, TESTED_MODEL_TYPES
from attnviz.models.layer_facts import cache_windows, layer_facts
from attnviz.pagelogic import heads_kv_cache
from tests.tiny_models import tiny_config

WINDOW = 4  # a sliding window shorter than the test sequence
LENGTH = 10

DECODERS = [kind for kind in TESTED_MODEL_TYPES if ARCHITECTURES[kind].role == "decoder"]


def _windowed_config(kind: str):
    config = tiny_config(kind)
    if isinstance(getattr(config, "sliding_window", None), int):  # shrink a window the config sets
        config.sliding_window = WINDOW
    if kind in ("mistral", "mixtral", "starcoder2", "phi3"):  # a global window for every layer (Mistral-style)
        config.sliding_window = WINDOW
    return config


@pytest.mark.parametrize("kind", DECODERS)
def test_the_facts_of_each_layer_are_what_the_model_does(kind):
    """Which keys each layer's last query really reads (its eager weights are exactly 0 elsewhere), whether its
    weights sum to 1 (a learned sink takes a share), and its soft-cap, against what layer_facts reads."""
    from transformers import AutoModel

    config = _windowed_config(kind)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = AutoModel.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        attentions = model(input_ids=torch.randint(5, 1000, (1, LENGTH)), output_attentions=True).attentions
    facts = layer_facts(config, model)
    assert len(facts) == len(attentions)
    for layer, weights in enumerate(attentions):
        last = weights[0, :, -1].float()  # [heads, keys]
        read = (last != 0).any(0)
        first_read = int(read.nonzero()[0])
        assert first_read == facts[layer].first_key(LENGTH - 1), (kind, layer)
        assert facts[layer].sliding == (first_read > 0)
        # what the Heads and KV cache page caches for this layer: the keys a query reads
        assert cache_windows(config)[layer] == (LENGTH - first_read if first_read else None)
        sums = last.sum(-1)
        if facts[layer].sinks:
            assert float(sums.max()) < 1 - 1e-3  # the sink's share is taken from the keys
        else:
            torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-4, rtol=0)
    caps = {getattr(module, "attn_logit_softcapping", None) for module in model.modules()} - {None}
    assert {f.softcap for f in facts} == (caps or {None})


def test_layer_facts_from_the_config_alone_agree_with_the_record():
    from transformers import GptOssConfig

    config = GptOssConfig(num_hidden_layers=4, sliding_window=128)
    facts = layer_facts(config)
    assert [f.window for f in facts] == [128 if t == "sliding_attention" else None for t in config.layer_types]
    assert all(f.sinks for f in facts)
    assert not any(f.sinks for f in layer_facts(tiny_config("llama")))


def _bundle(name: str, config) -> SimpleNamespace:
    """What config_of_bundle reads of a loaded model, for a config built here with a real model's sizes."""
    return SimpleNamespace(
        name=name, model=SimpleNamespace(config=config), n_layers=config.num_hidden_layers,
        n_heads=config.num_attention_heads, n_kv_heads=config.num_key_value_heads, d_model=config.hidden_size,
        max_positions=config.max_position_embeddings, architecture="decoder",
    )


def _by_hand(config, seq_len: int, dtype: str) -> int:
    """2 x K/V heads x head dim x bytes x the tokens each layer keeps, summed over the config's layer types."""
    total = 0
    for layer_type in config.layer_types:
        held = min(seq_len, config.sliding_window) if layer_type == "sliding_attention" else seq_len
        total += 2 * config.num_key_value_heads * config.head_dim * DTYPE_BYTES[dtype] * held
    return total


REAL = {
    # gemma-2-9b's config.json: 42 layers, 16 heads, 8 K/V heads of 256, window 4,096
    "gemma-2-9b": ("Gemma2Config", dict(num_hidden_layers=42, hidden_size=3584, num_attention_heads=16,
                                        num_key_value_heads=8, head_dim=256, sliding_window=4096,
                                        max_position_embeddings=8192), 8192, 1.97),
    # gpt-oss-20b's config.json: 24 layers, 64 heads, 8 K/V heads of 64, window 128, 131,072 positions
    "gpt-oss-20b": ("GptOssConfig", dict(num_hidden_layers=24, hidden_size=2880, num_attention_heads=64,
                                         num_key_value_heads=8, head_dim=64, sliding_window=128,
                                         max_position_embeddings=131072), 131072, 3.0),
}


@pytest.mark.parametrize("name", list(REAL))
def test_kv_cache_of_a_model_with_sliding_and_full_layers_is_summed_per_layer(name):
    import transformers

    class_name, sizes, seq_len, gib = REAL[name]
    config = getattr(transformers, class_name)(**sizes)
    shape = heads_kv_cache.checkpoint_config(_bundle(name, config))
    cache = kvcache.kv_cache_bytes(shape, seq_len, 1, "bf16")
    expected = _by_hand(config, seq_len, "bf16")
    assert cache["total"] == expected
    assert round(expected / 2**30, 2 if gib < 2 else 1) == gib  # the figures: 1.97 GiB, about 3 GiB
    sliding = config.layer_types.count("sliding_attention")
    full = config.num_hidden_layers - sliding
    statement = heads_kv_cache.window_statement(shape, seq_len)
    assert f"{sliding} layers slide a window of {config.sliding_window:,}" in statement
    assert f"{full} layers attend to every token" in statement
    assert "in every layer" not in statement
    formula = heads_kv_cache.formula_caption(shape, seq_len, 1, "bf16")
    assert f"{full} × {seq_len:,} + {sliding} × {config.sliding_window:,}" in formula
    # The table's total for this model's own row
    table = heads_kv_cache.cache_table(shape, seq_len, 1, "bf16")
    own = table[table["variant"].str.endswith("← this model")].iloc[0]
    assert own["KV cache, all layers"] == human_bytes(expected)


def test_a_window_for_every_layer_is_stated_as_such():
    mistral = kvcache.PRESETS["Mistral 7B (v0.1)"]
    statement = heads_kv_cache.window_statement(mistral, 32768)
    assert "4,096" in statement and "every layer" in statement
    assert heads_kv_cache.window_statement(mistral, 4096) is None  # the whole sequence fits the window
    assert heads_kv_cache.window_statement(kvcache.PRESETS["Llama 3 8B"], 131072) is None


@pytest.mark.parametrize("kind", DECODERS)
def test_what_the_page_says_a_sliding_cache_holds_is_what_transformers_holds(kind):
    """Past the window, Heads and KV cache states what each layer needs (its window) and what transformers' own
    cache holds between two steps: the last W - 1 keys of a sliding layer (the next token's key makes W), or, for
    GPT-Neo, every token (its local layers mask old keys instead of dropping them). Weighed with use_cache=True."""
    from transformers import AutoModel

    config = _windowed_config(kind)
    windows = cache_windows(config)
    if all(w is None for w in windows):
        pytest.skip(f"{kind} reads every key in every layer")
    torch.manual_seed(0)
    model = AutoModel.from_config(config).eval()
    with torch.no_grad():
        cache = model(input_ids=torch.randint(5, 1000, (1, LENGTH)), use_cache=True).past_key_values
    held = [int(layer.keys.shape[-2]) for layer in cache.layers]
    bundle = SimpleNamespace(name=kind, model=SimpleNamespace(config=config), n_layers=len(windows),
                             n_heads=config.num_attention_heads, n_kv_heads=config.num_attention_heads,
                             d_model=config.hidden_size, max_positions=config.max_position_embeddings,
                             architecture="decoder")
    statement = heads_kv_cache.window_statement(heads_kv_cache.checkpoint_config(bundle), LENGTH)
    if kind == "gpt_neo":
        assert held == [LENGTH] * len(held)
        assert "keeps every token" in statement and f"holds all {LENGTH}" in statement
        return
    assert held == [LENGTH if w is None else w - 1 for w in windows]
    assert f"keeps the last {WINDOW - 1} there" in statement
