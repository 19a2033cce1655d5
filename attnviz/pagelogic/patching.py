"""What the patching experiment's views say: its maps as the figures take them (rows, columns, labels), the cells
worth showing example by example, and every sentence about them, each computed from the numbers shown (the mean
over examples, its 95 % bootstrap interval, how many examples agree in sign). No Streamlit."""

from __future__ import annotations

import torch

from attnviz.interventions import activation_patching as ap
from attnviz.interventions import path_patching as pp
from attnviz.viz.style import format_number

CARRIES = 0.1  # a share whose whole 95 % interval lies above this is "carried" (a tenth of the gap or more)
NOTHING = 0.05  # a share whose interval lies within +-this is "nothing measurable"


def position_labels(tokens_clean: list[str], tokens_corrupted: list[str]) -> list[str]:
    """One label per position: its index and clean token; ▶ and both tokens where the prompts differ."""
    labels = []
    for position, (clean, corrupted) in enumerate(zip(tokens_clean, tokens_corrupted, strict=True)):
        label = f"{position} {clean}"
        labels.append(f"▶ {label} → {corrupted}" if clean != corrupted else label)
    return labels


def head_labels(heads: list[int]) -> list[str]:
    return [f"H{head}" for head in range(max(heads))]


def as_grid(result: ap.PatchMap) -> tuple[torch.Tensor, list[str]]:
    """``(shares [examples, rows, columns], row labels)``: a head map by position becomes one row per head."""
    shares = result.shares
    if result.by_position:  # [examples, layers, heads, n] -> [examples, layers * heads, n]
        examples, layers, heads, n = shares.shape
        rows = [f"{label} H{head}" for label in result.rows for head in range(heads)]
        return shares.reshape(examples, layers * heads, n), rows
    return shares, list(result.rows)


