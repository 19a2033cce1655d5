"""What the trained tiny GPT is measured on when its run ends, for ``training.json`` and the model card: the held-out
loss (on training-length windows, and per half of the whole context), and both circuits on held-out text and on
inputs it never trained on, reloaded from the saved folder as any user would load it.

Imports torch and attnviz.core.circuits, attnviz.models.with_heads and attnviz.tiny_gpt.text."""

from __future__ import annotations

from pathlib import Path

import torch

from attnviz.core import circuits
from attnviz.models.with_heads import load_causal_lm
from attnviz.tiny_gpt.text import REPEAT_SENTENCES


@torch.no_grad()
def held_out_loss(model, ids: torch.Tensor, length: int, windows: int = 32) -> float:
    model.eval()
    starts = torch.linspace(0, len(ids) - length - 1, windows).long().tolist()
    batch = torch.stack([ids[s : s + length] for s in starts])
    loss = float(model(input_ids=batch, labels=batch).loss)
    model.train()
    return loss


@torch.no_grad()
def held_out_halves(model, ids: torch.Tensor, context: int) -> list[float]:
    """The held-out loss on the first and on the second half of the context's positions (windows of the whole
    context): a model whose later positions never trained does much worse on the second."""
    model.eval()
    windows = torch.stack([ids[s : s + context] for s in range(0, len(ids) - context, context)])  # [w, context]
    logits = model(input_ids=windows).logits  # [w, context, vocab]
    losses = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), windows[:, 1:], reduction="none")
    model.train()
    return [float(losses[:, : context // 2].mean()), float(losses[:, context // 2:].mean())]


@torch.no_grad()
def measure_circuits(folder: Path, held_out_text: str, pool: list[int], context: int) -> dict:
    """Reload the saved folder as any user would and measure both circuits with eager attention weights, per
    layer and head (:func:`attnviz.core.circuits.circuit_scores`, with the same arguments as the page and the tests)."""
    model, tokenizer = load_causal_lm(folder)
    return circuits.circuit_scores(model, tokenizer, held_out_text, pool, max_positions=context)


@torch.no_grad()
def measure_generalisation(folder: Path) -> dict:
    """The circuits on inputs the model never trained on, reloaded from ``folder`` as any user would load it:
    random tokens of the whole vocabulary repeated twice (lengths 10 to 100) and English sentences of our own
    typed twice (:mod:`attnviz.core.circuits`; the tests measure the same on fresh seeds)."""
    model, tokenizer = load_causal_lm(folder)
    return {"random_repeats": circuits.random_repeats(model, tokenizer),
            "sentences_twice": circuits.sentences_typed_twice(model, tokenizer, REPEAT_SENTENCES)}
