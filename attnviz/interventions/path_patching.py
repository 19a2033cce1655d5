"""Path patching (Wang et al. 2022; Goldowsky-Dill et al. 2023): how much of the answer travels from one head (the
sender) into another head's queries, keys or values (the receiver's input), and nowhere else.

For every sender before the receiver's layer, two forwards (batched over senders):

1. the target run (denoising: the corrupted prompt) with the sender's output set to its value on the source run
   (the clean prompt) and every other head before the receiver's layer held at its value on the target run, so
   that only the sender's change reaches the receiver; the MLPs between them either held too (``mlps="frozen"``:
   the direct path, sender -> receiver through the residual stream only) or left to compute (``"free"``: the direct
   path plus every path through the MLPs in between). The receiver's query, key or value (whichever is asked) is
   read off this run.
2. the target run again, nothing held, with only the receiver's query, key or value replaced by what step 1 read;
   the metric at the last position, against the unpatched target in the same forward.

Under grouped-query attention a key or value path reaches the receiver's K/V head, which the other query heads of
its group read too: the patch changes them all (said in :attr:`PathMap.note`).

Imports torch and attnviz.interventions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnviz.interventions.activation_patching import (
    DIRECTIONS,
    METRICS,
    Spread,
    _at_site,
    _heads_at,
    _last_logits,
    capture_site,
    checked_examples,
    ends,
    ends_of,
    examples_of,
    metric_of,
    on_outputs,
    shares_of,
    source_and_target,
)
from attnviz.interventions.anatomy import Anatomy, anatomy
from attnviz.models.attention_hook import editing

VIA = {"q": "queries", "k": "keys", "v": "values"}
MLPS = {"frozen": "directly (the MLPs in between held)", "free": "directly and through the MLPs in between"}


@dataclass
class PathMap:
    """Each sender's path into one receiver's input. ``shares [examples, receiver layer, heads]`` (rows: the layers
    before the receiver's; NaN for a layer with fewer heads), as a share of the clean-corrupted gap (denoising:
    brought back; noising: taken away); ``values`` the metric itself."""

    receiver: tuple[int, int]
    via: str
    mlps: str
    direction: str
    metric: str
    values: torch.Tensor
    shares: torch.Tensor
    clean: torch.Tensor
    corrupted: torch.Tensor
    foils: list[int]
    rows: list[str]
    note: str

    @property
    def share_spread(self) -> Spread:
        from attnviz.interventions.activation_patching import spread

        return spread(self.shares)


def _receiver_head(model: torch.nn.Module, parts: Anatomy, layer: int, head: int, via: str) -> tuple[int, str]:
    """The index of the receiver's query head or, for keys and values, of the K/V head it reads; and a note."""
    if via == "q":
        return head, ""
    kv = _heads_at(via, model, parts, layer)
    heads = parts.layers[layer].attention.heads
    if kv == heads:
        return head, ""
    group = heads // kv
    shared = head // group
    return shared, (f"Under grouped-query attention L{layer} H{head} reads K/V head {shared}, shared with query heads "
                    f"{shared * group}-{shared * group + group - 1}: a {VIA[via][:-1]} path reaches them all.")


def _receiver_input(model: torch.nn.Module, parts: Anatomy, receiver: tuple[int, int], via: str, slot: int,
                    batch: torch.Tensor, chunk: list[tuple[int, int]], source: dict, held: dict,
                    held_mlp: dict) -> torch.Tensor:
    """Step 1 for a chunk of senders (row r + 1: sender ``chunk[r]``; row 0: none): the target run with each row's
    sender from ``source``, every other head before the receiver's layer from ``held`` (and the MLPs from
    ``held_mlp`` when given); the receiver's query, key or value head ``slot`` read off: ``[rows, n, d]``."""
    layer = receiver[0]
    names = {part.attention.name: index for index, part in enumerate(parts.layers)}
    receiver_name = parts.layers[layer].attention.name
    mlp_names = {part.mlp: index for index, part in enumerate(parts.layers[:layer]) if index in held_mlp}
    read: list[torch.Tensor] = []

    def hold_heads(name: str, output: torch.Tensor) -> torch.Tensor:
        at = names.get(name)
        if at is None or at >= layer:
            return output
        output = held[at].to(output.dtype)[None].repeat(output.shape[0], 1, 1, 1)  # [rows, n, heads, d_v]
        for row, (sender_layer, sender_head) in enumerate(chunk, 1):
            if sender_layer == at:
                output[row, :, sender_head] = source[at][:, sender_head].to(output.dtype)
        return output

    def hold_mlps(name: str, output: torch.Tensor) -> torch.Tensor:
        at = mlp_names.get(name)
        return output if at is None else held_mlp[at].to(output.dtype)[None].expand_as(output).clone()

    def read_input(name, query, key, value):
        if name == receiver_name:
            read.append((query, key, value)["qkv".index(via)][:, slot].detach().clone())  # [rows, n, d]
        return query, key, value

    with torch.no_grad(), editing(model, hold_heads, inputs=read_input), \
            on_outputs(model, list(mlp_names), hold_mlps):
        model(input_ids=batch)
    return read[0]


