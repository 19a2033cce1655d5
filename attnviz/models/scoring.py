"""The one score formula: how a model's queries and keys become its attention weights, term by term.

:class:`attnviz.models.record.AttentionRecord` picks a layer's tensors (the heads and query rows asked for) and
hands them here; every view, the what-if and the Scaling and Positional pages get their weights through it, so a
term the model applies (soft-capping, a position bias, a sink) is never left out of one of them.

In order: ``q · k`` times the scaling, soft-capped (Gemma 2: ``softcap * tanh(scores / softcap)``), plus each
additive bias (T5's relative position bias, BLOOM's ALiBi, an ALiBi the Positional page tries), divided by a
temperature (the what-if); then the softmax over the keys the mask allows, with a sink logit (gpt-oss) taking its
share of every row and dropped after it, so those rows sum to less than 1.
"""

from __future__ import annotations

import torch

from attnviz.core.attention import masked_softmax


def logits(q: torch.Tensor, k: torch.Tensor, scale: float, *, softcap: float | None = None,
           biases: tuple[torch.Tensor | None, ...] = (), temperature: float = 1.0) -> torch.Tensor:
    """What the softmax sees, before masking: ``q [heads, rows, d]``, ``k [heads, n_k, d]`` ->
    ``[heads, rows, n_k]``. Each of ``biases`` broadcasts to that shape and is added in turn (None is skipped)."""
    scores = q @ k.transpose(-2, -1) * scale  # [heads, rows, n_k]
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    for bias in biases:
        if bias is not None:
            scores = scores + bias
    return scores / temperature


def weights(scores: torch.Tensor, allowed: torch.Tensor, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The softmax of ``scores [heads, rows, n_k]`` over the ``allowed`` keys (bool, True = may attend; a row
    with none gets zeros), with one sink logit per head (``sinks [heads]``) in every row's softmax when given."""
    if sinks is None:
        return masked_softmax(scores, allowed)
    column = sinks.to(scores.dtype).view(-1, 1, 1).expand(-1, scores.shape[1], 1)  # [heads, rows, 1]
    with_sink = torch.cat([scores.masked_fill(~allowed, float("-inf")), column], dim=-1)  # [heads, rows, n_k + 1]
    return torch.softmax(with_sink, dim=-1)[..., :-1]


def renormalised(model_weights: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """The model's weights with a mask that only takes keys away: a softmax over a subset of its keys is the full
    softmax renormalised over them, exact without Q and K (the eager-weights path)."""
    kept = model_weights * allowed
    return kept / kept.sum(-1, keepdim=True).clamp_min(torch.finfo(kept.dtype).tiny)
