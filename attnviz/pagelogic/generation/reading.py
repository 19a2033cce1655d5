"""What a finished generation shows, read from its steps: each step's attention at absolute positions (the
timeline), the weight on the first token, and statements about a step, its query's weights and its cache.

Pure functions of a :class:`attnviz.pagelogic.generation.decode.Generation` (the page draws what they return)."""

from __future__ import annotations

import numpy as np

from attnviz.core.units import human_bytes
from attnviz.pagelogic.generation.decode import Generation, Step


def timeline(generation: Generation, layer: int, head: int) -> np.ndarray:
    """``[steps, positions]``: each step's query's weights over the keys it read, at their absolute positions;
    NaN where it read none: positions not written yet, and keys out of a sliding layer's window."""
    n = len(generation.prompt_tokens) + len(generation.steps)
    facts = generation.layers[layer] if layer < len(generation.layers) else None
    matrix = np.full((len(generation.steps), n), np.nan)
    for index, step in enumerate(generation.steps):
        first = facts.first_key(step.position - 1) if facts is not None else 0  # the query is at position - 1
        matrix[index, first: step.position] = step.attention[layer, head, first:].numpy()
    return matrix


def cross_timeline(generation: Generation, layer: int, head: int) -> np.ndarray:
    """``[steps, source tokens]``: an encoder-decoder's cross-attention of each step's query over the source."""
    return np.stack([step.cross_attention[layer, head].numpy() for step in generation.steps])


def sink_mass(generation: Generation) -> np.ndarray:
    """``[steps, layers, heads]``: the share of each step's attention on the first token, position 0 (the
    "attention sink"); 0 once a sliding layer's window has left it behind."""
    return np.stack([step.attention[:, :, 0].numpy() for step in generation.steps])


def first_token_leaves(generation: Generation, layer: int) -> int | None:
    """The first step (from 1) whose query no longer reads position 0 in ``layer`` (its window moved past it),
    or None when every step reads it."""
    if layer >= len(generation.layers):
        return None
    facts = generation.layers[layer]
    for index, step in enumerate(generation.steps):
        if facts.first_key(step.position - 1) > 0:
            return index + 1
    return None


def row_sum_statement(generation: Generation, step: int, layer: int, head: int) -> str:
    """What the weights of one step's query sum to, measured, and why when not 1: a learned sink (gpt-oss)."""
    total = float(generation.steps[step].attention[layer, head].sum())
    facts = generation.layers[layer] if layer < len(generation.layers) else None
    if facts is not None and facts.sinks:
        return (f"they sum to {total:.2f}: the other {1 - total:.2f} goes to this head's learned sink, a logit in "
                "every row's softmax with no key and no value (attention sinks, as gpt-oss has)")
    if abs(total - 1) < 5e-3:
        return f"they sum to {total:.2f}"
    return f"they sum to {total:.2f}, not 1"


def window_statement(generation: Generation, step: int, layer: int) -> str | None:
    """Where a sliding layer's window leaves keys out of this step's query, in words; None when it reads all."""
    if layer >= len(generation.layers):
        return None
    facts, position = generation.layers[layer], generation.steps[step].position
    first = facts.first_key(position - 1)
    if not first:
        return None
    return (f"Layer {layer} slides a window of {facts.window:,} tokens: this query reads only positions {first} to "
            f"{position - 1}; the {first} before them are out of its window (weight 0).")


def cache_holds(step: Step) -> str:
    """How many tokens the cache's tensors hold after ``step``, per layer as they differ: "12 tokens in every
    layer", or "12 tokens in layers 1, 3 and 3 tokens in layers 0, 2" (a sliding layer keeps only its window)."""
    held: dict[int, list[int]] = {}
    for layer, shape in enumerate(step.cache_keys):
        held.setdefault(shape[2], []).append(layer)
    if len(held) <= 1:
        return f"{next(iter(held), 0)} tokens in every layer"
    return " and ".join(f"{tokens} tokens in layer{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))}"
                        for tokens, layers in sorted(held.items(), reverse=True))


def cache_table(step: Step) -> list[dict]:
    """One row per layer: the K and V shapes in the cache after this step, and their bytes, all read from the
    cache object's own tensors (a model may cache in another dtype than its weights)."""
    return [{"layer": layer, "K shape [batch, K/V heads, tokens, head dim]": str(list(keys)),
             "V shape": str(list(values)), "bytes (K and V)": human_bytes(size)}
            for layer, (keys, values, size) in enumerate(zip(step.cache_keys, step.cache_values, step.layer_bytes,
                                                             strict=True))]
