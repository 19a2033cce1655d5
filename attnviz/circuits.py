"""Two attention circuits a small decoder learns, measured as Olsson et al. (2022) measure them.

- A **previous-token head** puts its weight on position i-1: score = the mean over queries i >= 1 of w[i, i-1].
- An **induction head** completes a repeat: on random tokens repeated twice (``A B C ... A B C ...``), a token
  in the second half attends to the token that followed its first occurrence: score = the mean over second-half
  queries i of w[i, i - period + 1].

Both take one layer's weights ``[heads, n, n]`` (or one head's ``[n, n]``) and return one score per head.
"""

from __future__ import annotations

import torch


def previous_token_score(weights: torch.Tensor) -> torch.Tensor:
    """Mean weight on the previous position, per head: ``[..., n, n]`` -> ``[...]``."""
    n = weights.shape[-1]
    rows = torch.arange(1, n)
    return weights[..., rows, rows - 1].mean(-1)


def induction_score(weights: torch.Tensor, period: int, start: int = 0) -> torch.Tensor:
    """Mean weight from each second-half token to the token after its first occurrence, per head.

    The sequence is ``start`` tokens (e.g. a BOS), then ``period`` random tokens, then the same ``period`` again:
    query ``i`` in the second copy sees its earlier occurrence at ``i - period`` and should attend to
    ``i - period + 1``. The last query of the second copy is included (its target is the first copy's last token
    + 1, i.e. the first token of the second copy)."""
    first_of_second = start + period
    queries = torch.arange(first_of_second, start + 2 * period)
    return weights[..., queries, queries - period + 1].mean(-1)


def repeated_random_tokens(period: int, *, seed: int, pool: list[int], prefix: list[int] | None = None) -> list[int]:
    """``prefix`` then ``period`` token ids drawn uniformly from ``pool`` (seeded), repeated twice."""
    generator = torch.Generator().manual_seed(seed)
    drawn = torch.randint(0, len(pool), (period,), generator=generator).tolist()
    tokens = [pool[i] for i in drawn]
    return list(prefix or []) + tokens + tokens


@torch.no_grad()
def circuit_scores(model, tokenizer, text: str, pool: list[int], *, windows: int = 4, length: int = 256,
                   period: int = 40, seeds: int = 4, max_positions: int | None = None) -> dict:
    """Both scores for every layer and head of a causal LM with eager attention (``output_attentions``):
    ``previous_token`` on ``windows`` evenly spaced windows of ``text`` and ``induction`` on ``seeds`` sequences
    of ``period`` random tokens of ``pool`` repeated twice (after a BOS when the tokenizer has one), each
    ``[layers][heads]`` (means over the windows and seeds). ``max_positions``: the model's context, which the
    windows and the repeated sequences are shortened to fit."""
    ids = tokenizer(text, return_tensors="pt")["input_ids"][0]
    length = min(length, len(ids) - 1, max_positions or length)
    previous = []
    for start in torch.linspace(0, len(ids) - length - 1, windows).long().tolist():
        attentions = model(input_ids=ids[start : start + length][None], output_attentions=True).attentions
        previous.append(torch.stack([previous_token_score(a[0]) for a in attentions]))  # [layers, heads]
    prefix = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    if max_positions:
        period = min(period, (max_positions - len(prefix)) // 2)
    induction = []
    for seed in range(seeds):
        tokens = repeated_random_tokens(period, seed=1000 + seed, pool=pool, prefix=prefix)
        attentions = model(input_ids=torch.tensor([tokens]), output_attentions=True).attentions
        induction.append(torch.stack([induction_score(a[0], period, start=len(prefix)) for a in attentions]))
    return {"previous_token": torch.stack(previous).mean(0).tolist(),
            "induction": torch.stack(induction).mean(0).tolist(), "period": period}
