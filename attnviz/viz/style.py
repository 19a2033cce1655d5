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


def token_label(position: int, token: str, max_chars: int = 14) -> str:
    """``"3 · token"``: the position index keeps repeated tokens apart; long tokens end in an ellipsis."""
    shown = token if len(token) <= max_chars else token[: max_chars - 1] + "…"
    return f"{position} · {shown}"


def token_labels(tokens: list[str], positions: list[int] | None = None, max_chars: int = 14) -> list[str]:
    """Labels for ``tokens`` at ``positions`` (default 0, 1, 2, ...): see :func:`token_label`."""
    positions = range(len(tokens)) if positions is None else positions
    return [token_label(position, token, max_chars) for position, token in zip(positions, tokens, strict=True)]


def plotly_text(text: str) -> str:
    """``text`` as Plotly shows it literally. Plotly reads ``<b>``, ``<s>``, ``<br>``, ... in tick labels and hovers
    as markup, so Llama's first token ``<s>`` would strike through its label: angle brackets and ampersands become
    entities, which Plotly writes as the characters."""
    if "<" not in text and ">" not in text and "&" not in text:
        return text
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def plotly_texts(texts: list[str]) -> list[str]:
    return [plotly_text(text) for text in texts]


def thinned_ticks(labels: list[str], max_ticks: int = 64) -> tuple[list[int], list[str]]:
    """Integer tick positions and their labels, keeping at most ``max_ticks`` evenly spaced ones."""
    step = max(1, math.ceil(len(labels) / max_ticks))
    positions = list(range(0, len(labels), step))
    return positions, [labels[i] for i in positions]
