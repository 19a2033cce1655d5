"""softmax(Q K^T / sqrt(d_k)) V taken apart into its five steps, for a small example a person can edit.

The score function is selectable, to show where scaled dot-product came from:

* additive (Bahdanau et al., 2015): ``v_a . tanh(W_q q + W_k k)``
* general / multiplicative (Luong et al., 2015): ``q W k``
* dot (Luong et al., 2015): ``q . k``
* scaled dot (Vaswani et al., 2017): ``q . k / sqrt(d_k)``
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from attnviz.core.attention import masked_softmax

MAX_TOKENS = 8
MAX_DIM = 8
EMBEDDING_DIM = 8

SCORE_FUNCTIONS = {
    "scaled_dot": "Scaled dot product: q·k / √d_k (Vaswani et al., 2017)",
    "dot": "Dot product: q·k (Luong et al., 2015)",
    "general": "General / multiplicative: q W k (Luong et al., 2015)",
    "additive": "Additive: vᵀ tanh(W_q q + W_k k) (Bahdanau et al., 2015)",
}


class InputError(ValueError):
    """Input a person typed that cannot be used; the message says what to fix."""


def tokens_of(sentence: str, max_tokens: int = MAX_TOKENS) -> tuple[list[str], bool]:
    """Whitespace tokens of ``sentence``, at most ``max_tokens``; also says whether any were cut."""
    words = sentence.split()
    return words[:max_tokens], len(words) > max_tokens


def _token_embedding(token: str, seed: int) -> torch.Tensor:
    # The same word always gets the same vector (for a given seed), so repeated words show identical rows.
    token_seed = zlib.crc32(f"{seed}:{token.lower()}".encode("utf-8"))
    generator = torch.Generator().manual_seed(token_seed)
    return torch.randn(EMBEDDING_DIM, generator=generator, dtype=torch.float64)


def prefill_qkv(tokens: list[str], d_k: int, seed: int) -> dict[str, torch.Tensor]:
    """Q, K, V for ``tokens``: seeded random embeddings times seeded projections, rounded to 2 decimals.

    Returns ``{"X": [n, 8], "Q": [n, d_k], "K": [n, d_k], "V": [n, d_k]}`` in float64.
    """
    if not tokens:
        raise InputError("Type at least one word to build Q, K and V from.")
    if not 1 <= d_k <= MAX_DIM:
        raise InputError(f"d_k must be between 1 and {MAX_DIM}, got {d_k}.")
    embeddings = torch.stack([_token_embedding(t, seed) for t in tokens])  # [n, EMBEDDING_DIM]
    generator = torch.Generator().manual_seed(int(seed))
    projections = torch.randn(3, EMBEDDING_DIM, d_k, generator=generator, dtype=torch.float64)
    projections /= math.sqrt(EMBEDDING_DIM)  # keeps q, k, v entries of order 1
    q, k, v = (torch.round(embeddings @ w, decimals=2) for w in projections)  # each [n, d_k]
    return {"X": torch.round(embeddings, decimals=2), "Q": q, "K": k, "V": v}


def parse_matrix(rows, name: str) -> torch.Tensor:
    """A table of numbers (list of rows, numpy array or pandas DataFrame) -> float64 tensor ``[rows, cols]``.

    Raises :class:`InputError` naming the first empty cell, the first cell that is not a number, or a size
    outside 1..8 x 1..8.
    """
    if hasattr(rows, "to_numpy"):
        rows = rows.to_numpy(dtype=object)
    rows = [list(r) for r in rows]
    if not rows or not rows[0]:
        raise InputError(f"{name} is empty: give it at least one row of numbers.")
    widths = {len(r) for r in rows}
    if len(widths) != 1:
        raise InputError(f"{name}: every row needs the same number of values (found rows of {sorted(widths)}).")
    values = np.empty((len(rows), len(rows[0])), dtype=np.float64)
    for i, row in enumerate(rows):
        for j, cell in enumerate(row):
            where = f"{name}, row {i + 1}, column {j + 1}"
            if cell is None or (isinstance(cell, str) and not cell.strip()):
                raise InputError(f"{where} is empty: fill in a number.")
            if isinstance(cell, float) and math.isnan(cell):
                raise InputError(f"{where} is empty: fill in a number.")
            try:
                number = float(str(cell).strip()) if isinstance(cell, str) else float(cell)
            except (TypeError, ValueError):
                raise InputError(f"{where}: {str(cell)[:20]!r} is not a number.") from None
            if not math.isfinite(number):
                raise InputError(f"{where}: {cell!r} is not a finite number.")
            values[i, j] = number
    n, d = values.shape
    if n > MAX_TOKENS or d > MAX_DIM:
        raise InputError(f"{name} is {n} x {d}; this page takes at most {MAX_TOKENS} tokens x {MAX_DIM} dimensions.")
    return torch.from_numpy(values)


def parse_matrix_text(text: str, name: str) -> torch.Tensor:
    """A matrix typed as text, one row per line, numbers separated by spaces or commas."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    rows = [line.replace(",", " ").split() for line in lines]
    return parse_matrix(rows, name)


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """The sizes Q K^T and weights V need, with a message a person can act on."""
    if q.shape[1] != k.shape[1]:
        raise InputError(
            f"Q has {q.shape[1]} columns but K has {k.shape[1]}: queries and keys must have the same d_k "
            "to be compared."
        )
    if k.shape[0] != v.shape[0]:
        raise InputError(f"K has {k.shape[0]} rows but V has {v.shape[0]}: every key needs exactly one value.")


