"""The Scaling and softmax page's work on a real head: its own scores with and without the 1/sqrt(d_k)."""

from __future__ import annotations

import torch

from attnviz.attention import masked_softmax
from attnviz.models.capture import AttentionRecord, head_bias, head_scores


def real_head_scalings(record: AttentionRecord, layer: int, head: int, temperature: float) -> dict[str, torch.Tensor]:
    """A real head's weights with the model's scaling, without it, and with the model's scaling over a temperature.
    Any position bias the model adds (T5) is kept in all three."""
    raw, allowed = head_scores(record, layer, head)
    scale, bias = record.scales[layer], head_bias(record, layer, head)
    return {
        f"model (× {scale:.3g})": masked_softmax(raw * scale + bias, allowed),
        "no scaling": masked_softmax(raw + bias, allowed),
        f"model scale, T = {temperature:g}": masked_softmax((raw * scale + bias) / temperature, allowed),
    }


def mean_largest_weight(weights: torch.Tensor, allowed: torch.Tensor) -> float:
    """The largest weight per row, averaged over the rows that may see at least two keys (a causal head's first
    row sees one key and is one-hot whatever the scaling)."""
    rows = allowed.sum(-1) >= 2
    return float(weights.amax(-1)[rows].mean()) if rows.any() else float("nan")
