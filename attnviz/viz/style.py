"""One visual language for every figure: the same colour scale for attention weights everywhere (0 to 1), a
diverging scale centred on 0 for signed quantities, readable numbers (3 significant digits) and token labels."""

from __future__ import annotations

import math

WEIGHT_COLORSCALE = "Blues"  # attention weights, always on [0, 1] so heads are comparable
SIGNED_COLORSCALE = "RdBu_r"  # scores and differences, centred on 0 (red positive, blue negative)
PLAIN_COLORSCALE = "Viridis"  # unsigned quantities that are not weights
BLOCKED_COLOR = "#d9d9d9"  # cells a mask removed (-inf)
FONT_FAMILY = "Inter, 'Source Sans Pro', Arial, sans-serif"


def format_number(value: float, digits: int = 3) -> str:
    """Round for reading: 3 significant digits, -inf as '−∞', NaN as ''."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if math.isinf(value):
        return "−∞" if value < 0 else "∞"
    if value == 0:
        return "0"
    return f"{value:.{digits}g}"


def token_labels(tokens: list[str], max_chars: int = 14) -> list[str]:
    """``"3 · token"`` labels: the position index keeps repeated tokens apart and readable."""
    labels = []
    for i, token in enumerate(tokens):
        shown = token if len(token) <= max_chars else token[: max_chars - 1] + "…"
        labels.append(f"{i} · {shown}")
    return labels


def thinned_ticks(labels: list[str], max_ticks: int = 64) -> tuple[list[int], list[str]]:
    """Integer tick positions and their labels, keeping at most ``max_ticks`` evenly spaced ones."""
    step = max(1, math.ceil(len(labels) / max_ticks))
    positions = list(range(0, len(labels), step))
    return positions, [labels[i] for i in positions]
