"""The Scaling and softmax page's work on a real head: its own scores with and without the 1/sqrt(d_k)."""

from __future__ import annotations

import torch

from attnviz.models.capture import AttentionRecord


def real_head_scalings(record: AttentionRecord, layer: int, head: int, temperature: float) -> dict[str, torch.Tensor]:
    """A real head's weights ``[n_q, n_k]`` with the model's scaling, without it, and with the model's scaling over
    a temperature, each as the model computes its weights (:meth:`AttentionRecord.layer_weights`): any position
    bias (T5), soft-capping (Gemma 2) and attention sink (gpt-oss) are kept in all three."""
    scale = record.scales[layer]
    return {
        f"model (× {scale:.3g})": record.head_weights(layer, head),
        "no scaling": record.head_weights(layer, head, scale=1.0),
        f"model scale, T = {temperature:g}": record.head_weights(layer, head, temperature=temperature),
    }


def mean_largest_weight(weights: torch.Tensor, allowed: torch.Tensor) -> float:
    """The largest weight per row, averaged over the rows that may see at least two keys (a causal head's first
    row sees one key and is one-hot whatever the scaling)."""
    rows = allowed.sum(-1) >= 2
    return float(weights.amax(-1)[rows].mean()) if rows.any() else float("nan")