def path_patching(model: torch.nn.Module, examples, receiver: tuple[int, int], via: str, *,
                  mlps: str | tuple[int, ...] = "frozen", direction: str = "denoising",
                  metric: str = "logit difference", rows_per_forward: int = 16, parts: Anatomy | None = None,
                  progress: Callable[[float, str], None] | None = None) -> PathMap:
    """Every head before ``receiver`` (layer, head) as a sender into its ``via`` ("q", "k" or "v"), on each example
    (:class:`~attnviz.interventions.activation_patching.Example` or the page's ``Prompts``; all the same length).
    ``mlps``: "frozen" (every MLP between them held: the direct path), "free" (none held), or the layers whose MLPs
    are left free, a tuple (the others held: the path through those MLPs, and the direct one)."""
    examples = examples_of(examples)
    free = tuple(mlps) if isinstance(mlps, tuple | list) else ()
    if free:
        mlps = "only " + ", ".join(f"L{at} MLP" for at in free) + " free"
    if via not in VIA or (mlps not in MLPS and not free) or direction not in DIRECTIONS or metric not in METRICS:
        raise ValueError(f"via: one of {', '.join(VIA)}; mlps: one of {', '.join(MLPS)}; direction: one of "
                         f"{', '.join(DIRECTIONS)}; metric: one of {', '.join(METRICS)}")
    examples = checked_examples(examples, direction, metric)
    parts = parts or anatomy(model, {"input_ids": torch.tensor([examples[0].clean])})
    layer, head = receiver
    if not 0 < layer < len(parts.layers) or not 0 <= head < parts.layers[layer].attention.heads:
        raise ValueError(f"the receiver must be a head of layer 1 to {len(parts.layers) - 1} (no head before "
                         "layer 0 can send to it)")
    if mlps != "free" and any(part.mlp is None for part in parts.layers[:layer]):
        raise ValueError("this model's MLPs were not found, so they cannot be held")
    slot, note = _receiver_head(model, parts, layer, head, via)
    heads = [part.attention.heads for part in parts.layers[:layer]]
    senders = [(sender, sender_head) for sender in range(layer) for sender_head in range(heads[sender])]
    grid = (layer, max(heads))
    values = torch.full((len(examples), *grid), float("nan"), dtype=torch.float64)
    shares = values.clone()
    every = []
    total, done = len(examples) * len(senders), 0
    for index, example in enumerate(examples):
        measured = ends(model, example, metric)
        every.append(measured)
        source_ids, target_ids = source_and_target(example, direction)
        source = capture_site(model, parts, "head", source_ids)  # layer -> [n, heads, d_v]
        held = capture_site(model, parts, "head", target_ids)
        held_mlp = {} if mlps == "free" else \
            {at: kept for at, kept in capture_site(model, parts, "mlp", target_ids).items() if at not in free}
        moved = torch.empty(len(senders), dtype=torch.float64)
        for start in range(0, len(senders), rows_per_forward):
            chunk = senders[start:start + rows_per_forward]
            batch = torch.tensor([target_ids]).repeat(len(chunk) + 1, 1)
            recorded = _receiver_input(model, parts, receiver, via, slot, batch, chunk, source, held, held_mlp)

            def put(at: int, activation: torch.Tensor, recorded=recorded) -> torch.Tensor:
                if at != layer:
                    return activation
                activation = activation.clone()
                activation[1:, slot] = recorded[1:].to(activation.dtype)
                return activation

            with torch.no_grad(), _at_site(model, parts, via, put):
                logits = _last_logits(model, batch, example.position)
            measure = metric_of(metric, logits, example.answer, measured.foil)
            moved[start:start + len(chunk)] = measure[1:] - measure[0]
            done += len(chunk)
            if progress is not None:
                progress(done / total, f"example {index + 1} of {len(examples)}")
        base = measured.corrupted if direction == "denoising" else measured.clean
        moved_shares = shares_of(moved, measured, example, direction)
        for at, (sender_layer, sender_head) in enumerate(senders):
            values[index, sender_layer, sender_head] = base + float(moved[at])
            shares[index, sender_layer, sender_head] = float(moved_shares[at])
    rows = [part.attention.label for part in parts.layers[:layer]]
    return PathMap(receiver, via, mlps, direction, metric, values, shares, *ends_of(every), rows, note)
