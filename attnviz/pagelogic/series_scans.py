"""What the Over training page says about a series scanned over a corpus at each checkpoint
(:mod:`attnviz.corpus.series.scans`): each statistic's name, the step a map is drawn at, the map's title, and a caption
whose numbers are read off the maps shown (the highest head at the step, and where that head stood at the first
scanned step). No Streamlit: the page draws these."""

from __future__ import annotations

import numpy as np

from attnviz.pagelogic.corpus import STATISTIC_NAMES

PREFERRED = ("induction", "previous")  # what the map opens on, the first a scan has


def statistic_name(statistic: str) -> str:
    """A statistic's name on the page; a head label (``"induction head"``) as the share of documents with it."""
    return STATISTIC_NAMES.get(statistic, f"documents labelled '{statistic}'")


def default_statistic(statistics: list[str]) -> str:
    """The statistic the map opens on: induction where the scans have it, else previous, else the first."""
    return next((name for name in PREFERRED if name in statistics), statistics[0])


def step_shown(wanted: int | None, steps: list[int]) -> int:
    """The scanned step drawn for the step chosen on the page (``wanted``, None before the slider exists): the
    latest scanned step at or before it, else the first scanned (a step measured but not scanned yet)."""
    if wanted is None:
        return steps[-1]
    earlier = [step for step in steps if step <= wanted]
    return earlier[-1] if earlier else steps[0]


def map_title(statistic: str, step: int, documents: int) -> str:
    return f"{statistic_name(statistic)}, every head, at step {step:,} ({documents:,} documents of the corpus)"


def value_range(statistic: str, maps: dict[int, np.ndarray]) -> tuple[float, float] | None:
    """One colour range for every step of a statistic, so that a colour means the same value as the step moves:
    shares of weight and of documents on 0..1, entropy and distance from their lowest to their highest value over
    every step (None when no head has one)."""
    if statistic not in ("entropy", "mean_distance"):
        return (0.0, 1.0)
    values = np.concatenate([np.ravel(grid) for grid in maps.values()]) if maps else np.array([])
    values = values[np.isfinite(values)]
    if not values.size:
        return None
    low, high = float(values.min()), float(values.max())
    return (low, high if high > low else low + 1e-9)


def map_caption(statistic: str, step: int, wanted: int | None, maps: dict[int, np.ndarray]) -> str:
    """What to notice on the map at ``step``: its highest head and that head's value at the first scanned step
    (read off ``maps``, ``{step: [layers, heads]}``), and, where the page's step was not scanned, which one is drawn."""
    grid = np.asarray(maps[step], dtype=float)
    said = ""
    if wanted is not None and wanted != step:
        said = f"Step {wanted:,} was not scanned: the map is step {step:,}'s. "
    if not np.isfinite(grid).any():  # NaN and infinite alike
        return said + "No head has this statistic at this step."
    finite = np.where(np.isfinite(grid), grid, -np.inf)  # an infinite value is no value either
    layer, head = (int(i) for i in np.unravel_index(np.argmax(finite), grid.shape))
    said += f"Highest at step {step:,}: L{layer} H{head} ({grid[layer, head]:.3g})"
    first = min(maps)
    if first != step:
        before = float(np.asarray(maps[first], dtype=float)[layer, head])
        said += (f", which had {before:.3g} at step {first:,}" if np.isfinite(before)
                 else f", which had no value at step {first:,}")
    return said + (". Move the step to play the map over training." if len(maps) > 1 else
                   ". One step is scanned so far.")
