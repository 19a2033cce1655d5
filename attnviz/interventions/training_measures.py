"""What a decoder has learned at one point of its training, measured the same way at every step of a run and on every
checkpoint of a series, so that the numbers can be laid along the step axis (Olsson et al. 2022, "In-context
learning and induction heads").

On a fixed :class:`Probe` (held-out text, and random tokens typed twice after a BOS):

- ``loss``: the mean next-token loss on windows of held-out text;
- ``icl``: the in-context-learning score, the loss on late tokens of those windows minus the loss on early ones
  (tokens ``LATE`` against ``EARLY``): negative when later tokens are predicted better because more context came
  before them (Olsson et al. take the 500th token against the 50th; our windows are 128 tokens);
- every head's ``previous_token``, ``induction`` and ``duplicate_token`` score: its mean attention weight on the
  detector's keys over the queries that have one, as the scans and the Head statistics tab score heads
  (previous-token on the held-out windows, the repeat detectors on the random tokens typed twice, whose keys
  :func:`attnviz.core.analysis.repeat_targets` gives);
- every head's ``ablation_cost``: how much the loss on the second copy of the repeated tokens rises when that head's
  output is zeroed (its slice of the output projection's input), against ``copy_loss``, the clean second copy's
  loss. Every head's ablation runs in one batched forward.

Works on any model transformers loads whose layers' output projections are found by name (GPT-2, the Llama family,
GPT-NeoX/Pythia, OPT, GPT-J, Phi); its attention is switched to eager for the attention weights and back.

Imports torch and attnviz.core (circuits, analysis)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from attnviz.core import analysis, circuits

EARLY = (8, 24)  # tokens [8, 24) of each window: little context before them
LATE = (96, 128)  # tokens [96, 128): most of the window before them
HEAD_MEASURES = ("previous_token", "induction", "duplicate_token", "ablation_cost")
# The module, inside each layer, whose input is the heads' outputs side by side (the first name a layer has)
OUTPUT_PROJECTIONS = ("attn.c_proj", "self_attn.o_proj", "attention.dense", "self_attn.out_proj", "attn.out_proj",
                      "self_attn.dense", "attn.o_proj")
LAYER_LISTS = ("transformer.h", "model.layers", "gpt_neox.layers", "model.decoder.layers", "layers", "h")


@dataclass
class Probe:
    """The inputs every checkpoint of a run is measured on (the same token ids, so checkpoints share a tokenizer)."""

    held_out: torch.Tensor  # [windows, length] token ids of held-out text
    repeated: torch.Tensor  # [sequences, start + 2 * period]: (a BOS), then random tokens, then the same again
    period: int
    start: int  # tokens before the first copy (1 with a BOS, else 0)


def make_probe(held_out_ids: torch.Tensor, pool: list[int], *, bos: int | None, length: int = 128,
               windows: int = 16, period: int = 40, sequences: int = 8, seed: int = 0) -> Probe:
    """``windows`` evenly spaced windows of ``length`` held-out tokens, and ``sequences`` runs of ``period`` tokens
    drawn from ``pool`` (seeded) typed twice, after ``bos`` where there is one."""
    if len(held_out_ids) < length + 1:
        raise ValueError(f"the held-out text has {len(held_out_ids)} tokens: at least {length + 1} are needed")
    if length < LATE[1]:
        raise ValueError(f"windows of {length} tokens are shorter than the late tokens measured ({LATE[1]})")
    starts = torch.linspace(0, len(held_out_ids) - length - 1, windows).long().tolist()
    held_out = torch.stack([held_out_ids[s : s + length] for s in starts])  # [windows, length]
    prefix = [bos] if bos is not None else []
    repeated = torch.tensor([circuits.repeated_random_tokens(period, seed=seed + 7919 * index, pool=pool,
                                                             prefix=prefix) for index in range(sequences)])
    return Probe(held_out, repeated, period, len(prefix))


def output_projections(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Each layer's output projection, in order (ValueError, in words, when the names are not known)."""
    for path in LAYER_LISTS:
        with contextlib.suppress(AttributeError):
            layers = model.get_submodule(path)
            if isinstance(layers, torch.nn.ModuleList) and len(layers):
                break
    else:
        raise ValueError("its list of layers was not found (looked for " + ", ".join(LAYER_LISTS) + ")")
    found = []
    for layer in layers:
        module = None
        for name in OUTPUT_PROJECTIONS:
            with contextlib.suppress(AttributeError):
                module = layer.get_submodule(name)
                break
        if module is None:
            raise ValueError("a layer's output projection was not found (looked for "
                             + ", ".join(OUTPUT_PROJECTIONS) + ")")
        found.append(module)
    return found


