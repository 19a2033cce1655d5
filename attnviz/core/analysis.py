"""What heads do: statistics, automatic labels, attention rollout, and the filters the explore page applies.

All functions take attention weights as ``[..., n_q, n_k]`` tensors whose rows sum to 1 (or 0 for a row
with no allowed key).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import numpy as np
import torch

# Thresholds for the automatic labels, shown on the page as they are written here.
LABEL_RULES = {
    "induction head": ("induction", 0.4),
    "duplicate-token head": ("duplicate", 0.4),
    "previous-token head": ("previous", 0.5),
    "next-token head": ("next", 0.5),
    "self head": ("self", 0.5),
    "first-token head": ("first", 0.5),
    "delimiter head": ("separator", 0.5),
    "punctuation head": ("punctuation", 0.4),
}
BROAD_ENTROPY = 0.85  # normalised entropy at or above this: "broad head" (attends almost uniformly)


def is_punctuation(token: str) -> bool:
    """Whether a token is punctuation only (after the tokenizer's space marks): every character in one of Unicode's
    punctuation categories (P*: . , ; : ! ? ' " ( ) [ ] { } - — # % & * / @ \\ _ …, and 。、「」 of other scripts);
    symbols such as + = < > $ ^ | ~ are not punctuation."""
    stripped = token.replace("Ġ", "").replace("▁", "").replace("##", "").strip()
    return bool(stripped) and all(unicodedata.category(ch).startswith("P") for ch in stripped)


TOKEN_CATEGORIES = ("special", "punctuation", "number", "word", "word piece")
_SPACE_MARKS = "Ġ▁␣ "


def token_categories(tokens: list[str], special: list[bool]) -> list[str]:
    """Each token's kind, as the Queries and keys page colours it (``tokens`` as shown or raw pieces):
    a special token ([CLS], <s>, ...), punctuation, a number, the start of a word, or a piece that continues the
    word before it (WordPiece's "##"; where tokens mark a leading space, a piece without one right after a letter or
    digit)."""
    categories = []
    previous = ""
    space_marked = any(token[:1] in _SPACE_MARKS for token in tokens)  # byte-level BPE, SentencePiece: not WordPiece
    for token, is_special in zip(tokens, special, strict=True):
        bare = token.lstrip(_SPACE_MARKS).removeprefix("##")
        if is_special:
            kind = "special"
        elif is_punctuation(token):
            kind = "punctuation"
        elif bare.replace(".", "").replace(",", "").isdigit():
            kind = "number"
        elif token.startswith("##") or (space_marked and token[:1] not in _SPACE_MARKS and previous[-1:].isalnum()):
            kind = "word piece"
        else:
            kind = "word"
        categories.append(kind)
        previous = "" if is_special else token
    return categories


def row_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of each query row, ``[..., n_q]``; 0 * log 0 counts as 0."""
    return torch.special.entr(weights).sum(-1)  # -w log w, 0 at w = 0: one pass over the weights


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
    duplicate: float  # NaN: no query repeats an earlier token
    induction: float
    label: str
    top_key: int = -1  # the key position with the largest mean weight over the queries
    top_key_share: float = 0.0  # that mean weight


STATISTICS = ("entropy", "normalised_entropy", "mean_distance", "self", "previous", "next", "first", "separator",
              "punctuation", "duplicate", "induction")
REPEAT_STATISTICS = ("duplicate", "induction")  # the detectors of repeated tokens (:func:`repeat_targets`)


def repeat_targets(token_ids: list, special: list[bool]) -> dict[str, torch.Tensor]:
    """The keys the repeat detectors look at, ``{name: [n, n] bool}`` indexed (query, key), for a text of tokens
    ``token_ids`` (anything comparable: ids or pieces); special tokens are neither queries nor occurrences.

    * ``duplicate``: the earlier occurrences of the query's token (key j < query i, token j = token i);
    * ``induction``: the token right after such an occurrence (key j + 1, which is at most i): what an induction
      head copies from ("A B ... A" -> B).

    These are TransformerLens's duplicate-token and induction detection patterns (``detect_head``), but a head's
    score here is its weight on them averaged over the queries that have one; TransformerLens divides the same weight
    by every query of the text, so its scores are smaller by the share of queries with a target."""
    n = len(token_ids)
    codes = {token: code for code, token in enumerate(dict.fromkeys(token_ids))}
    ids = torch.tensor([codes[token] for token in token_ids], dtype=torch.long)  # [n]
    ordinary = ~torch.tensor(list(special), dtype=torch.bool) if n else torch.zeros(0, dtype=torch.bool)
    earlier = torch.ones(n, n, dtype=torch.bool).tril(-1)  # [query, key]: key before the query
    duplicate = (ids.unsqueeze(1) == ids.unsqueeze(0)) & earlier & ordinary.unsqueeze(1) & ordinary.unsqueeze(0)
    induction = torch.zeros_like(duplicate)
    induction[:, 1:] = duplicate[:, :-1]  # key j + 1 after an occurrence at j < i: j + 1 <= i
    return {"duplicate": duplicate, "induction": induction}


def row_statistics(weights: torch.Tensor, start: int, separators: torch.Tensor, punctuation: torch.Tensor,
                   dtype: torch.dtype = torch.float64,
                   extra_keys: dict[str, torch.Tensor] | None = None,
                   targets: dict[str, torch.Tensor] | None = None,
                   allowed: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Each query row's statistics of :data:`STATISTICS`, for the rows ``start .. start + rows`` of
    ``weights [heads, rows, n_k]``: ``{name: [heads, rows]}`` in ``dtype``. ``separators`` and ``punctuation`` are
    ``[n_k]`` bools saying which keys are which; ``extra_keys`` names more such sets, whose shares are added under
    their names. ``targets`` (:func:`repeat_targets`, ``[n_q, n_k]`` each) gives the duplicate and induction
    statistics: a row's weight on its targets, NaN for a row without one (None: NaN everywhere). ``allowed``
    (``[rows]`` or ``[heads, rows]``): how many keys each row may see, from the model's mask (default: every key).
    "self", "previous" and "next" are NaN for a row without
    such a key (the first query has no previous token); the normalised entropy is NaN for a row with one allowed
    key (it has no choice: under a causal mask, the first query)."""
    weights = weights.to(dtype)  # [heads, rows, n_k]
    heads, rows, n_k = weights.shape
    positions = torch.arange(start, start + rows)
    entropy = row_entropy(weights)  # [heads, rows]
    if allowed is None:
        allowed = torch.full((rows,), n_k)
    allowed = allowed.expand(heads, rows)
    distance = (positions.unsqueeze(1) - torch.arange(n_k).unsqueeze(0)).abs().to(dtype)  # [rows, n_k]
    values = {
        "entropy": entropy,
        "normalised_entropy": torch.where(allowed > 1, entropy / allowed.clamp_min(2).to(dtype).log(),
                                          torch.full_like(entropy, float("nan"))),
        "mean_distance": (weights * distance).sum(-1),
        "first": weights[..., 0],
    }
    sets = {"separator": separators, "punctuation": punctuation, **(extra_keys or {})}
    shares = weights @ torch.stack(list(sets.values()), dim=1).to(dtype)  # [heads, rows, sets]: one pass for all
    values.update({name: shares[..., i] for i, name in enumerate(sets)})
    for name, offset in (("self", 0), ("previous", -1), ("next", 1)):
        values[name] = _diagonal_rows(weights, start + offset)
    for name in REPEAT_STATISTICS:
        if targets is None:
            values[name] = torch.full_like(entropy, float("nan"))
            continue
        target = targets[name][start:start + rows]  # [rows, n_k]
        on_target = torch.einsum("hrk,rk->hr", weights, target.to(dtype))  # [heads, rows]
        values[name] = torch.where(target.any(-1), on_target, torch.full_like(on_target, float("nan")))
    return values


def _diagonal_rows(weights: torch.Tensor, offset: int) -> torch.Tensor:
    """``[heads, rows]``: each row ``r``'s weight on key ``r + offset`` of ``weights [heads, rows, n_k]``, NaN
    for a row without that key."""
    heads, rows, n_k = weights.shape
    picked = weights.new_full((heads, rows), float("nan"))
    first, last = max(0, -offset), min(rows, n_k - offset)  # the rows whose key exists
    if last > first:
        picked[:, first:last] = torch.diagonal(weights, offset, dim1=-2, dim2=-1)[:, :last - first]
    return picked


class StatisticsAccumulator:
    """The statistics of :class:`HeadStats` for the heads of one layer, accumulated one block of query rows at a
    time, so a long input never needs a head's whole ``N x N`` matrix: every statistic is a mean over rows (over
    the rows that have the key it asks about, for "self", "previous" and "next").

    ``add(start, weights)`` takes the rows ``start .. start + rows`` of every head, ``[heads, rows, n_k]``.
    """

    def __init__(self, n_heads: int, tokens: list[str], special: list[bool], separators: list[bool] | None = None,
                 token_ids: list | None = None):
        n_k = len(tokens)
        self.n_heads, self.n_k = n_heads, n_k
        self.separators = separator_keys(special, separators)
        self.punctuation = torch.tensor([is_punctuation(t) for t in tokens], dtype=torch.bool)
        self.targets = repeat_targets(token_ids if token_ids is not None else tokens, special)
        self.sums = {name: torch.zeros(n_heads, dtype=torch.float64) for name in STATISTICS}
        self.counts = {name: torch.zeros(n_heads, dtype=torch.int64) for name in STATISTICS}
        self.rows = 0
        self.key_sums = torch.zeros(n_heads, n_k, dtype=torch.float64)  # weight each key received, summed over rows

    def add(self, start: int, weights: torch.Tensor, allowed: torch.Tensor | None = None) -> None:
        """``allowed``: ``[rows]``, how many keys each row may see (the layer's mask; default: every key)."""
        for name, value in row_statistics(weights, start, self.separators, self.punctuation,
                                          targets=self.targets, allowed=allowed).items():
            present = ~value.isnan()  # [heads, rows]
            self.sums[name] += torch.where(present, value, torch.zeros_like(value)).sum(-1)
            self.counts[name] += present.sum(-1)
        self.rows += weights.shape[1]
        self.key_sums += weights.double().sum(1)

    def result(self, layer: int) -> list[HeadStats]:
        # NaN where no row has the statistic (no repeated token, every row with one key)
        means = {name: self.sums[name] / self.counts[name].where(self.counts[name] > 0, torch.zeros_like(
            self.counts[name])).double() for name in STATISTICS}
        key_means = self.key_sums / max(self.rows, 1)  # [heads, n_k]
        top_share, top_key = key_means.max(-1)
        chosen = self.counts["normalised_entropy"]  # [heads]: rows with more than one allowed key
        stats = []
        for head in range(self.n_heads):
            values = {name: float(means[name][head]) for name in STATISTICS}
            label = label_head(values) if chosen[head] >= MIN_LABELLED_QUERIES else UNLABELLED
            stats.append(HeadStats(layer=layer, head=head, label=label, top_key=int(top_key[head]),
                                   top_key_share=float(top_share[head]), **values))
        return stats


MIN_LABELLED_QUERIES = 2  # a head is labelled on a text where at least this many queries had more than one key
UNLABELLED = "too short to label"


def separator_keys(special: list[bool], separators: list[bool] | None = None) -> torch.Tensor:
    """``[n_k]`` bool: the "separator" statistic's keys: ``separators`` where the tokenizer says which tokens end a
    sentence or a text ([SEP], </s>, <|endoftext|>; :meth:`attnviz.models.record.Capture.separators_of`), else every
    special token but the first. Never the first token (where [CLS] and <s> stand)."""
    flags = separators if separators is not None else special
    return torch.tensor([bool(flag) and j != 0 for j, flag in enumerate(flags)], dtype=torch.bool)


def head_statistics(weights: torch.Tensor, tokens: list[str], special: list[bool],
                    separators: list[bool] | None = None, allowed: torch.Tensor | None = None) -> list[HeadStats]:
    """Statistics and a label for every head of square self-attention ``weights [layers, heads, n, n]``;
    ``allowed``: ``[layers, n]``, how many keys each query may see (default: every key)."""
    layers, heads, n_q, n_k = weights.shape
    if n_q != n_k or len(tokens) != n_k:
        raise ValueError(f"head_statistics needs square self-attention over the tokens, got {tuple(weights.shape)}")
    result = []
    for layer in range(layers):
        accumulator = StatisticsAccumulator(heads, tokens, special, separators)
        accumulator.add(0, weights[layer], None if allowed is None else allowed[layer])
        result += accumulator.result(layer)
    return result


# ---------------------------------------------------------------------------------------------------------------
# Pooling: a long input's N x N weights drawn as a fixed number of cells


POOLINGS = ("max", "mean")


def bins(n: int, size: int) -> torch.Tensor:
    """The cell each of ``n`` positions falls in when drawn as ``min(n, size)`` cells: ``[n]`` ints, even runs."""
    cells = min(n, size)
    return torch.arange(n) * cells // n


def bin_edges(n: int, size: int) -> list[tuple[int, int]]:
    """``(first, last)`` position of each cell of :func:`bins`."""
    cell_of = bins(n, size).tolist()
    edges: dict[int, list[int]] = {}
    for position, cell in enumerate(cell_of):
        edges.setdefault(cell, [position, position])[1] = position
    return [tuple(edges[cell]) for cell in sorted(edges)]


class Pooler:
    """Pools ``[..., rows, cols]`` blocks into ``[..., n_row_cells, n_col_cells]`` by max or mean, streamed by
    rows: ``add(values, row_cells)`` with each row's cell, ``result()`` at the end."""

    def __init__(self, leading: tuple[int, ...], n_row_cells: int, col_cells: torch.Tensor, how: str):
        if how not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {how!r}")
        self.how, self.col_cells = how, col_cells
        self.n_col_cells = int(col_cells.max()) + 1 if len(col_cells) else 0
        shape = (*leading, n_row_cells, self.n_col_cells)
        fill = float("-inf") if how == "max" else 0.0
        self.values = torch.full(shape, fill, dtype=torch.float32)
        self.counts = torch.zeros(n_row_cells, self.n_col_cells, dtype=torch.float32)
        self.col_sizes = torch.bincount(col_cells, minlength=self.n_col_cells).float()

    def add(self, values: torch.Tensor, row_cells: torch.Tensor) -> None:
        values = values.float()  # [..., rows, cols]
        index = self.col_cells.expand(*values.shape[:-1], -1)
        reduced = torch.full((*values.shape[:-1], self.n_col_cells), float("-inf") if self.how == "max" else 0.0)
        reduced.scatter_reduce_(-1, index, values, reduce="amax" if self.how == "max" else "sum")  # [..., rows, cc]
        rows = row_cells.view(*([1] * (reduced.dim() - 2)), -1, 1).expand_as(reduced)  # each row's cell
        if self.how == "max":
            self.values.scatter_reduce_(-2, rows, reduced, reduce="amax")
        else:
            self.values.scatter_add_(-2, rows, reduced)
            self.counts.index_add_(0, row_cells, self.col_sizes.expand(len(row_cells), -1).contiguous())

    def result(self) -> torch.Tensor:
        if self.how == "max":
            return self.values
        return self.values / self.counts.clamp_min(1)


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


def label_heads(values: dict[str, np.ndarray]) -> list[str]:
    """:func:`label_head` for many heads at once: ``values`` maps each statistic to an array over the heads."""
    names = [*LABEL_RULES, "broad head", "mixed"]
    return [names[index] for index in label_indices(values).tolist()]


def label_indices(values: dict[str, np.ndarray]) -> np.ndarray:
    """:func:`label_heads` as indices into ``[*LABEL_RULES, "broad head", "mixed"]``."""
    heads = len(values["normalised_entropy"])
    best = np.full(heads, -1)
    best_value = np.full(heads, -np.inf)
    names = list(LABEL_RULES)
    for index, (stat, threshold) in enumerate(LABEL_RULES.values()):
        value = np.asarray(values[stat], dtype=np.float64)
        wins = (value >= threshold) & (value > best_value)  # strictly larger: the earlier rule keeps a tie
        best = np.where(wins, index, best)
        best_value = np.where(wins, value, best_value)
    broad = np.asarray(values["normalised_entropy"]) >= BROAD_ENTROPY
    return np.where(best >= 0, best, np.where(broad, len(names), len(names) + 1))


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

