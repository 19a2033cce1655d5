"""A small encoder-decoder example: queries from one text, keys and values from another of a different length."""

from __future__ import annotations

import torch

from attnviz.attention import CrossAttention
from attnviz.models.loading import FallbackTokenizer


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
    layer has. Returns tokens and weights ``[heads, n_target, n_source]``.
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
    return {"source_tokens": source_tokens, "target_tokens": target_tokens, "weights": weights[0]}
