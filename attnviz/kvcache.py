"""MHA vs GQA vs MQA: who shares keys and values, what the attention weights cost, and how big the KV cache gets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from attnviz.units import DTYPE_BYTES


@dataclass(frozen=True)
class AttentionConfig:
    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    max_positions: int
    source: str = ""
    sliding_window: int | None = None  # a rolling-buffer cache keeps only the last this-many tokens per layer
    architecture: str = "decoder"  # "encoder" (keeps no cache), "decoder" or "encoder-decoder" (the decoder's)

    @property
    def kind(self) -> str:
        if self.n_kv_heads == self.n_heads:
            return "MHA"
        if self.n_kv_heads == 1:
            return "MQA"
        return f"GQA ({self.n_heads // self.n_kv_heads} query heads per K/V head)"


# Published configurations (the models' config.json files / papers).
PRESETS = {
    "Llama 2 70B": AttentionConfig("Llama 2 70B", 80, 8192, 64, 8, 128, 4096, "Touvron et al. 2023; config.json"),
    "Llama 3 8B": AttentionConfig("Llama 3 8B", 32, 4096, 32, 8, 128, 8192, "Meta Llama 3 config.json"),
    "Mistral 7B (v0.1)": AttentionConfig(
        "Mistral 7B (v0.1)", 32, 4096, 32, 8, 128, 32768,
        "Jiang et al. 2023; config.json: sliding_window 4096, so a rolling buffer caches at most 4,096 tokens", 4096,
    ),
    "GPT-2 (124M)": AttentionConfig("GPT-2 (124M)", 12, 768, 12, 12, 64, 1024, "Radford et al. 2019; config.json"),
}


def cached_tokens(config: AttentionConfig, seq_len: int) -> int:
    """How many tokens' K and V the cache holds per sequence: all of them, or the last ``sliding_window`` of them
    (Mistral's rolling buffer: a key older than the window can never be attended to again, so it is overwritten)."""
    return seq_len if config.sliding_window is None else min(seq_len, config.sliding_window)


def kv_cache_bytes(config: AttentionConfig, seq_len: int, batch: int, dtype: str) -> dict[str, float]:
    """K and V for every layer: 2 x layers x kv_heads x head_dim x cached tokens x batch x bytes.

    ``per_token`` is what one more cached token of one sequence costs (all layers); ``cached_tokens`` is the
    number of tokens held per sequence (below ``seq_len`` for a sliding-window cache)."""
    tokens = cached_tokens(config, seq_len)
    per_token = 2 * config.n_layers * config.n_kv_heads * config.head_dim * DTYPE_BYTES[dtype]
    per_layer = per_token / config.n_layers * tokens * batch
    return {"per_layer": per_layer, "total": per_layer * config.n_layers, "per_token": per_token,
            "cached_tokens": tokens}


def beyond_context(config: AttentionConfig, seq_len: int) -> bool:
    """True when ``seq_len`` is longer than the model was trained to read (its cache there is hypothetical)."""
    return seq_len > config.max_positions


def attention_parameters(config: AttentionConfig, bias: bool = False) -> dict[str, int]:
    """Parameters of one layer's attention projections: W_Q, W_K, W_V, W_O."""
    q = config.d_model * config.n_heads * config.head_dim
    kv = config.d_model * config.n_kv_heads * config.head_dim
    o = config.n_heads * config.head_dim * config.d_model
    counts = {"W_Q": q, "W_K": kv, "W_V": kv, "W_O": o}
    if bias:
        counts["W_Q"] += config.n_heads * config.head_dim
        counts["W_K"] += config.n_kv_heads * config.head_dim
        counts["W_V"] += config.n_kv_heads * config.head_dim
        counts["W_O"] += config.d_model
    counts["per layer"] = sum(counts[k] for k in ("W_Q", "W_K", "W_V", "W_O"))
    counts["all layers"] = counts["per layer"] * config.n_layers
    return counts


def with_kv_heads(config: AttentionConfig, n_kv_heads: int) -> AttentionConfig:
    """The same model with another number of K/V heads (MHA: n_heads, MQA: 1)."""
    if n_kv_heads < 1 or config.n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads must divide n_heads ({config.n_heads}), got {n_kv_heads}")
    return dataclasses.replace(config, n_kv_heads=n_kv_heads)


def _head_dim(config, d_model: int, n_heads: int) -> int:
    """The per-head size the model really uses: ``head_dim`` or T5's ``d_kv`` where the config sets one (Qwen3,
    Gemma, T5 differ from d_model / heads), else d_model / heads."""
    for name in ("head_dim", "d_kv"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return d_model // n_heads if n_heads else 0


def config_of_bundle(bundle) -> AttentionConfig:
    """The loaded checkpoint's cache-relevant shape. For an encoder-decoder it is the decoder's (the decoder is
    what caches); an encoder keeps no cache, which ``architecture`` says."""
    config = getattr(bundle.model, "config", None)
    n_layers, n_heads, n_kv_heads = bundle.n_layers, bundle.n_heads, bundle.n_kv_heads
    if bundle.architecture == "encoder-decoder" and config is not None:
        n_layers = int(getattr(config, "decoder_layers", None) or getattr(config, "num_decoder_layers", None)
                       or n_layers)
        n_heads = int(getattr(config, "decoder_attention_heads", None) or n_heads)
        n_kv_heads = n_heads if bundle.n_kv_heads == bundle.n_heads else n_kv_heads
    window = getattr(config, "sliding_window", None)
    return AttentionConfig(bundle.name, n_layers, bundle.d_model, n_heads, n_kv_heads,
                           _head_dim(config, bundle.d_model, n_heads), bundle.max_positions, "the current checkpoint",
                           window if isinstance(window, int) else None, bundle.architecture)


def cross_attention_cache_bytes(config: AttentionConfig, encoder_tokens: int, batch: int, dtype: str) -> float:
    """An encoder-decoder's decoder also keeps the cross-attention K and V of every encoder token, per layer."""
    return 2 * config.n_layers * config.n_kv_heads * config.head_dim * encoder_tokens * batch * DTYPE_BYTES[dtype]
