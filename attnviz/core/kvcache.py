"""MHA vs GQA vs MQA: who shares keys and values, what the attention weights cost, and how big the KV cache gets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from attnviz.core.units import DTYPE_BYTES


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
    sliding_window: int | None = None  # every layer's window (Mistral): a rolling buffer keeps the last this-many
    architecture: str = "decoder"  # "encoder" (keeps no cache), "decoder" or "encoder-decoder" (the decoder's)
    # Per layer, its window (None: the layer reads every key); set for models that mix sliding and full layers
    # (Gemma 2 and 3, gpt-oss: read from the checkpoint by attnviz.models.layer_facts). Overrides sliding_window.
    layer_windows: tuple[int | None, ...] | None = None
    # What its cache implementation holds, where that is more than the windows need: GPT-Neo's cache in
    # transformers keeps every token and masks the old ones on its local layers (measured).
    cache_keeps_every_token: bool = False

    @property
    def windows(self) -> tuple[int | None, ...]:
        """Each layer's window (None: full attention, it caches every token)."""
        if self.layer_windows is not None:
            return tuple(self.layer_windows)
        return (self.sliding_window,) * self.n_layers

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


def layer_tokens(config: AttentionConfig, seq_len: int) -> list[int]:
    """How many tokens' K and V each layer's cache holds per sequence: all of them, or the last ``window`` of them
    on a sliding-window layer (Mistral's rolling buffer: a key older than the window can never be attended to
    again, so it is overwritten)."""
    return [seq_len if window is None else min(seq_len, window) for window in config.windows]


def cached_tokens(config: AttentionConfig, seq_len: int) -> int:
    """The most tokens any layer's cache holds per sequence (``seq_len`` when one layer attends to every token)."""
    return max(layer_tokens(config, seq_len), default=0)


def kv_cache_bytes(config: AttentionConfig, seq_len: int, batch: int, dtype: str) -> dict:
    """K and V for every layer: the sum over layers of 2 x kv_heads x head_dim x the layer's cached tokens x batch x
    bytes (a sliding-window layer caches at most its window).

    ``layers``: each layer's bytes; ``per_layer``: the largest of them (a layer that caches every token);
    ``per_token`` is what one more cached token of one sequence costs when every layer stores it (all layers);
    ``cached_tokens`` the most tokens a layer holds per sequence, ``layer_tokens`` each layer's."""
    tokens = layer_tokens(config, seq_len)
    per_token = 2 * config.n_layers * config.n_kv_heads * config.head_dim * DTYPE_BYTES[dtype]
    per_token_layer = 2 * config.n_kv_heads * config.head_dim * DTYPE_BYTES[dtype]
    layers = [per_token_layer * held * batch for held in tokens]
    return {"layers": layers, "per_layer": max(layers, default=0), "total": sum(layers), "per_token": per_token,
            "cached_tokens": max(tokens, default=0), "layer_tokens": tokens}


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


def config_of_bundle(bundle, layer_windows: tuple[int | None, ...] | None = None) -> AttentionConfig:
    """The loaded checkpoint's cache-relevant shape. For an encoder-decoder it is the decoder's (the decoder is
    what caches); an encoder keeps no cache, which ``architecture`` says. ``layer_windows``: each layer's window
    as the checkpoint's config says (:func:`attnviz.models.layer_facts.cache_windows`); None: every layer caches
    every token."""
    config = getattr(bundle.model, "config", None)
    n_layers, n_heads, n_kv_heads = bundle.n_layers, bundle.n_heads, bundle.n_kv_heads
    if bundle.architecture == "encoder-decoder" and config is not None:
        n_layers = int(getattr(config, "decoder_layers", None) or getattr(config, "num_decoder_layers", None)
                       or n_layers)
        n_heads = int(getattr(config, "decoder_attention_heads", None) or n_heads)
        n_kv_heads = n_heads if bundle.n_kv_heads == bundle.n_heads else n_kv_heads
    if layer_windows is not None and len(layer_windows) != n_layers:
        raise ValueError(f"{len(layer_windows)} layer windows for {n_layers} layers")
    return AttentionConfig(bundle.name, n_layers, bundle.d_model, n_heads, n_kv_heads,
                           _head_dim(config, bundle.d_model, n_heads), bundle.max_positions, "the current checkpoint",
                           None, bundle.architecture,
                           None if layer_windows is None else tuple(layer_windows))


def cross_attention_cache_bytes(config: AttentionConfig, encoder_tokens: int, batch: int, dtype: str) -> float:
    """An encoder-decoder's decoder also keeps the cross-attention K and V of every encoder token, per layer."""
    return 2 * config.n_layers * config.n_kv_heads * config.head_dim * encoder_tokens * batch * DTYPE_BYTES[dtype]
