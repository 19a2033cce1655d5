"""What heads do: statistics, automatic labels, attention rollout, and the filters the explore page applies.

All functions take attention weights as ``[..., n_q, n_k]`` tensors whose rows sum to 1 (or 0 for a row
with no allowed key).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PUNCTUATION_CHARACTERS = set(".,;:!?-—–'\"()[]{}…«»“”‘’")

# Thresholds for the automatic labels, shown on the page as they are written here.
LABEL_RULES = {
    "previous-token head": ("previous", 0.5),
    "next-token head": ("next", 0.5),
    "self head": ("self", 0.5),
    "first-token head": ("first", 0.5),
    "delimiter head": ("separator", 0.5),
    "punctuation head": ("punctuation", 0.4),
}
BROAD_ENTROPY = 0.85  # normalised entropy at or above this: "broad head" (attends almost uniformly)


def is_punctuation(token: str) -> bool:
    stripped = token.replace("Ġ", "").replace("▁", "").replace("##", "").strip()
    return bool(stripped) and all(ch in PUNCTUATION_CHARACTERS for ch in stripped)


def row_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of each query row, ``[..., n_q]``; 0 * log 0 counts as 0."""
    logs = torch.where(weights > 0, weights.clamp_min(1e-30).log(), torch.zeros_like(weights))
    return -(weights * logs).sum(-1)


def mean_attended_distance(weights: torch.Tensor) -> torch.Tensor:
    """For each head: mean over queries of sum_j w_ij |i - j| (positions), ``[...]``."""
    n_q, n_k = weights.shape[-2:]
    offset = n_k - n_q  # queries aligned to the end of the keys (decoder with a cache)
    distance = (torch.arange(n_q).unsqueeze(1) + offset - torch.arange(n_k).unsqueeze(0)).abs().to(weights.dtype)
    return (weights * distance).sum(-1).mean(-1)


def _diagonal_share(weights: torch.Tensor, offset: int) -> torch.Tensor:
    """Mean over the queries that have such a key of w[i, i + offset], ``[...]``."""
    diagonal = torch.diagonal(weights, offset=offset, dim1=-2, dim2=-1)
    return diagonal.mean(-1) if diagonal.shape[-1] else torch.zeros(weights.shape[:-2])


@dataclass(frozen=True)
class HeadStats:
    layer: int
    head: int
    entropy: float  # mean row entropy, nats
    normalised_entropy: float  # entropy / log(number of keys each row may see), in [0, 1]
    mean_distance: float
    self: float
    previous: float
    next: float
    first: float
    separator: float
    punctuation: float
    label: str


def head_statistics(weights: torch.Tensor, tokens: list[str], special: list[bool]) -> list[HeadStats]:
    """Statistics and a label for every head of square self-attention ``weights [layers, heads, n, n]``."""
    layers, heads, n_q, n_k = weights.shape
    if n_q != n_k or len(tokens) != n_k:
        raise ValueError(f"head_statistics needs square self-attention over the tokens, got {tuple(weights.shape)}")
    weights = weights.double()
    entropy = row_entropy(weights)  # [layers, heads, n]
    keys_seen = (weights > 0).sum(-1).clamp_min(1).double()
    max_entropy = torch.where(keys_seen > 1, keys_seen.log(), torch.ones_like(keys_seen))
    normalised = torch.where(keys_seen > 1, entropy / max_entropy, torch.zeros_like(entropy)).mean(-1)
    separator_ids = [j for j in range(n_k) if special[j] and j != 0]
    punctuation_ids = [j for j, t in enumerate(tokens) if is_punctuation(t)]
    stats = {
        "entropy": entropy.mean(-1),
        "normalised_entropy": normalised,
        "mean_distance": mean_attended_distance(weights),
        "self": _diagonal_share(weights, 0),
        "previous": _diagonal_share(weights, -1),
        "next": _diagonal_share(weights, 1),
        "first": weights[..., 0].mean(-1),
        "separator": weights[..., separator_ids].sum(-1).mean(-1) if separator_ids else torch.zeros(layers, heads),
        "punctuation": (
            weights[..., punctuation_ids].sum(-1).mean(-1) if punctuation_ids else torch.zeros(layers, heads)
        ),
    }
    result = []
    for layer in range(layers):
        for head in range(heads):
            values = {name: float(tensor[layer, head]) for name, tensor in stats.items()}
            result.append(HeadStats(layer=layer, head=head, label=label_head(values), **values))
    return result


def label_head(values: dict) -> str:
    """The first rule of :data:`LABEL_RULES` whose share reaches its threshold; else broad or mixed."""
    best = None
    for label, (stat, threshold) in LABEL_RULES.items():
        if values[stat] >= threshold and (best is None or values[stat] > values[LABEL_RULES[best][0]]):
            best = label
    if best:
        return best
    if values["normalised_entropy"] >= BROAD_ENTROPY:
        return "broad head"
    return "mixed"


def average_heads(weights: torch.Tensor) -> torch.Tensor:
    """``[layers, heads, n_q, n_k]`` -> ``[layers, n_q, n_k]``: mean over heads."""
    return weights.mean(dim=1)


def attention_rollout(weights: torch.Tensor, residual: float = 0.5) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema, 2020) through all layers: ``[layers, heads, n, n]`` -> ``[layers, n, n]``.

    Each layer's head-average is mixed with the identity (the residual stream), rows renormalised, and the
    layers multiplied: entry ``[l, i, j]`` is how much input token ``j`` flows into position ``i`` after layer ``l``.
    """
    averaged = average_heads(weights.double())
    n = averaged.shape[-1]
    identity = torch.eye(n, dtype=averaged.dtype)
    rolled = identity
    result = []
    for layer_weights in averaged:
        mixed = residual * identity + (1 - residual) * layer_weights
        mixed = mixed / mixed.sum(-1, keepdim=True)
        rolled = mixed @ rolled
        result.append(rolled)
    return torch.stack(result).to(weights.dtype)


def keep_tokens(weights: torch.Tensor, query_keep: list[int], key_keep: list[int], renormalise: bool) -> torch.Tensor:
    """Restrict ``[..., n_q, n_k]`` to some queries and keys; optionally renormalise rows to sum to 1 again."""
    subset = weights[..., query_keep, :][..., key_keep]
    if renormalise:
        totals = subset.sum(-1, keepdim=True)
        subset = torch.where(totals > 0, subset / totals.clamp_min(1e-30), subset)
    return subset


def segment_indices(segments: list[int], which: str) -> list[int]:
    """Token positions of sentence "A" or "B"."""
    wanted = 0 if which == "A" else 1
    return [i for i, s in enumerate(segments) if s == wanted]

