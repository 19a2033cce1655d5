"""The learning-rate schedule attnviz trains with: the bundled tiny GPT's recipe and the pre-norm against post-norm
runs of the Over training page share it (one formula, so that the runs there are the recipe's).

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
