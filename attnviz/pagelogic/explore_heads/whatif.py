"""The What-if tab: the model's real Q and K of one layer replayed under another mask (a pattern of the registry
that appears in the what-if), without the 1/√d_k scaling, or at another softmax temperature."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnviz.core import mask_patterns
from attnviz.models.record import AttentionRecord

MODEL_OWN_MASK = "model"  # the what-if keeps the model's own mask


def what_if_masks() -> tuple[str, ...]:
    """The masks the tab offers: the model's own, then the registry's patterns that appear in the what-if."""
    return (MODEL_OWN_MASK, *mask_patterns.shown_in(mask_patterns.WHAT_IF))


def what_if_mask_label(key: str) -> str:
    """How the tab names a mask: the registry's label, or "the model's own"."""
    return "the model's own" if key == MODEL_OWN_MASK else mask_patterns.label(key)


def what_if_mask(key: str, n_q: int, n_k: int, **params) -> torch.Tensor | None:
    """The replacement mask ``[n_q, n_k]`` (bool, True = may attend), or None for the model's own."""
    if key == MODEL_OWN_MASK:
        return None
    offered = what_if_masks()
    if key not in offered:
        raise ValueError(f"unknown what-if mask {key!r}; choose one of {offered}")
    return mask_patterns.build(key, n_q, n_k, **params).mask


def what_if(
    record: AttentionRecord, layer: int, mask: torch.Tensor | None, *, unscaled: bool, temperature: float = 1.0
):
    """Heads of ``layer`` before (the model) and after (our replay with another mask / scale / temperature), each
    ``[heads, n_q, n_k]``. ``mask`` is bool (True = may attend), or None for the model's own."""
    record.check_dense()
    after = record.layer_weights(layer, mask=mask, scale=1.0 if unscaled else None, temperature=temperature)
    return record.weights[layer], after


@dataclass
class WhatIfEffect:
    """What a what-if did to one layer, in numbers for its caption."""

    largest_change: float  # max |after - before| over every head and cell
    gained_on_blocked: float  # mean share of each row the rule moved onto keys the model's own mask blocked
    lost_to_rule: float  # mean share of each row the model had on keys the rule blocks
    scale_is_one: bool  # the model applies no 1/sqrt(d_k) here (T5): removing it changes nothing


def what_if_effect(record: AttentionRecord, layer: int, before: torch.Tensor, after: torch.Tensor,
                   mask: torch.Tensor | None) -> WhatIfEffect:
    """What moved between ``before`` and ``after`` (each ``[heads, n_q, n_k]``) under the rule's ``mask``."""
    blocked_by_model = ~record.allowed[layer]  # [n_q, n_k]
    blocked_by_rule = torch.zeros_like(blocked_by_model) if mask is None else ~mask
    return WhatIfEffect(
        largest_change=(after - before).abs().amax().item(),
        gained_on_blocked=float((after * blocked_by_model).sum(-1).mean()),
        lost_to_rule=float((before * blocked_by_rule).sum(-1).mean()),
        scale_is_one=abs(record.scales[layer] - 1.0) < 1e-12,
    )


def what_if_caption(effect: WhatIfEffect, unscaled: bool, temperature: float = 1.0) -> str:
    """The after-panel's caption: what moved, in the numbers of this layer (never a claim the numbers deny)."""
    parts = []
    if effect.lost_to_rule > 0:
        parts.append(f"keys your rule blocks lose their weight ({effect.lost_to_rule:.1%} of each row on average) and "
                     "the rest is renormalised")
    if effect.gained_on_blocked > 0:
        parts.append(f"keys the model's own mask blocked (the future, in a decoder) now take "
                     f"{effect.gained_on_blocked:.1%} of each row: this is not something the model ever did")
    if unscaled and effect.scale_is_one:
        parts.append("this model applies no 1/√d_k here (T5 folds it into its weights), so removing it changes "
                     "nothing")
    elif unscaled:
        parts.append("without the 1/√d_k the logits grow and the softmax sharpens")
    if temperature != 1.0:
        parts.append(f"T = {temperature:g} divides every logit, so the softmax "
                     + ("flattens" if temperature > 1 else "sharpens"))
    if not parts:
        return "The same rule as the model's: nothing moves."
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."