@dataclass(frozen=True)
class ScoreParameters:
    """The learned parameters some score functions need, drawn from a seeded generator."""

    w_general: torch.Tensor  # [d_k, d_k] for q W k
    w_query: torch.Tensor  # [d_a, d_k] for the additive score
    w_key: torch.Tensor  # [d_a, d_k]
    v_additive: torch.Tensor  # [d_a]


def score_parameters(d_k: int, seed: int, d_a: int | None = None) -> ScoreParameters:
    """Seeded parameters for queries and keys of size ``d_k``; ``d_a``, the additive score's hidden size, is
    ``d_k`` unless given."""
    generator = torch.Generator().manual_seed(int(seed) + 1)  # +1: not the same draw as the projections
    draw = lambda *shape: torch.randn(*shape, generator=generator, dtype=torch.float64)  # noqa: E731
    d_a = d_k if d_a is None else d_a
    return ScoreParameters(
        w_general=draw(d_k, d_k) / math.sqrt(d_k),
        w_query=draw(d_a, d_k) / math.sqrt(d_k),
        w_key=draw(d_a, d_k) / math.sqrt(d_k),
        v_additive=draw(d_a),
    )


@dataclass(frozen=True)
class AttentionSteps:
    """Every intermediate matrix of one attention computation, ``[n_q, n_k]`` unless said otherwise."""

    score_function: str
    scores: torch.Tensor  # step 1: raw compatibility scores
    scale: float  # the factor of step 2 (1 for all but scaled dot)
    scaled_scores: torch.Tensor  # step 2
    masked_scores: torch.Tensor  # step 3: -inf where the mask forbids
    weights: torch.Tensor  # step 4: softmax, rows sum to 1 (0 for a row with no allowed key)
    output: torch.Tensor  # step 5: weights @ V, [n_q, d_v]
    mask: torch.Tensor | None  # bool, True = may attend
    d_k: int  # the queries' and keys' dimension (the columns of Q): scaled dot product divides by its root
    parameters: ScoreParameters | None = None  # the score function's seeded parameters


def additive_bound(steps: AttentionSteps) -> tuple[int, float]:
    """The additive score's hidden size ``d_a`` and the bound on its scores: tanh keeps each of the ``d_a`` terms of
    ``v . tanh(...)`` in [-1, 1], so ``|score| <= sum |v|``, whatever d_k is."""
    v = steps.parameters.v_additive
    return v.numel(), float(v.abs().sum())


def raw_scores(q: torch.Tensor, k: torch.Tensor, score_function: str, params: ScoreParameters) -> torch.Tensor:
    """Step 1 for each score function. ``q [n_q, d_k]``, ``k [n_k, d_k]`` -> ``[n_q, n_k]``."""
    if score_function in ("dot", "scaled_dot"):
        return q @ k.T
    if score_function == "general":
        return q @ params.w_general @ k.T
    if score_function == "additive":
        projected_q = (q @ params.w_query.T).unsqueeze(1)  # [n_q, 1, d_a]
        projected_k = (k @ params.w_key.T).unsqueeze(0)  # [1, n_k, d_a]
        return torch.tanh(projected_q + projected_k) @ params.v_additive  # [n_q, n_k]
    raise ValueError(f"unknown score function {score_function!r}; choose one of {list(SCORE_FUNCTIONS)}")


def attention_steps(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    score_function: str = "scaled_dot",
    mask: torch.Tensor | None = None,
    seed: int = 0,
) -> AttentionSteps:
    """Run attention one step at a time. ``mask`` is bool ``[n_q, n_k]``, True = may attend."""
    check_qkv(q, k, v)
    if mask is not None and mask.shape != (q.shape[0], k.shape[0]):
        raise InputError(f"the mask is {tuple(mask.shape)} but the scores are {(q.shape[0], k.shape[0])}.")
    params = score_parameters(q.shape[1], seed)
    scores = raw_scores(q, k, score_function, params)
    scale = 1.0 / math.sqrt(q.shape[1]) if score_function == "scaled_dot" else 1.0
    scaled = scores * scale
    masked = scaled if mask is None else scaled.masked_fill(~mask, float("-inf"))
    weights = masked_softmax(masked)
    return AttentionSteps(
        score_function=score_function,
        scores=scores,
        scale=scale,
        scaled_scores=scaled,
        masked_scores=masked,
        weights=weights,
        output=weights @ v,
        mask=mask,
        d_k=q.shape[1],
        parameters=params,
    )


def score_colour_bound(steps: AttentionSteps) -> float:
    """The largest finite |score| over steps 1 to 3 (scores, scaled scores, masked scores): one colour scale for
    the three, so that what the scaling does shows (each figure's own range would hide it)."""
    finite = [t[torch.isfinite(t)].abs() for t in (steps.scores, steps.scaled_scores, steps.masked_scores)]
    return max((float(t.max()) for t in finite if t.numel()), default=1.0) or 1.0
