"""The Scaling and softmax page's work on a real head: its own scores with and without the 1/sqrt(d_k)."""

from __future__ import annotations

import torch

from attnviz.attention import masked_softmax
from attnviz.models.capture import AttentionRecord, head_scores


def real_head_scalings(record: AttentionRecord, layer: int, head: int, temperature: float) -> dict[str, torch.Tensor]:
    """A real head's weights with the model's scaling, without it, and with the model's scaling over a temperature."""
    raw, allowed = head_scores(record, layer, head)
    scale = record.scales[layer]
    return {
        f"model (× {scale:.3g})": masked_softmax(raw * scale, allowed),
        "no scaling": masked_softmax(raw, allowed),
        f"model scale, T = {temperature:g}": masked_softmax(raw * scale / temperature, allowed),
    }
