"""The Scaling and softmax page's work on a real head: its own scores with and without the 1/sqrt(d_k)."""

from __future__ import annotations

import math

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


def first_d_k(statistics: list[dict], stat: str | None, holds) -> str:
    """The smallest d_k where ``holds(row[stat])`` (or, with no stat, where the unscaled Jacobian falls below the
    scaled one and stays there), as text."""
    for index, row in enumerate(statistics):
        rest = statistics[index:]
        if stat is None and all(r["jacobian_unscaled"] < r["jacobian_scaled"] for r in rest):
            return f"{row['d_k']:,}"
        if stat is not None and all(holds(r[stat]) for r in rest):
            return f"{row['d_k']:,}"
    return "beyond the largest d_k shown"


def saturation_captions(statistics: list[dict], d_k: int, n_keys: int) -> dict[str, str]:
    """The captions of the saturation section's three charts (entropy, largest weight, the Jacobian's norm), each
    read from ``statistics`` (one row per d_k, scaled and unscaled) at the chosen ``d_k``."""
    at = next(r for r in statistics if r["d_k"] == d_k)
    largest = statistics[-1]
    if at["max_weight_unscaled"] > 0.5:
        one_key = ": without scaling one key takes most of the weight."
    else:
        since = first_d_k(statistics, "max_weight_unscaled", lambda value: value > 0.5)
        one_key = f"; without scaling it grows with d_k (one key takes most of the weight from about d_k = {since})."
    if at["jacobian_unscaled"] < at["jacobian_scaled"] and at["max_weight_unscaled"] > 0.5:
        gradient = (f": saturated (one key takes {at['max_weight_unscaled']:.2f} of the weight on average), the "
                    f"softmax passes {at['jacobian_scaled'] / at['jacobian_unscaled']:.3g}x less gradient to Q and K "
                    "than with scaling.")
    elif at["jacobian_unscaled"] < at["jacobian_scaled"]:
        since = first_d_k(statistics, "max_weight_unscaled", lambda value: value > 0.5)
        gradient = (f". At this d_k the unscaled softmax is sharper but not saturated (its largest weight averages "
                    f"{at['max_weight_unscaled']:.2f}), and its gradient is "
                    f"{at['jacobian_scaled'] / at['jacobian_unscaled']:.3g}x smaller; one key takes most of the weight "
                    f"from about d_k = {since}.")
    else:
        state = ("one key already takes most of the weight without scaling, yet" if at["max_weight_unscaled"] > 0.5
                 else "the unscaled softmax is not yet saturated and")
        gradient = (f". At this d_k {state} its gradient is no smaller; it falls below the scaled one from d_k = "
                    f"{first_d_k(statistics, None, None)}.")
    return {
        "entropy": (f"Scaled: {at['entropy_scaled']:.2f} nats at d_k = {d_k} (the most there can be is log {n_keys} = "
                    f"{math.log(n_keys):.2f}); unscaled: {at['entropy_unscaled']:.2f}, and "
                    f"{largest['entropy_unscaled']:.2f} at d_k = {largest['d_k']}."),
        "max_weight": (f"At d_k = {d_k} the largest weight averages {at['max_weight_unscaled']:.2f} without scaling "
                       f"and {at['max_weight_scaled']:.2f} with it" + one_key),
        "jacobian": (f"Without scaling the Jacobian's norm averages {at['jacobian_unscaled']:.3f} at d_k = {d_k} and "
                     f"{largest['jacobian_unscaled']:.3f} at {largest['d_k']} (scaled: {at['jacobian_scaled']:.3f})"
                     + gradient),
    }
