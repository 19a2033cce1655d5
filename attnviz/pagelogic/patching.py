"""Activation patching on the "Does this head matter?" page: each head's output (then each layer's, every head at
once) on a clean input put into the run of a corrupted one, and how much of the answer's logit difference it
brings back; and the preset inputs for the bundled tiny GPT (a repeat whose second copy is corrupted)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnviz.models.importance import empty_map
from attnviz.models.interventions import AttentionModule, Plan, attention_modules, edited, head_outputs
from attnviz.tokens_display import readable_token, tokenizer_style


@dataclass
class Patching:
    """Activation patching: the answer's logit difference restored by putting each head's clean output into the
    corrupted run, as a share of the clean-corrupted gap (1: all of it)."""

    heads: torch.Tensor  # [modules, heads]
    layers: torch.Tensor  # [modules]: every head of the module patched at once
    modules: list[AttentionModule]
    clean: float  # the logit difference (answer minus the corrupted run's top token) on the clean input
    corrupted: float
    answer: str
    foil: str


def patching_map(model: torch.nn.Module, clean_ids: list[int], corrupted_ids: list[int], answer: int,
                 foil: int | None = None, *, tokenizer=None,
                 progress: Callable[[float, str], None] | None = None) -> Patching:
    """Patch each head's output (then each module's, all heads) from the clean run into the corrupted one and
    measure, at the last position, logit(answer) - logit(foil); ``foil`` defaults to the corrupted run's most
    likely token other than the answer. A causal LM only; both inputs the same length."""
    if len(clean_ids) != len(corrupted_ids):
        raise ValueError(f"the clean and corrupted inputs must have the same length in tokens "
                         f"({len(clean_ids)} and {len(corrupted_ids)})")
    if not clean_ids:
        raise ValueError("the inputs are empty")
    clean_inputs = {"input_ids": torch.tensor([clean_ids])}
    corrupted_inputs = {"input_ids": torch.tensor([corrupted_ids])}
    modules = attention_modules(model, clean_inputs)
    clean_outputs, clean_run = head_outputs(model, clean_inputs)
    _, corrupted_run = head_outputs(model, corrupted_inputs)
    corrupted_logits = corrupted_run.logits[0, -1].float()
    if foil is None:
        ranked = corrupted_logits.argsort(descending=True).tolist()
        foil = next(token for token in ranked if token != answer)

    def difference(logits: torch.Tensor) -> float:
        logits = logits[0, -1].float()
        return float(logits[answer] - logits[foil])

    clean, corrupted = difference(clean_run.logits), difference(corrupted_run.logits)
    gap = clean - corrupted
    heads, layers = empty_map(modules), torch.full((len(modules),), float("nan"))
    total, done = sum(module.heads for module in modules) + len(modules), 0
    with torch.no_grad():
        for row, module in enumerate(modules):
            source = clean_outputs[module.name]  # [1, n, heads, d_v]
            for head in [*range(module.heads), None]:
                chosen = range(module.heads) if head is None else [head]
                plan: Plan = {module.name: {h: source[:, :, h] for h in chosen}}
                with edited(model, plan):
                    patched = difference(model(**corrupted_inputs).logits)
                share = (patched - corrupted) / gap if gap else float("nan")
                if head is None:
                    layers[row] = share
                else:
                    heads[row, head] = share
                done += 1
                if progress is not None:
                    progress(done / total, module.label)
    if tokenizer is not None:
        style = tokenizer_style(tokenizer)

        def name(token: int) -> str:
            return readable_token(tokenizer.convert_ids_to_tokens(token), style)
    else:
        name = str
    return Patching(heads, layers, modules, clean, corrupted, name(answer), name(foil))


def repeated_sequence(tokens: list[int], period: int, *, seed: int) -> tuple[list[int], list[int], int]:
    """The induction preset: random tokens (from ``tokens``) of length ``period`` typed twice, the second copy
    cut one token short (clean), and the same with the second copy replaced by other random tokens (corrupted).
    The answer is the token the second copy continues with: only a model that copies from the first copy
    predicts it."""
    generator = torch.Generator().manual_seed(seed)
    pool = torch.tensor(tokens)
    first = pool[torch.randperm(len(pool), generator=generator)[:period]].tolist()
    stop = period // 2
    others = [token for token in pool.tolist() if token not in set(first)]
    other = torch.tensor(others)[torch.randperm(len(others), generator=generator)[:stop]].tolist()
    clean = first + first[:stop]
    corrupted = first + other
    return clean, corrupted, first[stop]




SMALL_GAP = 1.0  # logits: below this, a share of the gap is a share of noise


def gap_problem(result: Patching) -> tuple[str, str] | None:
    """What is wrong with the clean-corrupted gap the shares divide by, as ``(level, words)``: "error" when there
    is none (nothing to recover), "warning" when it is small (the shares are noisy), else None."""
    gap = result.clean - result.corrupted
    if abs(gap) < 1e-6:
        return "error", ("The clean and corrupted runs give the same logit difference: there is nothing to recover. "
                         "Choose prompts whose answers differ.")
    if abs(gap) < SMALL_GAP:
        return "warning", (f"The clean and corrupted runs differ by only {abs(gap):.2f} logits: each share below "
                           "divides by that, so small changes look large. Prompts that separate the answers more "
                           "give a clearer map.")
    return None
