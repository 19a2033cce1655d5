"""The "Heads and KV cache" page: MHA / GQA / MQA variants of a configuration and their caches, and a small
encoder-decoder example (queries from one text, keys and values from another of a different length)."""

from __future__ import annotations

import pandas as pd
import torch

from attnviz import kvcache
from attnviz.attention import CrossAttention
from attnviz.models.loading import FallbackTokenizer
from attnviz.units import human_bytes


def token_embeddings(bundle, text: str, limit: int = 32) -> tuple[list[str], torch.Tensor]:
    """The model's own input embeddings of ``text``'s tokens (no special tokens), ``[n, d_model]``."""
    if isinstance(bundle.tokenizer, FallbackTokenizer):
        tokens = bundle.tokenizer.tokenize(text)[:limit]
        ids = bundle.tokenizer.ids(tokens, text)[:limit]
    else:
        ids = bundle.tokenizer(text, add_special_tokens=False)["input_ids"][:limit]
        tokens = bundle.tokenizer.convert_ids_to_tokens(ids)
    if not ids:
        raise ValueError("type at least one word in each text")
    with torch.no_grad():
        embeddings = bundle.model.get_input_embeddings()(torch.tensor(ids)).float()
    return tokens, embeddings


def cross_attention_example(bundle, source: str, target: str, n_heads: int = 1, projections: str = "identity",
                            seed: int = 0) -> dict:
    """Run :class:`attnviz.attention.CrossAttention` with the target text's embeddings as queries and the
    source text's as keys and values.

    ``projections="identity"``: W_Q = W_K = W_V = W_O = I, so a head attends by embedding similarity on its slice
    of dimensions (words with related meanings align). ``"random"``: seeded random projections, as an untrained
    layer has. Returns tokens, weights ``[heads, n_target, n_source]`` and whether they are all finite.
    """
    source_tokens, memory = token_embeddings(bundle, source)
    target_tokens, queries = token_embeddings(bundle, target)
    d_model = memory.shape[-1]
    if d_model % n_heads:
        raise ValueError(f"{n_heads} heads do not divide d_model = {d_model}")
    torch.manual_seed(int(seed))
    layer = CrossAttention(d_model, n_heads, norm_first=False).eval()
    if projections == "identity":
        with torch.no_grad():
            for linear in (layer.attention.w_q, layer.attention.w_k, layer.attention.w_v, layer.attention.w_o):
                linear.weight.copy_(torch.eye(d_model))
    elif projections != "random":
        raise ValueError("projections must be 'identity' or 'random'")
    normalise = lambda x: x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6) * d_model**0.5  # noqa: E731
    with torch.no_grad():
        _, weights = layer(normalise(queries).unsqueeze(0), normalise(memory).unsqueeze(0))
    return {"source_tokens": source_tokens, "target_tokens": target_tokens, "weights": weights[0],
            "finite": bool(torch.isfinite(weights).all())}


# ---------------------------------------------------------------------------------------------------------------
# MHA, GQA and MQA variants of one configuration


def variants_of(config: kvcache.AttentionConfig) -> dict[str, int]:
    """MHA, this model's GQA (or a middle one) and MQA: name -> number of K/V heads."""
    if config.n_kv_heads not in (1, config.n_heads):
        return {"MHA": config.n_heads, f"GQA ({config.n_kv_heads} K/V)": config.n_kv_heads, "MQA": 1}
    middle = [d for d in range(2, config.n_heads) if config.n_heads % d == 0]
    if middle:
        chosen = middle[len(middle) // 2]
        return {"MHA": config.n_heads, f"GQA ({chosen} K/V)": chosen, "MQA": 1}
    return {"MHA": config.n_heads, "MQA": 1} if config.n_heads > 1 else {"MHA": 1}


def cache_table(config: kvcache.AttentionConfig, seq_len: int, batch: int, dtype: str) -> pd.DataFrame:
    """One row per variant: K/V heads, cache per layer and in all, per token of one sequence, parameters."""
    rows = []
    for name, kv_heads in variants_of(config).items():
        variant = kvcache.with_kv_heads(config, kv_heads)
        cache = kvcache.kv_cache_bytes(variant, seq_len, batch, dtype)
        parameters = kvcache.attention_parameters(variant)
        rows.append(
            {
                "variant": name + (" ← this model" if kv_heads == config.n_kv_heads else ""),
                "K/V heads": kv_heads,
                "KV cache per layer": human_bytes(cache["per_layer"]),
                "KV cache, all layers": human_bytes(cache["total"]),
                "per cached token": human_bytes(cache["per_token"]),
                "attention parameters per layer": f"{parameters['per layer'] / 1e6:.3g}M",
                "total bytes": cache["total"],
            }
        )
    return pd.DataFrame(rows)
