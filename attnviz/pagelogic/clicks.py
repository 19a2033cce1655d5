"""What a click on a chart selected: st.plotly_chart(on_select=...) hands back each clicked point as the browser's
Plotly event saw it, through JSON.stringify. Figures send integer customdata as typed arrays, which Plotly decodes
into a typed array per point, and JSON writes a typed array as an object: [6, 2, 0] arrives as
{"0": 6, "1": 2, "2": 0}. A plain list stays a list, one-dimensional customdata arrives as a scalar, a trace without
it sends none. Checked in Chromium with Streamlit 1.67 and Plotly 7. In 3D, Plotly fires only click events, which
Streamlit ignores: a 3D chart selects nothing."""

from __future__ import annotations

import math
from collections.abc import Mapping


def _whole_number(value) -> int | None:
    """``value`` as an int if it is a whole number (an int, an integral float, or their text), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    return None


def customdata_numbers(customdata) -> tuple[int, ...] | None:
    """A clicked point's customdata, in any shape the browser sends it, as its whole numbers in order: a list or
    tuple ``[6, 2, 0]``, a typed array's object ``{"0": 6, "1": 2, "2": 0}`` (its keys in numeric order), or one
    number ``6`` (one-dimensional customdata) give ``(6, 2, 0)`` / ``(6,)``; None when there is none or it is not
    whole numbers (a trace without customdata, text, a gap in the object's keys)."""
    if customdata is None:
        return None
    if isinstance(customdata, Mapping):
        places = {_whole_number(key): value for key, value in customdata.items()}
        if None in places or sorted(places) != list(range(len(places))):
            return None
        customdata = [places[place] for place in range(len(places))]
    elif not isinstance(customdata, list | tuple):
        customdata = [customdata]
    numbers = tuple(_whole_number(value) for value in customdata)
    return numbers if numbers and None not in numbers else None


def selected_points(selection) -> list:
    """The points of a chart's selection state (``st.session_state[key]``: Streamlit's PlotlyState, a plain dict
    as a test sets it, or None before any click); [] when it holds none."""
    if not isinstance(selection, Mapping):
        return []
    inner = selection.get("selection")
    points = inner.get("points") if isinstance(inner, Mapping) else None
    return [point for point in points if isinstance(point, Mapping)] if isinstance(points, list) else []


def clicked_layer_head(selection, n_layers: int, n_heads: int) -> tuple[int, int] | None:
    """The (layer, head) of a cell clicked in a layers x heads map (customdata ``(layer, head)``:
    :func:`attnviz.viz.heads.statistic_heatmap`, the grid of thumbnails); None when none is selected or it names no
    head of the model."""
    for point in selected_points(selection):
        numbers = customdata_numbers(point.get("customdata"))
        if numbers is not None and len(numbers) == 2 and 0 <= numbers[0] < n_layers and 0 <= numbers[1] < n_heads:
            return numbers
    return None