def top_cells(shares: torch.Tensor, rows: list[str], columns: list[str], count: int = 6
              ) -> tuple[torch.Tensor, list[str]]:
    """The ``count`` cells with the largest mean share in magnitude: ``(values [examples, count], labels)``."""
    mean = shares.mean(0).nan_to_num(0.0)
    order = mean.abs().flatten().argsort(descending=True)[:count].tolist()
    width = shares.shape[-1]
    picked = [(index // width, index % width) for index in order]
    values = torch.stack([shares[:, r, c] for r, c in picked], dim=1)
    return values, [f"{rows[r]}, {columns[c]}" for r, c in picked]


def _interval(spread: ap.Spread, index: tuple) -> str:
    if spread.examples < 2:
        return "one example: no interval"
    return f"95% interval {format_number(float(spread.low[index]))} to {format_number(float(spread.high[index]))}"


def map_words(shares: torch.Tensor, rows: list[str], columns: list[str], direction: str) -> str:
    """The map's largest cell with its interval, whether the examples agree on it, and whether anything is carried
    at all, in words. ``direction``: "denoising" or "noising" (shares of the gap), or "attribution" (direct parts of
    the logit difference, in logits)."""
    spread = ap.spread(shares)
    mean = spread.mean.nan_to_num(0.0)
    flat = int(mean.abs().flatten().argmax())
    index = (flat // mean.shape[-1], flat % mean.shape[-1])
    cell = f"{rows[index[0]]}, {columns[index[1]]}"
    value = float(spread.mean[index])
    plural = "s" if spread.examples != 1 else ""
    if direction == "attribution":
        toward = "the answer" if value >= 0 else "the foil"
        said = [f"The largest cell is **{cell}**: it writes {format_number(abs(value))} logits toward {toward} on "
                f"average ({_interval(spread, index)}, {spread.examples} example{plural})."]
    else:
        verb = "brings back" if direction == "denoising" else "takes away"
        said = [f"The largest cell is **{cell}**: patching it {verb} {format_number(value)} of the gap on average "
                f"({_interval(spread, index)}, {spread.examples} example{plural})."]
    if spread.examples > 1:
        signs = torch.sign(shares[(slice(None), *index)])
        against = int((signs != torch.sign(torch.tensor(value))).sum())
        if against:
            said.append(f"{against} of {spread.examples} examples move the other way there: the mean hides them.")
        if float(spread.low[index]) <= 0 <= float(spread.high[index]):
            said.append("Its interval includes 0: over these examples the cell is not told apart from nothing.")
    if direction != "attribution" and abs(value) < NOTHING:
        said.append(f"No cell reaches {format_number(NOTHING)} of the gap: nothing here carries the answer alone.")
    return " ".join(said)


def path_words(frozen: pp.PathMap, free: pp.PathMap, through: dict[int, pp.PathMap], weights=None) -> str:
    """The strongest sender into the receiver's input, directly (MLPs held) and with the MLPs free, and which MLP
    carries the path when one does, in words that follow from the intervals; with ``weights`` (the
    :class:`~attnviz.interventions.composition.CompositionScores` of the same input), what the weights alone say of
    that pair and which sender they rank first."""
    receiver = f"L{free.receiver[0]} H{free.receiver[1]}'s {pp.VIA[free.via]}"
    free_spread, frozen_spread = free.share_spread, frozen.share_spread
    both = torch.maximum(free_spread.mean.nan_to_num(-1e9), frozen_spread.mean.nan_to_num(-1e9))
    flat = int(both.flatten().argmax())
    index = (flat // both.shape[-1], flat % both.shape[-1])
    sender = f"{free.rows[index[0]]} H{index[1]}".replace("layer ", "L")
    direct, total = float(frozen_spread.mean[index]), float(free_spread.mean[index])
    said = [f"Strongest sender into {receiver}: **{sender}**. With the MLPs between them held it carries "
            f"{format_number(direct)} of the gap ({_interval(frozen_spread, index)}); with them free, "
            f"{format_number(total)} ({_interval(free_spread, index)})."]
    examples = free_spread.examples
    direct_low = float(frozen_spread.low[index]) if examples > 1 else direct
    free_low = float(free_spread.low[index]) if examples > 1 else total
    direct_high = float(frozen_spread.high[index]) if examples > 1 else direct
    if free_low > CARRIES and direct_high < NOTHING:
        said.append("So the path runs **through the MLPs**, not directly: the textbook circuit's direct "
                    "composition is not what this model does here.")
    elif direct_low > CARRIES:
        said.append("So the path is **direct** (through the residual stream)" + (
            f", and the MLPs add {format_number(total - direct)}." if total - direct > NOTHING else "."))
    elif max(abs(direct), abs(total)) < NOTHING:
        said.append(f"No path into {receiver} reaches {format_number(NOTHING)} of the gap: with this corruption the "
                    "senders' change does not reach it (a corruption that leaves what this input reads untouched "
                    "cannot tell a working path from a broken one).")
    else:
        said.append("The intervals are too wide to say which way the path runs: more examples would tell.")
    for layer, alone in sorted(through.items()):
        spread = alone.share_spread
        said.append(f"Only L{layer}'s MLP free: {format_number(float(spread.mean[index]))} "
                    f"({_interval(spread, index)}).")
    if weights is not None:
        layer, head = free.receiver
        score = float(weights.scores[index[0], index[1], layer, head])
        above = float(weights.spreads_above()[index[0], index[1], layer, head])
        into = weights.scores[:layer, :, layer, head].nan_to_num(-1.0)  # [senders' layers, heads]
        best = int(into.flatten().argmax())
        best_sender = (best // into.shape[1], best % into.shape[1])
        ranked = "the same pair" if best_sender == index else \
            f"L{best_sender[0]} H{best_sender[1]} ({format_number(float(into[best_sender]))})"
        said.append(f"From the weights alone, {sender} → L{layer} H{head} scores {format_number(score)} for "
                    f"{weights.kind}-composition ({above:+.1f} spreads from random matrices of the same shapes); "
                    f"the sender the weights rank first into this input is {ranked}.")
    return " ".join(said)
