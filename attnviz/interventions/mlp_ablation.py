"""MLP ablation beside head ablation: the objective's change (the model's own loss, or for an encoder without a head how
far its final states move) when one layer's MLP output is zeroed, or replaced by its mean over every real token of
the texts, as :func:`attnviz.interventions.importance.ablation_map` does for each head. The MLP is found by
:mod:`attnviz.interventions.anatomy`; its output is replaced where it joins the residual stream (before a post-norm
block's residual add and norm), through hooks that act only inside this thread's block.

Imports torch and attnviz.interventions."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnviz.interventions import importance as imp
from attnviz.interventions.activation_patching import on_outputs
from attnviz.interventions.anatomy import NotReadable, anatomy


@dataclass
class MlpAblation:
    """``values [layers]``: the mean over texts of the objective's change with that layer's MLP ablated;
    ``per_text [layers, texts]``; ``labels``: the layers as the head maps name them."""

    how: str
    values: torch.Tensor
    per_text: torch.Tensor
    labels: list[str]


def _mlp_means(model: torch.nn.Module, batch: imp.Batch, names: list[str]) -> dict[str, torch.Tensor]:
    """Each MLP's output averaged over every real token of every text: ``[d_model]`` by module name."""
    sums: dict[str, torch.Tensor] = {}
    count = 0
    for rows in imp.pieces(batch):
        part = imp._part(batch, rows)
        real = part.real.to(torch.float64)[..., None]  # [rows, n, 1]

        def keep(name: str, output: torch.Tensor, real=real) -> torch.Tensor:  # output [rows, n, d_model]
            total = (output.detach().double() * real[:, : output.shape[1]]).sum(dim=(0, 1))
            sums[name] = sums.get(name, 0) + total
            return output

        with torch.no_grad(), on_outputs(model, names, keep):
            model(**part.inputs)
        count += int(part.real.sum())
    return {name: total / max(count, 1) for name, total in sums.items()}


def mlp_ablation(model: torch.nn.Module, batch: imp.Batch, how: str = "zero", *,
                 objective: str | None = None) -> MlpAblation:
    """Each layer's MLP ablated alone (``how``: "zero" or "mean"), one forward of the batch per layer plus the clean
    run; the objective as :func:`~attnviz.interventions.importance.ablation_map` measures it (NotReadable when the
    model's layers or MLPs are not found: an encoder-decoder, a shared layer)."""
    if how not in ("zero", "mean"):
        raise ValueError(f"unknown ablation {how!r}: zero or mean")
    objective = objective or imp.objective_of(model)
    parts = anatomy(model, {name: value[:1] for name, value in batch.inputs.items()})
    names = [layer.mlp for layer in parts.layers]
    if None in names:
        raise NotReadable("this model's MLPs were not found, so they are not ablated")
    _, clean_hidden, clean_losses, counted = imp.clean_run(model, batch, objective)
    clean = imp.text_losses(clean_losses, counted, batch.copies)
    means = _mlp_means(model, batch, names) if how == "mean" else {}
    per_text = torch.full((len(names), len(batch.texts)), float("nan"), dtype=clean.dtype)
    for layer, name in enumerate(names):

        def ablate(at: str, output: torch.Tensor, name=name) -> torch.Tensor:
            if at != name:
                return output
            return torch.zeros_like(output) if how == "zero" else means[name].to(output.dtype).expand_as(output)

        with on_outputs(model, names, ablate):
            losses = imp.run_losses(model, batch, objective, clean_hidden)
        per_text[layer] = imp.text_losses(losses, counted, batch.copies) - clean
    return MlpAblation(how, per_text.nanmean(-1), per_text, [layer.attention.label for layer in parts.layers])
