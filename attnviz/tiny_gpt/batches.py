"""The tiny GPT's training batches: windows of the documentation, and sequences repeated (random tokens of a pool,
or short pieces of the text joined) so that copying pays; each row at its positions in the context. Drawn from the
run's own generator, in the order the shipped model was trained on.

Imports torch only; ``recipe`` is an :class:`attnviz.tiny_gpt.train.Recipe` (not imported: the training script
imports this module)."""

from __future__ import annotations

import math

import torch


def frequent_tokens(ids: torch.Tensor, count: int, skip: int) -> list[int]:
    """The ``count`` most frequent token ids of ``ids``, leaving out the first ``skip`` ids (special tokens)."""
    counts = torch.bincount(ids, minlength=skip + 1)
    counts[:skip] = -1
    return counts.argsort(descending=True, stable=True)[:count].sort().values.tolist()


def batch_rows(recipe) -> tuple[int, int, int]:
    """How many rows of each batch are documentation, repeated random tokens and echoed triples."""
    n_repeats = round(recipe.batch * recipe.repeat_share)
    n_echoes = round(recipe.batch * recipe.echo_share)
    return recipe.batch - n_repeats - n_echoes, n_repeats, n_echoes


def batches(train_ids: torch.Tensor, recipe, generator: torch.Generator, pool: list[int]):
    """Endless ``(tokens, positions)``, both ``[batch, train_length]``: documentation windows, random tokens of
    ``pool`` repeated, and (``echo_share``) random triples ``a b a``; ``shifted_share`` of the rows (drawn at
    random) at a random offset in the context."""
    pool_ids = torch.tensor(pool)
    length = recipe.train_length
    n_text, n_repeats, n_echoes = batch_rows(recipe)
    while True:
        starts = torch.randint(0, len(train_ids) - length, (n_text,), generator=generator)
        rows = [train_ids[s : s + length] for s in starts.tolist()]
        n_small = round(n_repeats * recipe.small_pool_share)
        n_text_repeats = round(n_repeats * recipe.text_repeat_share)
        low, high = recipe.repeat_periods
        for index in range(n_repeats):
            period = int(torch.randint(low, max(low + 1, min(high, length // 2 + 1)), (1,), generator=generator))
            if index >= n_repeats - n_text_repeats:  # pieces of the text, repeated
                pattern = text_pattern(train_ids, period, recipe.text_repeat_span, generator)
            else:
                drawn_from = pool_ids[: recipe.small_pool] if index < n_small else pool_ids
                pattern = drawn_from[torch.randint(0, len(drawn_from), (period,), generator=generator)]
            rows.append(pattern.repeat(math.ceil(length / period))[:length])
        for _ in range(n_echoes):
            pairs = pool_ids[torch.randint(0, len(pool_ids), (math.ceil(length / 3), 2), generator=generator)]
            rows.append(torch.cat([pairs, pairs[:, :1]], dim=1).flatten()[:length])  # a b a, c d c, ...
        positions = torch.arange(length).expand(len(rows), length).clone()  # [batch, length]
        if recipe.shifted_share and recipe.context > length:
            shifted = torch.rand(len(rows), generator=generator) < recipe.shifted_share
            offsets = torch.randint(1, recipe.context - length + 1, (len(rows),), generator=generator)
            positions += (offsets * shifted)[:, None]
        yield torch.stack(rows), positions


def text_pattern(train_ids: torch.Tensor, period: int, span: tuple[int, int],
                 generator: torch.Generator) -> torch.Tensor:
    """``period`` tokens of the text ``[period]``: short windows (lengths drawn from ``span``) from random places,
    joined; one window of ``period`` tokens when ``span`` is (0, 0)."""
    pieces, total = [], 0
    while total < period:
        length = int(torch.randint(*span, (1,), generator=generator)) if span[1] else period
        length = min(length, period - total)
        start = int(torch.randint(0, len(train_ids) - length, (1,), generator=generator))
        pieces.append(train_ids[start : start + length])
        total += length
    return torch.cat(pieces)
