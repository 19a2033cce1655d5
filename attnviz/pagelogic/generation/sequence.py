"""The Generation page's view of the whole sequence: one head's attention for every query of the prompt and of the
generated tokens (one cache-free forward pass), where a previous-token head draws the diagonal below the main one
and an induction head, on a repeated text, a stripe to the token after each earlier occurrence; and the tokens as
labels a reader can tell apart (visible marks for spaces, newlines and bytes; the id where two still read alike).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnviz.core import analysis, circuits
from attnviz.core.tokens_display import piece_note, readable_token, tokenizer_style
from attnviz.pagelogic.generation.decode import Generation
from attnviz.viz.style import token_labels

POOL_LIMIT = 256  # queries and keys a side drawn as they are; a longer sequence is max-pooled to this many cells


# ---------------------------------------------------------------------------------------------------------------
# Tokens as labels


def readable_labels(tokenizer, ids: list[int]) -> list[str]:
    """Each token of ``ids`` as readable text: the tokenizer's own piece with visible marks
    (:func:`attnviz.core.tokens_display.readable_token`)."""
    if not hasattr(tokenizer, "convert_ids_to_tokens"):
        return [readable_token(tokenizer.decode([i]), "plain") for i in ids]
    style = tokenizer_style(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens([int(i) for i in ids])
    return [readable_token(piece if piece is not None else "", style) for piece in pieces]


def raw_pieces(tokenizer, ids: list[int]) -> list[str]:
    """The tokenizer's own piece of each token of ``ids`` (what hovers add beside the readable label)."""
    if not hasattr(tokenizer, "convert_ids_to_tokens"):
        return [tokenizer.decode([i]) for i in ids]
    return [piece if piece is not None else "" for piece in tokenizer.convert_ids_to_tokens([int(i) for i in ids])]


def piece_notes(tokenizer, ids: list[int]) -> list[str]:
    """Each token's raw piece and id, as a hover's note (:func:`attnviz.core.tokens_display.piece_note`)."""
    return [piece_note(piece, int(i)) for piece, i in zip(raw_pieces(tokenizer, ids), ids, strict=True)]


def whole_characters(tokenizer, ids: list[int]) -> str:
    """``ids`` (a window of a longer text) decoded, without the pieces of characters whose other bytes lie outside
    the window (which decode as "\ufffd")."""
    return tokenizer.decode(ids, skip_special_tokens=True).strip("\ufffd")


def distinct_labels(labels: list[str], ids: list[int]) -> list[str]:
    """``labels`` of the tokens ``ids`` with ``" #id"`` added where different ids read alike, so that no two
    different tokens share a label (the same id keeps its label)."""
    ids_of: dict[str, set[int]] = {}
    for label, token_id in zip(labels, ids, strict=True):
        ids_of.setdefault(label, set()).add(int(token_id))
    return [f"{label} #{token_id}" if len(ids_of[label]) > 1 else label
            for label, token_id in zip(labels, ids, strict=True)]


def top_token_bars(tokenizer, top: list[tuple[int, float]]) -> tuple[list[str], list[float], list[int]]:
    """The next-token chart's bars from a step's ``top`` ``(id, probability)``: one per id, labels that tell the
    tokens apart, the probabilities and the ids."""
    ids = [token_id for token_id, _ in top]
    return distinct_labels(readable_labels(tokenizer, ids), ids), [p for _, p in top], ids


# ---------------------------------------------------------------------------------------------------------------
# The whole sequence


@torch.no_grad()
def sequence_attention(model, ids: list[int], layer: int) -> torch.Tensor:
    """Every head of ``layer`` over the whole sequence ``ids``: one forward pass without a cache, the model's eager
    attention weights, ``[heads, n, n]`` in float32 (row i: query i over keys 0..i)."""
    output = model(input_ids=torch.tensor([list(ids)]), use_cache=False, output_attentions=True)
    attentions = output.attentions
    if not attentions or len(attentions) <= layer:
        raise ValueError("the model returned no attention weights for this layer (it needs eager attention)")
    return attentions[layer][0].float()


MATCH_CHECKED = 32  # tokens compared backwards to find where a repeat lines up


def repeat_pairs(ids: list[int], min_match: int = 2) -> list[tuple[int, int]]:
    """``(query, key)`` cells an induction head fills: for each token ``i`` that repeats an earlier stretch of the
    sequence, the earlier position ``j`` where the longest run of tokens ending at ``i`` occurred before (at least
    ``min_match`` tokens: ``ids[j - k] == ids[i - k]`` for k < the run; the latest such ``j`` on a tie), and the
    token after it, ``j + 1`` (what came next last time). A lone token seen before does not count: with word
    pieces and single letters most tokens recur by chance, and it is the repeated stretch that an induction head
    follows (Olsson et al.'s prefix matching)."""
    seen: dict[int, list[int]] = {}
    pairs = []
    for position, token_id in enumerate(ids):
        best, best_run = None, 0
        for earlier in reversed(seen.get(token_id, [])):
            run = 1
            while run < MATCH_CHECKED and earlier - run >= 0 and ids[earlier - run] == ids[position - run]:
                run += 1
            if run > best_run:
                best, best_run = earlier, run
        if best is not None and best_run >= min_match:
            pairs.append((position, best + 1))
        seen.setdefault(token_id, []).append(position)
    return pairs


