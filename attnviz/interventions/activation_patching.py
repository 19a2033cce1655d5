"""Activation patching, complete: by layer and position of the residual stream, of each attention output and MLP
output (causal tracing, Meng et al. 2022), by head (and position), and of a head's queries, keys, values or pattern
alone; in both directions (denoising: the clean run's activation put into the corrupted run; noising: the
corrupted run's put into the clean run); measured by the logit difference between an answer and a foil, the
answer's probability or its loss, each also as a share of the clean-corrupted gap; on several examples at once, each
kept, with a bootstrap interval of their mean. Path patching (from one head to another through Q, K or V) is in
:mod:`attnviz.interventions.path_patching`, on the same hooks.

A patch map's cells run batched: each row of a forward patches one cell, row 0 of every forward patches nothing and
is what each cell is measured against (so that a patch that changes nothing moves the metric by 0 exactly, whatever
a batch's rounding). Heads under grouped-query attention: query and pattern patches are per query head, key and
value patches per K/V head (one K/V head serves several query heads; patching it changes all of them).

Imports torch and attnviz.interventions (and, through them, attnviz.models)."""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from attnviz.interventions.anatomy import Anatomy, anatomy
from attnviz.interventions.edits import on_residual
from attnviz.models.attention_hook import editing

SITES = {
    "resid": "residual stream",
    "attn": "attention output",
    "mlp": "MLP output",
    "head": "head output",
    "q": "head queries",
    "k": "head keys",
    "v": "head values",
    "pattern": "head pattern",
}
HEAD_SITES = ("head", "q", "k", "v", "pattern")
METRICS = {
    "logit difference": "logit(answer) - logit(foil) at the example's position (the last: the next token)",
    "probability": "the answer's probability there",
    "loss": "the answer's loss (-log probability) there",
}
DIRECTIONS = {
    "denoising": "the clean run's activation put into the corrupted run (is this part enough to bring the answer "
                 "back?)",
    "noising": "the corrupted run's activation put into the clean run (does breaking this part alone break the "
               "answer?)",
}


@dataclass(frozen=True)
class Example:
    """One clean prompt and its corrupted twin (the same length in tokens), the answer the clean one leads to and
    the foil (None: the corrupted run's most likely token other than the answer), and the position whose logits the
    metric reads (-1: the last, a decoder's next token; a masked LM's: the mask's position)."""

    clean: list[int]
    corrupted: list[int]
    answer: int
    foil: int | None = None
    position: int = -1


def examples_of(prompts) -> list[Example]:
    """:class:`Example` s from :class:`attnviz.interventions.patching.Prompts` (one, or several)."""
    prompts = prompts if isinstance(prompts, list | tuple) else [prompts]
    return [p if isinstance(p, Example) else Example(list(p.clean), list(p.corrupted), p.answer, p.foil)
            for p in prompts]


# -- where a patch acts ---------------------------------------------------------------------------------------------
# Module outputs (attention output, MLP output) are watched by forward hooks put on once per model and acting only
# inside an :func:`on_outputs` block of the calling thread, on that model, as the residual hooks and the attention
# edits do: a server's sessions share one model and must never see each other's patches.


@dataclass
class _OutputsBlock:
    model: int
    editor: Callable[[str, torch.Tensor], torch.Tensor]


_OUTPUTS: contextvars.ContextVar[_OutputsBlock | None] = contextvars.ContextVar("attnviz_outputs", default=None)
_INSTALLING = threading.Lock()


def _output_hook(model: torch.nn.Module, name: str):
    owner = id(model)

    def hook(_, __, output):
        state = _OUTPUTS.get()
        if state is None or state.model != owner:
            return None
        if isinstance(output, tuple):
            return (state.editor(name, output[0]), *output[1:])
        return state.editor(name, output)

    return hook


@contextlib.contextmanager
def on_outputs(model: torch.nn.Module, names: list[str], editor: Callable[[str, torch.Tensor], torch.Tensor]):
    """Forwards of ``model`` in this thread inside the block hand the output of each module in ``names`` (its first
    element, for a module returning a tuple) to ``editor(name, output)`` and go on with what it returns."""
    with _INSTALLING:
        installed = model.__dict__.setdefault("_attnviz_output_hooks", set())
        for name in names:
            if name not in installed:
                model.get_submodule(name).register_forward_hook(_output_hook(model, name))
                installed.add(name)
    token = _OUTPUTS.set(_OutputsBlock(id(model), editor))
    try:
        yield
    finally:
        _OUTPUTS.reset(token)


