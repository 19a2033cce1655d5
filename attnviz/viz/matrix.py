"""Heatmaps of matrices with their numbers written in: attention weights, scores, Q/K/V."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from attnviz.viz import style

KINDS = ("weights", "signed", "plain")
TEXT_LIMIT = 400  # cells: numbers are written in each cell up to 20 x 20
DETAIL_LIMIT = 4096  # cells: hover names both tokens up to 64 x 64


def matrix_heatmap(
    values,
    row_labels: list[str],
    col_labels: list[str],
    *,
    title: str,
    kind: str = "weights",
    x_title: str = "key",
    y_title: str = "query",
    show_values: bool = True,
    height: int | None = None,
    robust: bool = False,
    max_x_ticks: int = 48,
    colour: str = "fixed",
    signed_bound: float | None = None,
) -> go.Figure:
    """A heatmap of ``values [rows, cols]`` labelled by ``row_labels`` / ``col_labels``.

    ``kind``: ``"weights"`` uses the shared 0..1 scale; ``"signed"`` a diverging scale centred on 0; ``"plain"``
    a sequential scale. For weights, ``colour`` says what ``values`` are: ``"fixed"`` the weights (0..1),
    ``"row"`` each row divided by its maximum (0..1), ``"log"`` log10 of the weights (ticks read as powers of 10).
    ``robust`` (signed only): the colour scale ends at the 99th percentile of |value|; ``signed_bound`` (signed
    only): the scale runs from -bound to +bound, so that figures meant to be compared share it. -inf cells (masked) are
    drawn grey. Numbers are written in the cells of small matrices; the hover names the row's and the column's
    label and the value to 3 significant digits, at any size (labels cost one string per row and column).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    matrix = np.asarray(values, dtype=np.float64)
    if matrix.ndim != 2:
        raise ValueError(f"matrix_heatmap draws 2-D values, got shape {matrix.shape}")
    n_rows, n_cols = matrix.shape
    if len(row_labels) != n_rows or len(col_labels) != n_cols:
        raise ValueError(
            f"{len(row_labels)} row labels and {len(col_labels)} column labels for a {n_rows} x {n_cols} matrix"
        )

    finite = np.where(np.isfinite(matrix), matrix, np.nan)  # -inf cells are left blank, drawn grey below
    show_values = show_values and n_rows * n_cols <= TEXT_LIMIT
    text = [[style.format_number(v) for v in row] for row in matrix.tolist()] if show_values else None
    # Categorical axes carry the labels, so the hover can name both tokens without a string per cell; labels that
    # repeat would be merged by Plotly, so those fall back to positions.
    unique = len(set(row_labels)) == n_rows and len(set(col_labels)) == n_cols
    x_values = list(col_labels) if unique else list(range(n_cols))
    y_values = list(row_labels) if unique else list(range(n_rows))
    value_name = {"row": "weight / row max", "log": "log10 weight"}.get(colour, "value")
    value_name = value_name if kind == "weights" else "value"
    hovertemplate = f"{y_title} %{{y}}<br>{x_title} %{{x}}<br>{value_name} %{{z:.3g}}<extra></extra>"
    detailed = n_rows * n_cols <= DETAIL_LIMIT
    if not detailed:
        finite = finite.astype(np.float32)  # sent as a compact binary array

    colour_settings: dict = {}
    if kind == "weights" and colour == "log":
        low = float(np.nanmin(finite)) if np.isfinite(finite).any() else -6.0
        low = max(min(np.floor(low), -1.0), -12.0)
        ticks = list(range(int(low), 1))
        colour_settings = dict(colorscale=style.WEIGHT_COLORSCALE, zmin=low, zmax=0.0,
                               colorbar=dict(tickvals=ticks, ticktext=[f"1e{t}" if t else "1" for t in ticks]))
    elif kind == "weights":
        colour_settings = dict(colorscale=style.WEIGHT_COLORSCALE, zmin=0.0, zmax=1.0)
    elif kind == "signed":
        magnitudes = np.abs(finite[np.isfinite(finite)])
        bound = float(np.percentile(magnitudes, 99) if robust else magnitudes.max()) if magnitudes.size else 1.0
        bound = signed_bound or bound or 1.0
        colour_settings = dict(colorscale=style.SIGNED_COLORSCALE, zmin=-bound, zmax=bound, zmid=0.0)
    else:
        colour_settings = dict(colorscale=style.PLAIN_COLORSCALE)

    heatmap = go.Heatmap(
        z=finite,
        x=x_values,
        y=y_values,
        text=text,
        texttemplate="%{text}" if show_values else None,
        hovertemplate=hovertemplate,
        hoverongaps=True,
        xgap=1 if detailed else 0,  # cell borders would hide the cells of a 512 x 512 matrix
        ygap=1 if detailed else 0,
        **colour_settings,
    )
    figure = go.Figure(heatmap)
    height = height or int(min(900, max(260, 60 + 38 * n_rows)))
    x_ticks, x_text = style.thinned_ticks(col_labels, max_ticks=max_x_ticks)
    y_ticks, y_text = style.thinned_ticks(row_labels, max_ticks=max(4, (height - 120) // 14))  # ~14 px a label
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"),
        font=dict(family=style.FONT_FAMILY),
        xaxis=dict(title=x_title, tickmode="array", tickvals=[x_values[i] for i in x_ticks], ticktext=x_text,
                   tickangle=-45, side="bottom", type="category" if unique else "linear"),
        yaxis=dict(title=y_title, tickmode="array", tickvals=[y_values[i] for i in y_ticks], ticktext=y_text,
                   autorange="reversed", type="category" if unique else "linear"),
        plot_bgcolor=style.BLOCKED_COLOR,
        margin=dict(l=10, r=10, t=50, b=10),
        height=height,
    )
    return figure


MASK_COLOURS = {0: ("#ffffff", "blocked"), 1: ("#2f6db5", "may attend")}
BLOCK_COLOURS = {
    0: ("#ffffff", "blocked"), 1: ("#d62728", "global"), 2: ("#2f6db5", "window"), 3: ("#ff9f1c", "random"),
}


def mask_heatmap(
    categories, row_labels: list[str], col_labels: list[str], *, title: str,
    legend: dict[int, tuple[str, str]] | None = None, height: int | None = None, x_title: str = "key",
    y_title: str = "query",
) -> go.Figure:
    """A mask drawn with discrete colours: ``categories [n_q, n_k]`` ints (0 = blocked, 1 = may attend, or BigBird's
    kinds with ``legend=BLOCK_COLOURS``)."""
    legend = legend or MASK_COLOURS
    values = np.asarray(categories, dtype=np.int64)
    levels = sorted(legend)
    top = max(levels)
    colorscale = []
    for level in levels:  # a stepped colour scale: each integer level gets a flat band
        colour = legend[level][0]
        colorscale += [[level / (top + 1), colour], [(level + 1) / (top + 1), colour]]
    names = [[legend.get(int(v), ("", "?"))[1] for v in row] for row in values.tolist()]
    figure = go.Figure(
        go.Heatmap(
            z=values, x=list(range(values.shape[1])), y=list(range(values.shape[0])),
            zmin=-0.5, zmax=top + 0.5, colorscale=colorscale, customdata=names,
            hovertemplate=f"{y_title} %{{y}} → {x_title} %{{x}}: %{{customdata}}<extra></extra>",
            colorbar=dict(tickvals=levels, ticktext=[legend[level][1] for level in levels], thickness=14),
            xgap=1 if values.size <= DETAIL_LIMIT else 0, ygap=1 if values.size <= DETAIL_LIMIT else 0,
        )
    )
    height = height or int(min(900, max(300, 90 + 26 * values.shape[0])))
    x_ticks, x_text = style.thinned_ticks(col_labels, max_ticks=32)
    y_ticks, y_text = style.thinned_ticks(row_labels, max_ticks=max(4, (height - 120) // 14))  # ~14 px a label
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"),
        font=dict(family=style.FONT_FAMILY),
        xaxis=dict(title=x_title, tickmode="array", tickvals=x_ticks, ticktext=x_text, tickangle=-45),
        yaxis=dict(title=y_title, tickmode="array", tickvals=y_ticks, ticktext=y_text, autorange="reversed"),
        plot_bgcolor="#eeeeee",
        margin=dict(l=10, r=10, t=50, b=10),
        height=height,
    )
    return figure


def heatmap_row(
    matrices: list,
    titles: list[str],
    row_labels: list[str],
    col_labels: list[str],
    *,
    title: str,
    kind: str = "weights",
    show_values: bool = False,
    height: int | None = None,
) -> go.Figure:
    """Several same-shaped matrices side by side with one shared colour scale (weights: 0..1), one figure wide."""
    from plotly.subplots import make_subplots

    count = len(matrices)
    figure = make_subplots(rows=1, cols=count, subplot_titles=titles, shared_yaxes=True, horizontal_spacing=0.03)
    bound = None
    if kind == "signed":  # one scale for all panels, so they can be compared
        finite = [np.abs(np.asarray(m, dtype=np.float64)) for m in matrices]
        bound = max(float(np.max(f[np.isfinite(f)])) if np.isfinite(f).any() else 0.0 for f in finite) or 1.0
    for index, values in enumerate(matrices):
        single = matrix_heatmap(values, row_labels, col_labels, title="", kind=kind, show_values=show_values)
        trace = single.data[0]
        trace.showscale = index == count - 1
        if bound is not None:
            trace.zmin, trace.zmax = -bound, bound
        figure.add_trace(trace, row=1, col=index + 1)
    x_ticks, x_text = style.thinned_ticks(col_labels, max_ticks=24)
    y_ticks, y_text = style.thinned_ticks(row_labels)
    figure.update_xaxes(tickmode="array", tickvals=x_ticks, ticktext=x_text, tickangle=-45)
    figure.update_yaxes(tickmode="array", tickvals=y_ticks, ticktext=y_text, autorange="reversed")
    figure.update_yaxes(title_text="query", row=1, col=1)
    figure.update_annotations(font_size=12)  # the subplot titles
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"),
        font=dict(family=style.FONT_FAMILY),
        plot_bgcolor=style.BLOCKED_COLOR,
        margin=dict(l=10, r=10, t=80, b=10),
        height=height or int(min(800, max(320, 140 + 26 * len(row_labels)))),
    )
    return figure
