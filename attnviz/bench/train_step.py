"""``python -m attnviz.bench train-step``: one optimiser step of the bundled tiny GPT's recipe, with PyTorch's
cross-entropy on the full logits (the shipped recipe) and with the LM head and its loss fused a block of rows at a time
(``--fused-loss``, :mod:`attnviz.tiny_gpt.loss`), on both of the recipe's batches: 16 x 128 tokens for the first
steps, ``long_batch_size`` x 256 for the last ``long_steps``.

The model is the recipe's (3 layers, 4 heads, d_model 128, 4,096 tokens of vocabulary) with random weights and random
tokens: a step's arithmetic does not depend on the values. Each round times ``steps`` steps of each kind, plain and
fused in turn (which goes first alternates from round to round); it prints each median, the ratio (the median of the
rounds' ratios) and the recipe's steps at those medians. The steps alone: a run also sets its rare words' kept
directions back after each step (well under a millisecond), and its measures and the rest (text, tokenizer, final
checks) come on top: ``training.json``'s ``total_seconds`` tells the whole."""

from __future__ import annotations

import os
import statistics
import time
from types import SimpleNamespace

import torch

from attnviz.tiny_gpt import train as train_tiny


def _median_step(model, optimiser, batch: torch.Tensor, steps: int, fused: bool, vocab: int) -> float:
    positions = torch.arange(batch.shape[1]).expand_as(batch)
    train_tiny._training_step(model, optimiser, batch, positions, vocab, fused)  # warm: allocations, threads
    seconds = []
    for _ in range(steps):
        started = time.perf_counter()
        train_tiny._training_step(model, optimiser, batch, positions, vocab, fused)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def bench_train_step(repeats: int = 5, steps: int = 10, threads: int = 2) -> dict:
    """``threads``: 0 for every core, as the training command takes it."""
    threads = threads or os.cpu_count() or 1
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _bench(repeats, steps, threads)
    finally:
        torch.set_num_threads(before)


def _bench(repeats: int, steps: int, threads: int) -> dict:
    torch.manual_seed(0)
    recipe = train_tiny.Recipe()
    model = train_tiny.build_model(recipe, SimpleNamespace(bos_token_id=0, eos_token_id=0))
    model.train()
    optimiser = train_tiny._optimiser(model, recipe)
    shapes = {"short": (recipe.batch, recipe.train_length),
              "long": (train_tiny.long_batch_size(recipe), recipe.context)}
    counts = {"short": recipe.steps - recipe.long_steps, "long": recipe.long_steps}
    generator = torch.Generator().manual_seed(0)
    kinds: dict[str, dict] = {}
    for round_ in range(repeats):
        for kind, shape in shapes.items():
            batch = torch.randint(0, recipe.vocab_size, shape, generator=generator)
            order = (False, True) if round_ % 2 == 0 else (True, False)  # neither always runs first
            timed = {fused: _median_step(model, optimiser, batch, steps, fused, recipe.vocab_size) for fused in order}
            plain, fused = timed[False], timed[True]
            times = kinds.setdefault(kind, {"shape": list(shape), "steps_in_recipe": counts[kind], "plain": [],
                                            "fused": []})
            times["plain"].append(plain)
            times["fused"].append(fused)
    for times in kinds.values():
        times["plain_median"] = statistics.median(times["plain"])
        times["fused_median"] = statistics.median(times["fused"])
        times["ratio"] = statistics.median(f / p for f, p in zip(times["fused"], times["plain"], strict=True))
    return {"threads": threads, "repeats": repeats, "steps_per_round": steps, "kinds": kinds,
            "recipe_plain_seconds": sum(t["plain_median"] * t["steps_in_recipe"] for t in kinds.values()),
            "recipe_fused_seconds": sum(t["fused_median"] * t["steps_in_recipe"] for t in kinds.values())}


def print_train_step(report: dict) -> list[str]:
    lines = [f"the tiny GPT's training step, {report['threads']} threads; medians of {report['repeats']} rounds of "
             f"{report['steps_per_round']} steps each"]
    for kind, times in report["kinds"].items():
        rows, length = times["shape"]
        lines.append(f"{kind} ({rows} x {length} tokens, {times['steps_in_recipe']} steps of the recipe): plain "
                     f"{times['plain_median']:.3f} s, fused {times['fused_median']:.3f} s: fused / plain "
                     f"{times['ratio']:.2f}")
    lines.append(f"the recipe's steps at these medians: plain {report['recipe_plain_seconds'] / 60:.1f} min, fused "
                 f"{report['recipe_fused_seconds'] / 60:.1f} min (measures and the rest of a run not included)")
    return lines