@dataclass(frozen=True)
class Cell:
    """One patch: at ``layer`` (a residual row: the stream entering that layer, L: leaving the last), ``head``
    (None: the whole site) and ``position`` (None: every position; for a pattern, the query position)."""

    layer: int
    head: int | None = None
    position: int | None = None


def _heads_at(site: str, model: torch.nn.Module, parts: Anatomy, layer: int) -> int:
    heads = parts.layers[layer].attention.heads
    if site in ("k", "v"):
        kv = _kv_heads(model, parts, layer)
        return heads if kv is None else kv
    return heads


def _kv_heads(model: torch.nn.Module, parts: Anatomy, layer: int) -> int | None:
    config = getattr(model, "config", None)
    value = getattr(config, "num_key_value_heads", None) or getattr(config, "multi_query_group_num", None)
    if getattr(config, "multi_query", False):
        return 1
    return int(value) if value else None


@contextlib.contextmanager
def _at_site(model: torch.nn.Module, parts: Anatomy, site: str,
             edit: Callable[[int, torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """Forwards inside the block hand the site's activation at each layer to ``edit(layer, activation)`` and go on
    with what it returns: ``[batch, n, d_model]`` for resid, attn and mlp; ``[batch, n, heads, d_v]`` for head;
    ``[batch, heads, n, d]`` for q, k, v (k, v: the K/V heads); ``[batch, heads, n_q, n_k]`` for pattern."""
    attention_layer = {layer.attention.name: index for index, layer in enumerate(parts.layers)}
    if site == "resid":
        with on_residual(model, [layer.block for layer in parts.layers], edit):
            yield
    elif site in ("attn", "mlp"):
        names = [layer.output_projection if site == "attn" else layer.mlp for layer in parts.layers]
        if None in names:
            raise ValueError("this model's MLPs were not found, so their outputs are not patched")
        index = {name: layer for layer, name in enumerate(names)}
        with on_outputs(model, names, lambda name, output: edit(index[name], output) if name in index else output):
            yield
    elif site == "head":
        with editing(model, lambda name, output: edit(attention_layer[name], output)
                     if name in attention_layer else output):
            yield
    elif site in ("q", "k", "v"):
        slot = "qkv".index(site)

        def inputs(name, query, key, value):
            if name not in attention_layer:
                return query, key, value
            tensors = [query, key, value]
            tensors[slot] = edit(attention_layer[name], tensors[slot])
            return tuple(tensors)

        with editing(model, lambda _, output: output, inputs=inputs):
            yield
    elif site == "pattern":
        with editing(model, lambda _, output: output, pattern_calls=list(attention_layer),
                     pattern=lambda name, weights: edit(attention_layer[name], weights)):
            yield
    else:
        raise ValueError(f"unknown site {site!r}: one of {', '.join(SITES)}")


def _select(site: str, tensor: torch.Tensor, head: int | None, position: int | None):
    """The index of ``tensor`` (a site's activation, batch dimension first) that a cell patches, after the batch."""
    if site in ("resid", "attn", "mlp"):
        return (slice(None) if position is None else position,)
    if site == "head":  # [batch, n, heads, d_v]
        return (slice(None) if position is None else position, slice(None) if head is None else head)
    # q, k, v: [batch, heads, n, d]; pattern: [batch, heads, n_q, n_k] (position: the query row)
    return (slice(None) if head is None else head, slice(None) if position is None else position)


def capture_site(model: torch.nn.Module, parts: Anatomy, site: str, ids: list[int]) -> dict[int, torch.Tensor]:
    """One forward of ``ids``: the site's activation at each layer, batch item 0 (detached)."""
    kept: dict[int, torch.Tensor] = {}

    def keep(layer: int, activation: torch.Tensor) -> torch.Tensor:
        kept.setdefault(layer, activation[0].detach().clone())
        return activation

    with torch.no_grad(), _at_site(model, parts, site, keep):
        model(input_ids=torch.tensor([ids]))
    return kept


def _keeps_last(model: torch.nn.Module) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def _last_logits(model: torch.nn.Module, batch: torch.Tensor, position: int = -1) -> torch.Tensor:
    """The logits at ``position`` of every row: ``[rows, vocab]``. For the last position of a model that can, only
    that position goes through the unembedding (the same logits; a 17 x 91 batch of the tiny GPT 30 % faster)."""
    if position == -1 and _keeps_last(model):
        return model(input_ids=batch, logits_to_keep=1).logits[:, -1].double()
    return model(input_ids=batch).logits[:, position].double()


def metric_of(metric: str, logits: torch.Tensor, answer: int, foil: int) -> torch.Tensor:
    """``metric`` of each row of ``logits`` ``[rows, vocab]`` (the last position's): ``[rows]``."""
    if metric == "logit difference":
        return logits[:, answer] - logits[:, foil]
    log_probabilities = torch.log_softmax(logits, dim=-1)[:, answer]
    if metric == "probability":
        return log_probabilities.exp()
    if metric == "loss":
        return -log_probabilities
    raise ValueError(f"unknown metric {metric!r}: one of {', '.join(METRICS)}")


def top_other(logits: torch.Tensor, answer: int) -> int:
    """The most likely token other than ``answer`` (``logits [vocab]``)."""
    return next(token for token in logits.argsort(descending=True).tolist() if token != answer)


# -- one example ----------------------------------------------------------------------------------------------------
@dataclass
class Measured:
    """One example's ends: the metric on the clean and the corrupted run, and the foil used."""

    clean: float
    corrupted: float
    foil: int


def ends(model: torch.nn.Module, example: Example, metric: str) -> Measured:
    """The metric on the example's clean and corrupted runs (the foil chosen when none is given)."""
    with torch.no_grad():
        logits = _last_logits(model, torch.tensor([example.clean, example.corrupted]), example.position)
    foil = example.foil if example.foil is not None else top_other(logits[1], example.answer)
    values = metric_of(metric, logits, example.answer, foil)
    return Measured(float(values[0]), float(values[1]), foil)


def ends_of(every: list[Measured]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The examples' clean and corrupted metrics ``[examples]`` and their foils, as a map keeps them."""
    return (torch.tensor([m.clean for m in every], dtype=torch.float64),
            torch.tensor([m.corrupted for m in every], dtype=torch.float64), [m.foil for m in every])


def gap_of(measured: Measured, example: Example) -> float:
    """The clean-corrupted gap each share divides by: 0 for prompts that are the same (two rows of one batch may
    round apart) or a gap within rounding of the metric's size."""
    gap = measured.clean - measured.corrupted
    if example.clean == example.corrupted or abs(gap) <= 1e-9 * max(1.0, abs(measured.clean), abs(measured.corrupted)):
        return 0.0
    return gap


def source_and_target(example: Example, direction: str) -> tuple[list[int], list[int]]:
    """The run an activation comes from and the run it is put into: clean into corrupted (denoising), or corrupted
    into clean (noising)."""
    return (example.clean, example.corrupted) if direction == "denoising" else (example.corrupted, example.clean)


def shares_of(moved: torch.Tensor, measured: Measured, example: Example, direction: str) -> torch.Tensor:
    """How far each patch moved the metric from the unpatched target, as a share of the example's gap (NaN: no gap);
    denoising: toward the clean run, noising: away from it."""
    gap = gap_of(measured, example)
    if gap == 0:
        return torch.full_like(moved, float("nan"))
    return moved / gap if direction == "denoising" else -moved / gap


def run_cells(model: torch.nn.Module, parts: Anatomy, site: str, target: list[int],
              source: dict[int, torch.Tensor], cells: list[Cell], measure: Callable[[torch.Tensor], torch.Tensor],
              *, rows_per_forward: int = 16, progress: Callable[[int], None] | None = None,
              position: int = -1) -> torch.Tensor:
    """Each cell's patch (``source`` put into a forward of ``target``) measured by ``measure(last logits)``, as its
    change from the unpatched target: ``[cells]`` float64."""
    moved = torch.empty(len(cells), dtype=torch.float64)
    for start in range(0, len(cells), rows_per_forward):
        chunk = cells[start:start + rows_per_forward]
        by_layer: dict[int, list[tuple[int, Cell]]] = {}
        for row, cell in enumerate(chunk, 1):  # row 0: the target unpatched, in the same forward
            by_layer.setdefault(cell.layer, []).append((row, cell))

        def patch(layer: int, activation: torch.Tensor, by_layer=by_layer) -> torch.Tensor:
            if layer not in by_layer:
                return activation
            activation = activation.clone()
            for row, cell in by_layer[layer]:
                index = _select(site, activation, cell.head, cell.position)
                activation[(row, *index)] = source[layer][index].to(activation.dtype)
            return activation

        batch = torch.tensor([target]).repeat(len(chunk) + 1, 1)
        with torch.no_grad(), _at_site(model, parts, site, patch):
            values = measure(_last_logits(model, batch, position))
        moved[start:start + len(chunk)] = values[1:] - values[0]
        if progress is not None:
            progress(len(chunk))
    return moved


# -- a map over examples --------------------------------------------------------------------------------------------
@dataclass
class Spread:
    """The mean over examples of a map, and how far the examples disagree: their standard deviation and a 95 %
    bootstrap interval of the mean (resampling examples; NaN with one example: nothing to resample)."""

    mean: torch.Tensor
    std: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor
    examples: int


def spread(values: torch.Tensor, *, draws: int = 2000, seed: int = 0) -> Spread:
    """``values [examples, ...]`` summarised over the first dimension (NaNs left out of nothing: a NaN cell stays
    NaN)."""
    count = values.shape[0]
    mean = values.mean(0)
    if count < 2:
        nan = torch.full_like(mean, float("nan"))
        return Spread(mean, nan, nan.clone(), nan.clone(), count)
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(count, (draws, count), generator=generator)  # [draws, examples]
    means = values[picks].mean(1)  # [draws, ...]
    low, high = torch.quantile(means, torch.tensor([0.025, 0.975], dtype=means.dtype), dim=0)
    return Spread(mean, values.std(0), low, high, count)


@dataclass
class PatchMap:
    """A patching map over one or more examples. ``values [examples, *grid]``: the metric with each cell patched;
    ``shares``: the same as a share of the clean-corrupted gap (denoising: (patched - corrupted) / (clean -
    corrupted), how much of the answer the patch brings back; noising: (clean - patched) / (clean - corrupted), how
    much of it the patch alone takes away; 1 either way: all of it). ``grid``: ``[rows, positions]`` for resid, attn
    and mlp; ``[layers, heads]`` for a head site over every position, ``[layers, heads, positions]`` by position."""

    site: str
    direction: str
    metric: str
    values: torch.Tensor
    shares: torch.Tensor
    clean: torch.Tensor  # [examples]
    corrupted: torch.Tensor  # [examples]
    foils: list[int]
    rows: list[str]
    by_position: bool
    heads: list[int] = field(default_factory=list)  # per layer (head sites)

    @property
    def share_spread(self) -> Spread:
        return spread(self.shares)

    @property
    def value_spread(self) -> Spread:
        return spread(self.values)


def residual_rows(layers: int) -> list[str]:
    return ["embeddings (into layer 0)", *(f"into layer {layer}" for layer in range(1, layers)),
            f"out of layer {layers - 1}"]


def cells_of(site: str, model: torch.nn.Module, parts: Anatomy, n: int, by_position: bool) -> tuple[list[Cell], tuple]:
    """Every cell of a site's map, in the map's order, and the map's grid shape."""
    layers = len(parts.layers)
    if site == "resid":
        return [Cell(layer, None, p) for layer in range(layers + 1) for p in range(n)], (layers + 1, n)
    if site in ("attn", "mlp"):
        return [Cell(layer, None, p) for layer in range(layers) for p in range(n)], (layers, n)
    heads = [_heads_at(site, model, parts, layer) for layer in range(layers)]
    most = max(heads)
    if by_position:
        return ([Cell(layer, head, p) for layer in range(layers) for head in range(most) for p in range(n)],
                (layers, most, n))
    return [Cell(layer, head) for layer in range(layers) for head in range(most)], (layers, most)


def checked_examples(examples, direction: str, metric: str) -> list[Example]:
    """The examples as :class:`Example` s, refused (ValueError, in words) when the direction or metric is unknown or
    when they are not all prompts of one non-zero length."""
    examples = examples_of(examples)
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r}: denoising or noising")
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}: one of {', '.join(METRICS)}")
    if not examples:
        raise ValueError("no examples")
    n = len(examples[0].clean)
    for example in examples:
        if len(example.clean) != len(example.corrupted) or len(example.clean) != n or n == 0:
            raise ValueError("every clean and corrupted prompt must have the same, non-zero, number of tokens")
    return examples


def patch_map(model: torch.nn.Module, examples, site: str, *, direction: str = "denoising",
              metric: str = "logit difference", by_position: bool | None = None, rows_per_forward: int = 16,
              progress: Callable[[float, str], None] | None = None, parts: Anatomy | None = None) -> PatchMap:
    """Patch every cell of ``site`` (:data:`SITES`) on every example (:class:`Example`, or the page's ``Prompts``;
    all the same length), one cell at a time, and measure ``metric`` (:data:`METRICS`) at the last position.
    ``by_position`` (head sites only; default False): one cell per head and position instead of per head. A causal
    LM whose layers are a list of blocks (:func:`attnviz.interventions.anatomy.anatomy`)."""
    examples = checked_examples(examples, direction, metric)
    n = len(examples[0].clean)
    parts = parts or anatomy(model, {"input_ids": torch.tensor([examples[0].clean])})
    by_position = bool(by_position) and site in HEAD_SITES
    cells, grid = cells_of(site, model, parts, n, by_position)
    heads = [_heads_at(site, model, parts, layer) for layer in range(len(parts.layers))]
    real = [cell.head is None or cell.head < heads[min(cell.layer, len(heads) - 1)] for cell in cells]
    live = [cell for cell, keep in zip(cells, real, strict=True) if keep]
    values = torch.full((len(examples), len(cells)), float("nan"), dtype=torch.float64)
    shares = values.clone()
    every: list[Measured] = []
    total, done = len(examples) * len(live), 0
    for index, example in enumerate(examples):
        measured = ends(model, example, metric)
        every.append(measured)
        source_ids, target_ids = source_and_target(example, direction)
        source = capture_site(model, parts, site, source_ids)

        def count(rows: int, index=index) -> None:
            nonlocal done
            done += rows
            if progress is not None:
                progress(done / total, f"example {index + 1} of {len(examples)}")

        moved = run_cells(model, parts, site, target_ids, source, live,
                          lambda logits, example=example, foil=measured.foil: metric_of(metric, logits,
                                                                                        example.answer, foil),
                          rows_per_forward=rows_per_forward, progress=count, position=example.position)
        mask = torch.tensor(real)
        values[index, mask] = (measured.corrupted if direction == "denoising" else measured.clean) + moved
        shares[index, mask] = shares_of(moved, measured, example, direction)
    rows = residual_rows(len(parts.layers)) if site == "resid" else \
        [layer.attention.label for layer in parts.layers]
    return PatchMap(site, direction, metric, values.reshape(len(examples), *grid),
                    shares.reshape(len(examples), *grid), *ends_of(every), rows, by_position, heads)


def whole_layers(model: torch.nn.Module, examples, site: str = "head", *, direction: str = "denoising",
                 metric: str = "logit difference", parts: Anatomy | None = None) -> torch.Tensor:
    """Every head of a layer (``site="head"``; or its whole attention or MLP output, or the residual stream entering
    it) patched at every position at once, layer by layer: the shares ``[examples, layers]``, as :func:`patch_map`
    defines them (one batched forward per example)."""
    examples = examples_of(examples)
    parts = parts or anatomy(model, {"input_ids": torch.tensor([examples[0].clean])})
    cells = [Cell(layer) for layer in range(len(parts.layers))]
    shares = torch.full((len(examples), len(cells)), float("nan"), dtype=torch.float64)
    for index, example in enumerate(examples):
        measured = ends(model, example, metric)
        source_ids, target_ids = source_and_target(example, direction)
        moved = run_cells(model, parts, site, target_ids, capture_site(model, parts, site, source_ids), cells,
                          lambda logits, example=example, foil=measured.foil: metric_of(metric, logits,
                                                                                        example.answer, foil),
                          rows_per_forward=len(cells), position=example.position)
        shares[index] = shares_of(moved, measured, example, direction)
    return shares


def forwards_needed(site: str, model: torch.nn.Module, parts: Anatomy, n: int, *, by_position: bool = False,
                    rows_per_forward: int = 16) -> int:
    """How many batched forwards one example's map takes (the two ends and the source's capture included)."""
    cells, _ = cells_of(site, model, parts, n, by_position and site in HEAD_SITES)
    return 2 + math.ceil(len(cells) / rows_per_forward)
