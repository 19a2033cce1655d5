"""Head detectors on one text (the Head statistics tab): a pattern of (query, key) cells given by relative offsets,
by a token rule or as a matrix, and every head's weight on it, as TransformerLens's ``detect_head`` scores it and as
attnviz does (averaged over the queries the pattern gives a key)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import torch

from attnviz.core import analysis
from attnviz.models.record import Capture
from attnviz.viz.heads import statistic_heatmap

PATTERN_KINDS = {
    "induction": "the token after an earlier copy of the query's token",
    "duplicate token": "earlier copies of the query's token",
    "offsets": "keys at chosen offsets from the query (key − query)",
    "key tokens": "keys whose token is one of chosen words",
    "matrix": "a 0/1 matrix typed row by row (one row per query)",
}
MATRIX_TOKEN_LIMIT = 64  # a typed matrix has one row per token: beyond this, type offsets or a rule


class PatternProblem(ValueError):
    """A pattern that cannot be read, in words for the page."""


@dataclass(frozen=True)
class DetectorScores:
    mean: np.ndarray  # [layers, heads]: weight on the pattern averaged over the queries it gives a key (NaN: none)
    transformerlens: np.ndarray  # [layers, heads]: the same weight summed over every query, divided by their number
    queries_with_target: int
    queries: int
    first_token: str = ""  # the text's first token as shown, and whether the tokenizer added it (a BOS, [CLS])
    first_added: bool = False


def offsets_of(text: str) -> list[int]:
    """"-2" or "-3, -2" as offsets; :class:`PatternProblem` for anything else."""
    try:
        offsets = sorted({int(part) for part in text.replace(";", ",").split(",") if part.strip()})
    except ValueError:
        raise PatternProblem("type whole numbers separated by commas, such as -3, -2") from None
    if not offsets:
        raise PatternProblem("type at least one offset")
    return offsets


def word_of(token: str) -> str:
    """A token as a typed word matches it: lower case, without the space marks of byte-level BPE and SentencePiece
    (WordPiece's ## stays: "##ing" is a piece, "ing" a word)."""
    return token.lstrip("␣▁Ġ ").lower()


def pattern_targets(kind: str, spec: str, capture: Capture, tokens: list[str]) -> torch.Tensor:
    """``[n, n]`` bool (query, key): the cells of the pattern ``kind`` (a key of :data:`PATTERN_KINDS`) with its
    ``spec`` (offsets, words or the matrix's rows, as typed) over ``tokens`` (the record's key tokens, self-attention).
    Raises :class:`PatternProblem` for a spec that cannot be read."""
    n = len(tokens)
    special = capture.special_of(tokens)
    if kind in ("induction", "duplicate token"):
        ids = capture.ids_of(tokens)
        targets = analysis.repeat_targets(ids if ids is not None else tokens, special)
        return targets["induction" if kind == "induction" else "duplicate"]
    if kind == "offsets":
        relative = torch.arange(n).unsqueeze(0) - torch.arange(n).unsqueeze(1)  # [query, key]: key - query
        return torch.isin(relative, torch.tensor(offsets_of(spec)))
    if kind == "key tokens":
        words = {word_of(w.strip()) for w in spec.split(",") if w.strip()}
        if not words:
            raise PatternProblem("type at least one word, such as the, [SEP]")
        displayed = capture.display_of(tokens)
        keys = torch.tensor([word_of(t) in words for t in displayed], dtype=torch.bool)
        return keys.unsqueeze(0).expand(n, n).clone()
    if kind == "matrix":
        return _typed_matrix(spec, n)
    raise PatternProblem(f"no pattern kind {kind!r}")


def _typed_matrix(spec: str, n: int) -> torch.Tensor:
    if n > MATRIX_TOKEN_LIMIT:
        raise PatternProblem(f"a typed matrix needs one row per token: this text has {n:,} tokens (at most "
                             f"{MATRIX_TOKEN_LIMIT}); use offsets or a token rule")
    rows = [line.replace(",", " ").split() for line in spec.strip().splitlines() if line.strip()]
    if len(rows) != n or any(len(row) != n for row in rows):
        raise PatternProblem(f"the matrix needs {n} rows of {n} numbers (one row per query, one number per key); "
                             f"it has {len(rows)} rows")
    if any(cell not in ("0", "1") for row in rows for cell in row):
        raise PatternProblem("the matrix holds 0 and 1 only")
    return torch.tensor([[cell == "1" for cell in row] for row in rows], dtype=torch.bool)


def detector_scores(capture: Capture, kind: str, targets: torch.Tensor) -> DetectorScores:
    """Every head's weight on ``targets`` (``[n_q, n_k]`` bool) of the record ``kind``, read a block of query rows
    at a time (a long text never holds a head's N x N weights)."""
    record = capture.records[kind]
    if tuple(targets.shape) != (record.n_q, record.n_k):
        raise PatternProblem(f"the pattern is {tuple(targets.shape)}, the attention {record.n_q} x {record.n_k}")
    on_target = np.zeros((record.n_layers, record.n_heads))
    with_target = targets.any(-1)  # [n_q]
    for layer in range(record.n_layers):
        block = record.block_rows()
        for start in range(0, record.n_q, block):
            end = min(record.n_q, start + block)
            weights = record.layer_weights(layer, start, end).double()  # [heads, rows, n_k]
            on_target[layer] += torch.einsum("hrk,rk->h", weights, targets[start:end].double()).numpy()
    counted = int(with_target.sum())
    mean = on_target / counted if counted else np.full_like(on_target, np.nan)
    special, shown = capture.special_of(record.key_tokens), capture.display_of(record.key_tokens)
    return DetectorScores(mean=mean, transformerlens=on_target / max(record.n_q, 1), queries_with_target=counted,
                          queries=record.n_q, first_token=shown[0] if shown else "",
                          first_added=bool(special and special[0]))


def detector_figure(scores: DetectorScores, kind: str, selected: tuple[int, int]) -> tuple[go.Figure, str]:
    """Every head's score as a layers x heads map, with what it means in words (from the numbers shown)."""
    figure = statistic_heatmap(scores.mean, title=f"{kind}: weight on the pattern, every head",
                               statistic=f"{kind} score", highlight=selected, value_range=(0.0, 1.0))
    if not scores.queries_with_target:
        return figure, (f"The pattern gives no query of this text a key ({PATTERN_KINDS[kind]}): no head can be "
                        "scored. Type a text where it applies (for induction: a passage written twice).")
    best = np.unravel_index(np.nanargmax(scores.mean), scores.mean.shape)
    share = scores.queries_with_target / scores.queries
    return figure, (
        f"Each head's weight on {PATTERN_KINDS[kind]}, averaged over the {scores.queries_with_target:,} of "
        f"{scores.queries:,} queries that have such a key. Highest: layer {best[0]}, head {best[1]} "
        f"({scores.mean[best]:.3f}); TransformerLens's detect_head (error measure \"mul\") divides the same weight "
        f"by every query and gives it {scores.transformerlens[best]:.3f} (= {scores.mean[best]:.3f} × {share:.3f}). "
        f"{bos_note(scores)} Click a head to open it.")


def bos_note(scores: DetectorScores) -> str:
    """Whether the text starts with a token the tokenizer added, in words: TransformerLens prepends a BOS by
    default, which moves every position by one, so its scores match these only on the same tokens."""
    if scores.first_added:
        return (f"The tokenizer starts the text with {scores.first_token} (TransformerLens compares equal when given "
                "the same tokens).")
    return ("No BOS token is prepended: the text starts with its own first token (TransformerLens prepends one by "
            "default, which moves every position by one and gives heads another place to rest).")
