"""The figure of a series scanned over a corpus at each checkpoint: one statistic's layers x heads map at one step,
drawn as the Heads across a corpus page draws a scan's map, on a colour range that stays the same for every step so
that the map can be played over training."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from attnviz.viz.corpus import plotly_text
from attnviz.viz.heads import statistic_heatmap


def step_map(grid, *, statistic: str, title: str, value_range: tuple[float, float] | None) -> go.Figure:
    """``grid`` (``[layers, heads]``, NaN: no value) as a heatmap coloured on ``value_range`` (the same for every
    step of the statistic; None: the grid's own spread), the exact value on hover."""
    matrix = np.asarray(grid, dtype=np.float64)  # [layers, heads]
    figure = statistic_heatmap(matrix, title=plotly_text(title), statistic=statistic, value_range=value_range)
    for trace in figure.data:  # nothing opens on a click here: the hover says the head and its value only
        if trace.hovertext is not None:
            trace.hovertext = [text.replace("<br>click to open", "") for text in trace.hovertext]
    return figure
