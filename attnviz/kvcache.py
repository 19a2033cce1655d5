"""MHA vs GQA vs MQA: who shares keys and values, what the attention weights cost, and how big the KV cache gets."""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int4": 0.5}


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
    "Mistral 7B": AttentionConfig("Mistral 7B", 32, 4096, 32, 8, 128, 32768, "Jiang et al. 2023; config.json"),
    "GPT-2 (124M)": AttentionConfig("GPT-2 (124M)", 12, 768, 12, 12, 64, 1024, "Radford et al. 2019; config.json"),
}


def kv_cache_bytes(config: AttentionConfig, seq_len: int, batch: int, dtype: str) -> dict[str, float]:
    """K and V for every layer: 2 x layers x kv_heads x head_dim x seq x batch x bytes."""
    per_layer = 2 * config.n_kv_heads * config.head_dim * seq_len * batch * DTYPE_BYTES[dtype]
    return {"per_layer": per_layer, "total": per_layer * config.n_layers, "per_token": per_layer * config.n_layers / max(seq_len * batch, 1)}


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
    return AttentionConfig(config.name, config.n_layers, config.d_model, config.n_heads, n_kv_heads, config.head_dim,
                           config.max_positions, config.source)


def config_of_bundle(bundle) -> AttentionConfig:
    head_dim = bundle.d_model // bundle.n_heads if bundle.n_heads else 0
    return AttentionConfig(bundle.name, bundle.n_layers, bundle.d_model, bundle.n_heads, bundle.n_kv_heads, head_dim,
                           bundle.max_positions, "the current checkpoint")
