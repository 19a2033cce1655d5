"""The Positional encodings page's work beyond the core: ALiBi's bias on a checkpoint's own scores, and the
numbers behind what the page says about a learned table, ALiBi's slopes and the toy RoPE head."""

from __future__ import annotations

import dataclasses
import math

import torch

from attnviz import positional
from attnviz.models.capture import AttentionRecord


def alibi_on_real_head(record: AttentionRecord, layer: int, head: int, bias: torch.Tensor):
    """A real head's weights ``[n_q, n_k]`` as the model computes them (its scale, mask, position bias,
    soft-capping and sink: :meth:`AttentionRecord.layer_weights`), and the same with an ALiBi bias ``[n_q, n_k]``
    added to its scores."""
    return record.head_weights(layer, head), record.head_weights(layer, head, extra_bias=bias)


def model_alibi(record: AttentionRecord, layer: int, head: int) -> dict | None:
    """The model's own ALiBi, when the score bias it recorded is one (BLOOM): a bias that is the same for every
    query and linear in the key position, per head. Returns the slopes it implies ``[heads]`` (with the paper's
    for this many heads and whether they agree), the head's bias relative to each query's position ``[n_q, n_k]``
    (−m·distance), and the head's weights with and without the bias; None for any other bias (T5, MPNet) or none."""
    bias = record.biases[layer] if record.biases else None
    if bias is None or record.n_k < 2:
        return None
    # The model stored its bias in its own dtype (bf16 holds 3 significant digits): compare within that rounding
    relative_rounding = 4 * torch.finfo(bias.dtype).eps
    rounding = relative_rounding * float(bias.abs().max()) + 1e-6
    bias = bias.double()  # [heads, n_q, n_k]
    if (bias - bias[:, :1]).abs().max() > rounding:
        return None  # depends on the query: a relative bias, not ALiBi
    keys = torch.arange(record.n_k, dtype=torch.float64)
    slopes = ((bias[:, 0] - bias[:, 0, :1]) @ keys) / (keys @ keys)  # least squares: bias = m * key + c
    fitted = bias[:, 0, :1] + slopes[:, None] * keys  # [heads, n_k]
    if (fitted - bias[:, 0]).abs().max() > 2 * rounding:
        return None  # not linear in the key position
    standard = positional.alibi_slopes(record.n_heads)
    n_q, n_k = record.n_q, record.n_k
    query_position = torch.arange(n_q) + (n_k - n_q)
    relative = bias[head] - bias[head, :, query_position].diagonal()[:, None]  # [n_q, n_k]: m * (j - i)
    relative = relative.masked_fill(~record.mask_rows(layer), float("nan"))  # only where the model attends
    with_bias = record.head_weights(layer, head)
    without = dataclasses.replace(record, biases=[None] * record.n_layers, memo={}).head_weights(layer, head)
    return {"slopes": slopes, "standard": standard,
            "matches_paper": bool(torch.allclose(slopes, standard, rtol=max(1e-3, relative_rounding), atol=1e-7)),
            "bias": relative.float(), "with": with_bias, "without": without,
            "change": float((with_bias - without).abs().max())}


def learned_table_facts(table: torch.Tensor, shown: int) -> dict[str, float]:
    """What the learned tab claims, measured on ``table [positions, d_model]``'s first ``shown`` positions: the
    mean cosine similarity of neighbours and of positions far apart, and how much the similarity-by-distance
    curves from position 0 and from ``shown // 2`` disagree (0 for a purely relative table such as sinusoidal)."""
    part = table[:shown]
    similarity = positional.cosine_similarity_matrix(part)
    far = max(2, shown // 4)
    length = shown // 2
    first, second = (positional.cosine_by_distance(table, origin)[:length] for origin in (0, shown // 2))
    return {
        "near": float(similarity.diagonal(1).mean()),
        "far": float(torch.cat([similarity.diagonal(k) for k in range(far, shown)]).mean()),
        "far_from": far,
        "curves_gap": float((first - second).abs().max()),
    }


def alibi_slopes_caption(n_heads: int) -> str:
    """How the paper's slopes are made for this many heads, with the numbers."""
    slopes = positional.alibi_slopes(n_heads).tolist()
    shown = ", ".join(f"1/{1 / s:.3g}" for s in slopes[:3]) + (f", …, 1/{1 / slopes[-1]:.3g}" if n_heads > 3 else "")
    if math.log2(n_heads).is_integer():
        rule = f"a geometric sequence starting at 2^(−8/{n_heads}) with that ratio"
    else:
        closest = 2 ** math.floor(math.log2(n_heads))
        rule = (f"not a power of two: the {closest} slopes of {closest} heads, then every other slope of "
                f"{2 * closest} heads")
    return f"For {n_heads} heads, {rule}: {shown}. Steep heads look locally, flat ones far."


def repeated_words(tokens: list[str]) -> list[str]:
    """Words that occur more than once (ignoring case), which share Q and K in the toy head."""
    seen, repeated = set(), []
    for token in tokens:
        lowered = token.lower()
        if lowered in seen and lowered not in repeated:
            repeated.append(lowered)
        seen.add(lowered)
    return repeated
