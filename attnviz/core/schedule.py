"""The learning-rate schedule attnviz trains with, and the steps it measures a run at: the bundled tiny GPT's recipe
and the pre-norm against post-norm runs of the Over training page share both (one formula each, so that the runs
there are the recipe's).

Imports math only."""

from __future__ import annotations

import math


def warmup_cosine(step: int, peak: float, warmup: int, steps: int) -> float:
    """Linear warm-up over ``warmup`` steps, then a cosine decay to a tenth of ``peak`` at ``steps`` (no warm-up:
    the cosine starts at the peak)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def log_spaced_steps(last: int, count: int, first: int = 1) -> list[int]:
    """Step 0, then ``count`` steps from ``first`` to ``last`` spaced evenly on a log scale (rounded, repeats
    dropped, ``last`` always kept): where a run is measured, so that its early steps, which change most, are not
    crowded out by the late ones."""
    ratio = math.log(last / first) / max(1, count - 1)
    found = {max(1, round(first * math.exp(ratio * index))) for index in range(count)}
    return [0, *sorted(found | {last})]
