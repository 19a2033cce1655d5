"""The widgets of a mask pattern's parameters, drawn from the registry (:mod:`attnviz.core.mask_patterns`): the Masks
page, Explore heads' What-if tab and the Flash page all ask for a pattern's parameters through this one function."""

from __future__ import annotations

from attnviz.core import mask_patterns


def pattern_widgets(key: str, place: str, columns, n: int, prefix: str) -> dict[str, int]:
    """Draw the widgets ``place`` shows for pattern ``key`` into ``columns`` (a row of Streamlit columns; each
    widget names its column), with ranges for ``n`` tokens. Widget keys are ``{prefix}_{parameter}``, so a
    parameter two patterns share keeps its value when the pattern changes. Returns the chosen parameters."""
    defaults = mask_patterns.parameters_of(key)
    chosen: dict[str, int] = {}
    for widget in mask_patterns.widgets(key, place):
        # Later bounds may depend on earlier choices (BigBird's global blocks on its block size): pass them on.
        chosen[widget.parameter] = int(_draw(widget, columns[widget.column], n, chosen, defaults,
                                             key=f"{prefix}_{widget.parameter}"))
    return chosen


def _draw(widget: mask_patterns.Widget, column, n: int, chosen: dict, defaults: dict, *, key: str):
    initial = widget.initial(n, chosen, defaults[widget.parameter])
    if widget.choices:
        return column.select_slider(widget.label, list(widget.choices), initial, key=key, help=widget.help)
    low, high = widget.bounds(n, chosen)
    draw = column.number_input if widget.box else column.slider
    return draw(widget.label, low, high, initial, key=key, help=widget.help)
