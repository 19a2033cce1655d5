"""What the "Attention step by step" page says beside its figures, read from the steps it shows."""

from __future__ import annotations

import math

from attnviz.core import stepwise


def scaled_scores_words(steps: stepwise.AttentionSteps) -> tuple[str, str]:
    """Step 2's title and caption: what dividing by sqrt(d_k) does to these scores, or why this score function has
    no such step."""
    d_k = steps.d_k
    if steps.score_function == "scaled_dot":
        title = f"Step 2 · Scaled scores (÷ √{d_k} = ÷ {math.sqrt(d_k):.3g})"
        caption = (f"Dividing by √d_k keeps the scores' spread near 1 whatever d_k is when Q and K have "
                   f"unit-variance entries (here the scores' standard deviation goes from "
                   f"{steps.scores.std().item():.3g} to {steps.scaled_scores.std().item():.3g}), so the softmax "
                   "does not saturate." if steps.scores.numel() > 1 else
                   "Dividing by √d_k keeps the scores' spread near 1 whatever d_k is.")
    elif steps.score_function == "additive":
        title = "Step 2 · Scaled scores (no scaling for this score function)"
        d_a, most = stepwise.additive_bound(steps)
        caption = (f"No √d_k, and none needed: tanh keeps each of the d_a = {d_a} terms of vᵀ·tanh(…) in [−1, 1], "
                   f"so every score lies within ±{most:.3g} (the sum of |v|) whatever d_k is. Its spread grows "
                   f"with the hidden size d_a (here set equal to d_k), not with d_k itself.")
    else:
        title = "Step 2 · Scaled scores (no scaling for this score function)"
        caption = "This score function has no √d_k: with large d_k its softmax saturates (see Scaling and softmax)."
    return title, caption
