"""The Masks page: a gallery of sparse-attention patterns with their costs, receptive fields, memory, and the
mask-convention bug demonstrated with PyTorch's own SDPA."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F

from attnviz import masks

PATTERNS = {
    "full": ("Full (BERT)", "O(N²)", "Every token attends to every token."),
    "causal": ("Causal (GPT)", "O(N²/2)", "Each token attends to itself and the past."),
    "sliding_causal": ("Sliding window, causal (Mistral)", "O(N·W)", "The last W tokens, itself included."),
    "sliding_bidirectional": (
        "Sliding window, bidirectional (Longformer)", "O(N·W)", "W/2 tokens on each side and itself.",
    ),
    "dilated": ("Dilated sliding window (Longformer)", "O(N·W)", "W keys spaced d apart: a wider reach, same cost."),
    "global_local": (
        "Global + local (Longformer, ETC)", "O(N·(W+G))", "A window, plus G global tokens that see and are seen by all.",
    ),
    "bigbird": ("BigBird (global + window + random)", "O(N·(W+G+R)·b)", "Blocks of b tokens: global, window, random."),
    "lsh": (
        "LSH buckets (Reformer)", "O(N log N)",
        "Tokens attend within the same hash bucket of shared query/key vectors (any of several rounds).",
    ),
}


@dataclass
class Pattern:
    key: str
    name: str
    complexity: str
    description: str
    mask: torch.Tensor  # [n, n] bool, True = may attend
    block_kind: torch.Tensor | None = None  # BigBird's block layout kinds, for drawing

    @property
    def n(self) -> int:
        return self.mask.shape[-1]

    @property
    def scores_computed(self) -> int:
        return int(self.mask.sum())

    @property
    def density(self) -> float:
        return masks.density(self.mask)


def build_pattern(
    key: str,
    n: int,
    *,
    window: int = 3,
    dilation: int = 2,
    global_tokens: int = 1,
    block_size: int = 2,
    global_blocks: int = 1,
    window_blocks: int = 3,
    random_blocks: int = 1,
    n_buckets: int = 4,
    n_rounds: int = 2,
    seed: int = 0,
    vectors: torch.Tensor | None = None,
) -> Pattern:
    """One pattern of :data:`PATTERNS` over ``n`` tokens. ``vectors [n, d]`` feed the LSH pattern."""
    if key not in PATTERNS:
        raise ValueError(f"unknown pattern {key!r}; choose one of {list(PATTERNS)}")
    name, complexity, description = PATTERNS[key]
    block_kind = None
    if key == "full":
        mask = masks.full(n)
    elif key == "causal":
        mask = masks.causal(n)
    elif key == "sliding_causal":
        mask = masks.sliding_window(n, window - 1, 0)
    elif key == "sliding_bidirectional":
        mask = masks.sliding_window(n, window // 2, window // 2)
    elif key == "dilated":
        mask = masks.dilated_sliding_window(n, window, dilation, causal=False)
    elif key == "global_local":
        mask = masks.global_local(n, list(range(min(global_tokens, n))), window // 2, window // 2)
    elif key == "bigbird":
        result = masks.bigbird(n, block_size, global_blocks, window_blocks, random_blocks, seed)
        mask, block_kind = result.mask, result.kind
    else:
        if vectors is None:
            generator = torch.Generator().manual_seed(int(seed) + 7)
            vectors = torch.randn(n, 16, generator=generator)
        mask = masks.lsh(vectors.float(), n_buckets, n_rounds, seed)
    return Pattern(key, name, complexity, description, mask, block_kind)


def receptive_field_summary(mask: torch.Tensor, n_layers: int, query: int) -> torch.Tensor:
    """``[n_layers, n]`` bool: which input tokens can reach ``query`` after 1..n_layers layers."""
    return masks.receptive_field(mask, n_layers)[:, query, :]


from attnviz.kvcache import DTYPE_BYTES  # noqa: E402 - one table of element sizes for the whole package


def human_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if count < 1024 or unit == "PiB":
            return f"{count:.3g} {unit}"
        count /= 1024
    return f"{count:.3g} PiB"


def score_memory_table(key: str, lengths: list[int], dtype: str, heads: int = 1, **params) -> pd.DataFrame:
    """Bytes of the N x N score matrix (per head x batch) for each N: dense, and if only the pairs the pattern
    allows were stored (estimated at that N without building the mask)."""
    size = DTYPE_BYTES[dtype]
    name = PATTERNS[key][0]
    rows = []
    for n in sorted(lengths):
        dense = float(n) * n * size * heads
        share = allowed_pairs_estimate(key, n, **params) / (float(n) * n)
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


def allowed_pairs_estimate(key: str, n: int, *, window: int = 3, dilation: int = 2, global_tokens: int = 1,
                           block_size: int = 2, global_blocks: int = 1, window_blocks: int = 3,
                           random_blocks: int = 1, n_buckets: int = 4, n_rounds: int = 2, **_) -> float:
    """About how many (query, key) pairs a pattern allows at length ``n``, without building the n x n mask."""
    if key == "full":
        return float(n) * n
    if key == "causal":
        return n * (n + 1) / 2
    if key == "sliding_causal":
        w = min(window, n)
        return n * w - w * (w - 1) / 2
    if key == "sliding_bidirectional":
        return float(n) * min(2 * (window // 2) + 1, n)
    if key == "dilated":
        return float(n) * min(2 * window - 1, n)
    if key == "global_local":
        g = min(global_tokens, n)
        return float(n) * min(2 * (window // 2) + 1, n) + 2.0 * g * n
    if key == "bigbird":
        blocks_per_row = global_blocks + window_blocks + random_blocks
        return min(float(n) * n, float(n) * block_size * blocks_per_row + float(global_blocks) * block_size * n)
    if key == "lsh":
        same_bucket = 1 - (1 - 1 / n_buckets) ** n_rounds
        return float(n) * n * same_bucket
    raise ValueError(f"unknown pattern {key!r}")


def apply_to_head(record, layer: int, head: int, mask: torch.Tensor):
    """A real head before, masked without renormalising (rows lose weight), and replayed under the mask
    (renormalised), each ``[n_q, n_k]``; plus the mean share of attention the head loses."""
    from attnviz.explore import what_if

    before, after = what_if(record, layer, mask, unscaled=False)
    cut = record.weights[layer, head] * mask
    return before[head], cut, after[head], float(1 - cut.sum(-1).mean())


def convention_demo_on_head(record, layer: int, head: int, size: int = 8) -> "ConventionDemo":
    """:func:`convention_demo` on a real head's first ``size`` queries and keys."""
    q = record.queries[layer, head, :size].double()
    k = record.keys[layer, head * record.n_kv_heads // record.n_heads, :size].double()
    return convention_demo(q, k)