@dataclass
class SequenceView:
    """What the whole-sequence heatmap draws: one head's weights, every query over every key."""

    values: np.ndarray  # [rows, cols]: weights (NaN above the diagonal: keys a causal query cannot read)
    labels: list[str]  # one per row (and column: the same tokens)
    segments: list[int]  # 0: a prompt token, 1: a generated one (a pooled cell: its first token's)
    marks: list[tuple[int, int]]  # (row, col) cells of repeat_pairs, where an induction head puts its weight
    n: int  # tokens in the sequence
    prompt_length: int
    pooled: bool = False  # cells hold the max over a block of tokens (n > POOL_LIMIT)
    previous_token: float = 0.0  # mean weight of query i on key i - 1
    induction: float | None = None  # mean weight on the token after the earlier occurrence (None: no repeat)
    repeats: int = 0  # queries whose token occurred before


def sequence_view(weights: torch.Tensor, ids: list[int], labels: list[str], prompt_length: int,
                  pool_limit: int = POOL_LIMIT) -> SequenceView:
    """One head's ``weights [n, n]`` over the sequence ``ids`` (``prompt_length`` of them the prompt) as the page
    draws it: exact up to ``pool_limit`` tokens, else max-pooled to ``pool_limit`` cells a side (a stripe stays
    visible), with the cells of :func:`repeat_pairs` and the two scores measured on the exact weights."""
    n = len(ids)
    if weights.shape != (n, n) or len(labels) != n:
        raise ValueError(f"weights {tuple(weights.shape)} and {len(labels)} labels for a sequence of {n} tokens")
    weights = weights.float()
    segments = [0 if position < prompt_length else 1 for position in range(n)]
    pairs = repeat_pairs(ids)
    rows = torch.tensor([query for query, _ in pairs], dtype=torch.long)
    cols = torch.tensor([key for _, key in pairs], dtype=torch.long)
    induction = float(weights[rows, cols].mean()) if pairs else None
    previous = float(circuits.previous_token_score(weights)) if n > 1 else 0.0
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    if n <= pool_limit:
        values = torch.where(causal, weights, torch.full_like(weights, float("nan"))).numpy()
        return SequenceView(values, token_labels(labels), segments, pairs, n,
                            prompt_length, False, previous, induction, len(pairs))
    cells = analysis.bins(n, pool_limit)
    pooler = analysis.Pooler((), int(cells[-1]) + 1, cells, "max")
    pooler.add(torch.where(causal, weights, torch.full_like(weights, -1.0)), cells)
    pooled = pooler.result()
    values = torch.where(pooled < 0, torch.full_like(pooled, float("nan")), pooled).numpy()
    edges = analysis.bin_edges(n, pool_limit)
    cell_labels = [f"{first}–{last} · {labels[first][:10]}" if last > first else f"{first} · {labels[first]}"
                   for first, last in edges]
    cell_of = cells.tolist()
    marks = sorted({(cell_of[query], cell_of[key]) for query, key in pairs})
    return SequenceView(values, cell_labels, [segments[first] for first, _ in edges], marks, n, prompt_length, True,
                        previous, induction, len(pairs))


def sequence_statement(view: SequenceView) -> str:
    """What to notice in the whole-sequence heatmap, with the chosen head's measured weights."""
    text = (f"Every query of the {view.n} tokens ({view.prompt_length} of the prompt, then "
            f"{view.n - view.prompt_length} generated, in orange after the dashed line) over every key it may read "
            "(grey: later keys, which a causal model never reads)"
            + (f", each cell the largest weight of a block of tokens (max-pooled from {view.n} a side)"
               if view.pooled else "")
            + f". Weight on the previous token, the diagonal just below the main one: **{view.previous_token:.3g}** "
              "on average")
    if view.induction is None:
        return text + (". No stretch of two or more tokens occurs twice, so there is no induction stripe to see: "
                       "press **Repeat my prompt**.")
    return text + (f"; on the token that followed the earlier occurrence (the {view.repeats} queries that continue "
                   f"a stretch seen before, outlined): **{view.induction:.3g}** on average. An induction head lights "
                   "those cells, a stripe parallel to the diagonal, one repeat-length to the left.")


def sequence_text(generation: Generation, tokenizer) -> str:
    """The whole sequence as text (the prompt as read, then what was generated), for Explore heads."""
    return tokenizer.decode(generation.ids, skip_special_tokens=True)
