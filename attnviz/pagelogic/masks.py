"""The Masks page: a gallery of sparse-attention patterns (from :mod:`attnviz.core.mask_patterns`) with their costs,
receptive fields and memory, a pattern applied to a real head, and the mask-convention bug demonstrated with
PyTorch's own SDPA."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F

from attnviz.core import mask_patterns, masks
from attnviz.core.units import DTYPE_BYTES, human_bytes
from attnviz.models.record import AttentionRecord
from attnviz.pagelogic.explore_heads.whatif import what_if


def gallery_patterns() -> tuple[str, ...]:
    """The patterns of the page's gallery: those the registry shows there, in its order."""
    return mask_patterns.shown_in(mask_patterns.GALLERY)


def receptive_field_summary(mask: torch.Tensor, n_layers: int, query: int) -> torch.Tensor:
    """``[n_layers, n]`` bool: which input tokens can reach ``query`` after 1..n_layers layers."""
    return masks.receptive_field(mask, n_layers)[:, query, :]


def receptive_field_rule(key: str, **params) -> str:
    """How the receptive field of pattern ``key`` grows with stacked layers (the registry's own words)."""
    return mask_patterns.reach(key, **params)


def score_memory_table(key: str, lengths: list[int], dtype: str, heads: int = 1, **params) -> pd.DataFrame:
    """Bytes of the N x N score matrix (per heads x batch) for each N: dense, and if only the pairs the pattern
    allows were stored (counted at that N without building the mask; exact for full, causal and windows)."""
    size = DTYPE_BYTES[dtype]
    name = mask_patterns.label(key)
    rows = []
    for n in sorted(lengths):
        dense = float(n) * n * size * heads
        share = mask_patterns.allowed_pairs(key, n, **params) / (float(n) * n)
        rows.append(
            {
                "N": f"{n:,}",
                "dense N×N scores": human_bytes(dense),
                f"{name} (≈)": human_bytes(dense * share),
                "density (≈)": f"{share:.3%}",
                "dense bytes": dense,
            }
        )
    return pd.DataFrame(rows)


def apply_to_head(record: AttentionRecord, layer: int, head: int, mask: torch.Tensor):
    """A real head before, masked without renormalising (rows lose weight), and replayed under the mask
    (renormalised), each ``[n_q, n_k]``; plus the mean share of attention the head loses.

    The pattern is applied on top of the model's own mask (``mask & record.allowed``): a decoder's causal mask
    stays, so no key the model never saw gains weight."""
    combined = mask & record.allowed[layer]  # [n_q, n_k], True = may attend under both
    before, after = what_if(record, layer, combined, unscaled=False)
    cut = record.weights[layer, head] * combined
    return before[head], cut, after[head], float(1 - cut.sum(-1).mean())


def rows_without_keys(record: AttentionRecord, layer: int, mask: torch.Tensor) -> list[int]:
    """The queries that keep no key under both the pattern and the model's own mask: their rows stay empty (all
    zeros), renormalised or not."""
    combined = mask & record.allowed[layer]  # [n_q, n_k]
    return (~combined.any(-1)).nonzero().flatten().tolist()


def real_head_caption(lost: float, empty: list[int], n_rows: int) -> str:
    """What the page says under a pattern applied to a real head: the share of attention lost, and whether the
    renormalised rows fill again (a row with no key left cannot)."""
    start = (f"The pattern is applied on top of the model's own mask. Without renormalising, rows sum to less than 1 "
             f"(this head loses {lost:.1%} of its attention on average)")
    if not empty:
        return start + "; a softmax over the keys both allow makes the kept weights fill each row again."
    if len(empty) == n_rows:
        return start + ("; here no query keeps a key both allow, so every row stays empty (all zeros) even after "
                        "renormalising.")
    which = ("queries " if len(empty) > 1 else "query ") + ", ".join(str(i) for i in empty[:8]) + (
        " …" if len(empty) > 8 else "")
    return start + (f"; a softmax over the keys both allow makes the kept weights fill each row again, except the "
                    f"{len(empty)} of {n_rows} rows that keep no key both allow ({which}): those stay empty (all "
                    "zeros).")


# ---------------------------------------------------------------------------------------------------------------
# The convention bug, shown with torch.nn.functional.scaled_dot_product_attention itself


@dataclass
class ConventionDemo:
    allowed: torch.Tensor  # True = may attend (what SDPA wants)
    masked: torch.Tensor  # True = masked (nn.MultiheadAttention's attn_mask)
    additive: torch.Tensor  # 0 / -inf
    keep_float: torch.Tensor  # 1 = keep, 0 = drop (the textbooks', HF attention_mask)
    weights: dict[str, torch.Tensor]  # name -> [n, n] weights as SDPA computed them
    future_weight: dict[str, float]  # name -> mean weight per query on future keys
    nan_rows: dict[str, int]


def _sdpa_weights(q, k, mask):
    # SDPA returns only the output; with V = identity the output rows ARE the attention weights.
    identity = torch.eye(k.shape[-2], dtype=q.dtype)
    return F.scaled_dot_product_attention(q, k, identity, attn_mask=mask)


def convention_demo(q: torch.Tensor, k: torch.Tensor) -> ConventionDemo:
    """A causal mask in four conventions, each passed as ``attn_mask`` to PyTorch's SDPA, with what leaks.

    ``q, k [n, d]``. Only "True = may attend" and "additive" are right for SDPA; the 0/1 float mask is *added*
    to the scores (nothing is blocked) and the inverted boolean blocks the past instead of the future.
    """
    n = q.shape[0]
    allowed = masks.causal(n)
    cases = {
        "bool, True = may attend": allowed,
        "additive 0 / −∞": masks.to_additive(allowed, q.dtype),
        "float 1 = keep (added!)": allowed.to(q.dtype),
        "bool, True = masked (inverted!)": masks.to_masked_bool(allowed),
    }
    weights = {name: _sdpa_weights(q, k, mask) for name, mask in cases.items()}
    future = torch.ones(n, n, dtype=torch.bool).triu(diagonal=1)
    future_weight = {name: float(torch.nan_to_num(w)[future].sum() / n) for name, w in weights.items()}
    nan_rows = {name: int(torch.isnan(w).any(dim=-1).sum()) for name, w in weights.items()}
    return ConventionDemo(
        allowed=allowed,
        masked=masks.to_masked_bool(allowed),
        additive=masks.to_additive(allowed, q.dtype),
        keep_float=allowed.to(q.dtype),
        weights=weights,
        future_weight=future_weight,
        nan_rows=nan_rows,
    )


def convention_demo_on_head(record: AttentionRecord, layer: int, head: int, size: int = 8) -> ConventionDemo:
    """:func:`convention_demo` on a real head's first ``size`` queries and keys."""
    if not record.replayable:  # eager weights only: seeded stand-in vectors (the page says so)
        generator = torch.Generator().manual_seed(layer * 1000 + head)
        q, k = torch.randn(2, size, 16, generator=generator, dtype=torch.float64)
        return convention_demo(q, k)
    q = record.queries[layer, head, :size].double()
    k = record.keys[layer, head * record.n_kv_heads // record.n_heads, :size].double()
    return convention_demo(q, k)