def _heads(model: torch.nn.Module) -> int:
    config = model.config
    for name in ("num_attention_heads", "n_head", "num_heads"):
        if isinstance(getattr(config, name, None), int):
            return getattr(config, name)
    raise ValueError("its number of heads was not found in its config")


@contextlib.contextmanager
def _eager(model: torch.nn.Module):
    """The model's attention as transformers' eager code (which returns the weights), put back afterwards."""
    before = model.config._attn_implementation
    if before != "eager":
        model.set_attn_implementation("eager")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)
        if before != "eager":
            model.set_attn_implementation(before)


def _token_losses(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``[rows, n, vocab], [rows, n] -> [rows, n - 1]``: loss of token i + 1 given tokens up to i."""
    return torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2).float(), ids[:, 1:], reduction="none")


def _mean_on(weights: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each head's weight on ``targets`` (``[n, n]`` bool) averaged over the queries that have one:
    ``[heads, n, n] -> [heads]``."""
    rows = targets.any(-1)  # [n]
    return (weights.double() * targets).sum(-1)[:, rows].mean(-1)


def measure(model: torch.nn.Module, probe: Probe) -> dict:
    """Every measure of the module docstring on ``probe``: ``loss``, ``icl``, ``early_loss``, ``late_loss``,
    ``copy_loss`` (floats) and each of :data:`HEAD_MEASURES` as ``[layers][heads]`` lists."""
    projections = output_projections(model)
    heads = _heads(model)
    device = next(model.parameters()).device
    held_out, repeated = probe.held_out.to(device), probe.repeated.to(device)
    with _eager(model):
        out = model(input_ids=held_out, output_attentions=True)
        losses = _token_losses(out.logits, held_out)  # [windows, length - 1]; column i: token i + 1
        early = losses[:, EARLY[0] - 1 : EARLY[1] - 1].mean()
        late = losses[:, LATE[0] - 1 : LATE[1] - 1].mean()
        previous = torch.stack([torch.stack([circuits.previous_token_score(weights[row])
                                             for row in range(len(held_out))]).double().mean(0)
                                for weights in out.attentions])  # [layers, heads]
        repeat = model(input_ids=repeated, output_attentions=True)
        induction, duplicate = [], []
        for row in range(len(repeated)):
            ids = repeated[row].tolist()
            special = [index < probe.start for index in range(len(ids))]
            targets = analysis.repeat_targets(ids, special)
            induction.append(torch.stack([_mean_on(w[row], targets["induction"]) for w in repeat.attentions]))
            duplicate.append(torch.stack([_mean_on(w[row], targets["duplicate"]) for w in repeat.attentions]))
        copy = slice(probe.start + probe.period, probe.start + 2 * probe.period - 1)  # the second copy's tokens
        clean = float(_token_losses(repeat.logits, repeated)[:, copy].mean())
        cost = _ablation_costs(model, projections, heads, repeated, copy, clean)
    return {"loss": float(losses.mean()), "icl": float(late - early), "early_loss": float(early),
            "late_loss": float(late), "copy_loss": clean, "previous_token": previous.tolist(),
            "induction": torch.stack(induction).mean(0).tolist(),
            "duplicate_token": torch.stack(duplicate).mean(0).tolist(), "ablation_cost": cost.tolist()}


def _ablation_costs(model: torch.nn.Module, projections: list[torch.nn.Module], heads: int, repeated: torch.Tensor,
                    copy: slice, clean: float) -> torch.Tensor:
    """``[layers, heads]``: the second copy's loss with each head zeroed, minus ``clean``. One forward: the batch
    holds the repeated sequences once per head, and each layer's pre-hook zeroes its own head's rows."""
    layers, sequences = len(projections), len(repeated)
    batch = repeated.repeat(layers * heads, 1)  # [layers * heads * sequences, n]; group g zeroes head g

    def zero(layer: int):
        def hook(_, arguments):
            merged = arguments[0].clone()  # [rows, n, heads * d_head]
            width = merged.shape[-1] // heads
            for head in range(heads):
                group = (layer * heads + head) * sequences
                merged[group : group + sequences, :, head * width : (head + 1) * width] = 0
            return (merged, *arguments[1:])
        return hook

    handles = [projection.register_forward_pre_hook(zero(layer)) for layer, projection in enumerate(projections)]
    try:
        logits = model(input_ids=batch).logits
    finally:
        for handle in handles:
            handle.remove()
    losses = _token_losses(logits, batch)[:, copy].mean(-1)  # [layers * heads * sequences]
    return losses.view(layers, heads, sequences).mean(-1).double() - clean


# -- the phase change -----------------------------------------------------------------------------------------------
PHASE_RULE = ("the head with the highest induction score at the last step is followed: the phase change runs from the "
              "measured step at which its score last rose past 10% of the way from its value at the first step to "
              "its highest value (and stayed there), to the first at which it has risen 90% of the way (none is "
              f"marked when it rises by less than {0.1}; steps without a finite score are passed over)")
LEAST_RISE = 0.1


@dataclass
class PhaseChange:
    """Where :data:`PHASE_RULE` puts the phase change on the measured steps."""

    layer: int
    head: int
    start: int  # the first measured step at 10% of the rise
    middle: int  # ... at 50%
    end: int  # ... at 90%
    before: int | None  # the last measured step before ``start`` (None: it starts at the first)
    low: float  # the head's score at the first step
    high: float  # its highest

    @property
    def after(self) -> int:
        return self.end

    def as_dict(self) -> dict:
        return {"layer": self.layer, "head": self.head, "start": self.start, "middle": self.middle, "end": self.end,
                "before": self.before, "low": self.low, "high": self.high}


def followed_head(induction) -> tuple[int, int] | None:
    """The head :data:`PHASE_RULE` follows: the highest finite induction score at the last step of ``induction``
    ``[measured steps][layers][heads]`` (the first such head on a tie); None when no score there is finite."""
    last = torch.as_tensor(induction, dtype=torch.float64)[-1]  # [layers, heads]
    if not torch.isfinite(last).any():
        return None
    layer, head = divmod(int(torch.where(torch.isfinite(last), last, -torch.inf).flatten().argmax()), last.shape[1])
    return layer, head


def phase_change(steps: list[int], induction: list[list[list[float]]]) -> PhaseChange | None:
    """:data:`PHASE_RULE` on the induction scores ``[measured steps][layers][heads]`` at ``steps`` (ascending). A score
    that is not finite (a diverged checkpoint) is never the highest, nor past any share of the rise."""
    scores = torch.tensor(induction, dtype=torch.float64)  # [steps, layers, heads]
    if not len(steps) or scores.numel() == 0:
        return None
    finite = torch.isfinite(scores)
    followed = followed_head(scores)
    if followed is None:
        return None
    layer, head = followed
    curve = scores[:, layer, head]  # [steps]
    kept = finite[:, layer, head]
    if int(kept.sum()) < 2:
        return None
    low, high = float(curve[kept][0]), float(curve[kept].max())
    if high - low < LEAST_RISE:
        return None

    def past(share: float) -> list[bool]:  # per step; False where the score is not finite
        return (curve >= low + share * (high - low)).tolist()

    end = past(0.9).index(True)

    def last_rise(share: float) -> int:
        """The first step of the unbroken stretch past ``share`` that reaches ``end``."""
        above, index = past(share), end
        while index > 0 and above[index - 1]:
            index -= 1
        return index

    start, middle = last_rise(0.1), last_rise(0.5)
    return PhaseChange(layer, head, steps[start], steps[middle], steps[end], steps[start - 1] if start else None,
                       low, high)
