"""Figures of the patching experiment: a map of mean shares over examples whose hover gives each cell's 95 %
bootstrap interval and spread, and the examples themselves as dots beside their mean, so that no single number
hides examples that disagree."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from attnviz.viz import style
from attnviz.viz.matrix import numbers_fit, plot_area


def spread_heatmap(mean, low, high, std, row_labels: list[str], column_labels: list[str], *, title: str,
                   measure: str, examples: int, x_title: str = "", value_range: tuple[float, float] | None = (-1, 1),
                   width: int = 1000) -> go.Figure:
    """``mean [rows, columns]`` over ``examples`` on a diverging scale centred on 0 (``value_range``: fixed, e.g. a
    share's -1 to 1; None: symmetric about 0 at the largest magnitude); hover: the cell's mean, its 95 % interval
    (``low``, ``high``) and the examples' standard deviation. Columns are positions or heads, labelled by
    ``column_labels`` (thinned to about 48 on the axis, all on hover)."""
    matrix = np.asarray(mean, dtype=np.float64)
    lows, highs, stds = (np.asarray(values, dtype=np.float64) for values in (low, high, std))
    rows, columns = matrix.shape
    labels = style.plotly_texts(list(column_labels))
    step = max(1, columns // 48)
    shown = sorted(set(range(0, columns, step)) | {i for i, label in enumerate(labels) if label.startswith("▶")}
                   | {columns - 1})
    text = [["" if not np.isfinite(v) else style.format_number(v, 2) for v in row] for row in matrix.tolist()]
    height = int(min(700, max(260, 170 + 44 * rows)))
    fits = numbers_fit(text, *plot_area(width, height, rows, columns))

    def hover(r: int, c: int) -> str:
        said = f"{row_labels[r]}, {labels[c]}<br>{measure}: {style.format_number(matrix[r, c])}"
        if examples > 1 and np.isfinite(lows[r, c]):
            said += (f" (mean of {examples})<br>95% interval: {style.format_number(lows[r, c])} to "
                     f"{style.format_number(highs[r, c])}<br>std over examples: {style.format_number(stds[r, c])}")
        return said

    if value_range is None:
        top = float(np.nanmax(np.abs(matrix))) if np.isfinite(matrix).any() else 1.0
        value_range = (-(top or 1.0), top or 1.0)
    figure = go.Figure(go.Heatmap(
        z=matrix, x=list(range(columns)), y=list(range(rows)), text=text if fits else None,
        texttemplate="%{text}" if fits else None, textfont=dict(size=11),
        hovertext=[[hover(r, c) for c in range(columns)] for r in range(rows)], hoverinfo="text", xgap=1, ygap=1,
        colorscale=style.SIGNED_COLORSCALE, zmin=value_range[0], zmax=value_range[1], zmid=0.0,
        colorbar=dict(title=dict(text=measure, side="right"), thickness=12),
    ))
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"),
        xaxis=dict(title=x_title, tickmode="array", tickvals=shown, ticktext=[labels[i] for i in shown],
                   tickangle=-60 if columns > 12 else 0, showgrid=False),
        yaxis=dict(tickmode="array", tickvals=list(range(rows)), ticktext=row_labels, autorange="reversed",
                   showgrid=False),
        height=height, margin=dict(l=10, r=10, t=50, b=10), plot_bgcolor="white",
        font=dict(family=style.FONT_FAMILY),
    )
    return figure


def example_dots(values, labels: list[str], low, high, *, title: str, measure: str) -> go.Figure:
    """``values [examples, cells]``: each example's value of each chosen cell as a dot, the mean as a bar with its
    95 % bootstrap interval (``low``, ``high`` ``[cells]``) as error bars."""
    matrix = np.asarray(values, dtype=np.float64)
    examples, cells = matrix.shape
    mean = np.nanmean(matrix, axis=0)
    lows, highs = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    has_interval = examples > 1 and bool(np.isfinite(lows).all())
    figure = go.Figure(go.Bar(
        x=list(range(cells)), y=mean, marker_color=["#d6604d" if v > 0 else "#4393c3" for v in mean], opacity=0.55,
        name=f"mean of {examples}",
        error_y=dict(type="data", symmetric=False, array=(highs - mean) if has_interval else None,
                     arrayminus=(mean - lows) if has_interval else None, visible=has_interval, color="#333"),
        hovertext=[f"{label}<br>mean {measure}: {style.format_number(m)}"
                   + (f"<br>95% interval: {style.format_number(a)} to {style.format_number(b)}" if has_interval
                      else "") for label, m, a, b in zip(labels, mean, lows, highs, strict=True)],
        hoverinfo="text",
    ))
    jitter = np.linspace(-0.25, 0.25, examples) if examples > 1 else np.zeros(1)
    figure.add_trace(go.Scatter(
        x=(np.arange(cells)[None, :] + jitter[:, None]).ravel(), y=matrix.ravel(), mode="markers",
        marker=dict(size=7, color="#222", opacity=0.7), name="one example",
        hovertext=[f"{labels[c]}, example {e + 1}: {style.format_number(matrix[e, c])}"
                   for e in range(examples) for c in range(cells)], hoverinfo="text",
    ))
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"),
        xaxis=dict(tickmode="array", tickvals=list(range(cells)), ticktext=style.plotly_texts(labels), showgrid=False,
                   tickangle=-25),
        yaxis=dict(title=measure, zeroline=True, zerolinecolor="#888"), height=420, plot_bgcolor="white",
        margin=dict(l=10, r=10, t=50, b=10), legend=dict(orientation="h", y=-0.2), font=dict(family=style.FONT_FAMILY),
    )
    return figure
