"""The induction circuit, demonstrated by ablation (the first view of the "Does this head matter?" page): random
tokens typed twice, each head of a decoder removed in turn, the loss on each copy measured; beside it, where each
head looks on the same sequences (previous-token and induction scores)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnviz import circuits
from attnviz.models.capture import record_from_calls, recorded_calls
from attnviz.models.interventions import AttentionModule, Plan, attention_modules, edited, zeroed
from attnviz.pagelogic.importance import empty_map


@dataclass
class Circuit:
    """The bundled tiny GPT's induction circuit on random tokens typed twice: each head's loss on the first and
    the second copy with the head ablated, against the clean run's."""

    first: torch.Tensor  # [modules, heads]: mean loss on the first copy with the head ablated
    second: torch.Tensor
    clean_first: float
    clean_second: float
    modules: list[AttentionModule]


def copy_losses(model: torch.nn.Module, ids: torch.Tensor, period: int, plan: Plan | None = None
                ) -> tuple[float, float]:
    """Mean next-token loss on the first copy (its tokens after the first) and the second copy of ``ids`` ``[texts,
    2 * period]``."""
    with torch.no_grad(), edited(model, plan or {}):
        logits = model(input_ids=ids).logits[:, :-1].float()
    losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    return float(losses[:, : period - 1].mean()), float(losses[:, period:].mean())


def _repeats(tokens: list[int], period: int, texts: int, seed: int) -> torch.Tensor:
    """``texts`` sequences of ``period`` random tokens (from ``tokens``) typed twice: ``[texts, 2 * period]``."""
    generator = torch.Generator().manual_seed(seed)
    pool = torch.tensor(tokens)
    first = pool[torch.randint(len(pool), (texts, period), generator=generator)]  # [texts, period]
    return torch.cat([first, first], dim=1)


def induction_circuit(model: torch.nn.Module, tokens: list[int], *, period: int = 50, texts: int = 8,
                      seed: int = 0) -> Circuit:
    """Ablate each head (zero) of a decoder on ``texts`` random sequences (from ``tokens``) typed twice."""
    ids = _repeats(tokens, period, texts, seed)
    modules = attention_modules(model, {"input_ids": ids[:1]})
    clean_first, clean_second = copy_losses(model, ids, period)
    first_losses, second_losses = empty_map(modules), empty_map(modules)
    for row, module in enumerate(modules):
        for head in range(module.heads):
            first_losses[row, head], second_losses[row, head] = copy_losses(model, ids, period,
                                                                           zeroed(module.name, head))
    return Circuit(first_losses, second_losses, clean_first, clean_second, modules)


def circuit_scores(model: torch.nn.Module, tokens: list[int], *, period: int = 50, texts: int = 8,
                   seed: int = 0) -> dict[str, torch.Tensor]:
    """Where each head looks on the same sequences as :func:`induction_circuit`: its previous-token and induction
    scores (Olsson et al., :mod:`attnviz.circuits`), ``[layers, heads]`` each, averaged over the texts."""
    ids = _repeats(tokens, period, texts, seed)
    previous, induction = [], []
    for row in ids:
        calls, _ = recorded_calls(model, {"input_ids": row[None]})
        names = [str(token) for token in row.tolist()]
        weights = record_from_calls("self", calls, names, names).every_layer_weights()  # [layers, heads, n, n]
        previous.append(circuits.previous_token_score(weights))
        induction.append(circuits.induction_score(weights, period))
    return {"previous": torch.stack(previous).mean(0), "induction": torch.stack(induction).mean(0)}
