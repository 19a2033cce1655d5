"""Figures of direct logit attribution and the logit lens: each part's push toward the answer (bars, heads grouped by
layer; a heads x layers map) and the answer's logit difference read at every layer and position (a heatmap). Signed
values on a diverging scale centred on 0, red toward the answer, blue toward the foil."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from attnviz.viz import style
from attnviz.viz.importance import importance_heatmap
from attnviz.viz.matrix import numbers_fit, plot_area

TOWARD_ANSWER = "#d6604d"  # red: the positive end of style.SIGNED_COLORSCALE
TOWARD_FOIL = "#4393c3"  # blue: its negative end
TOTAL = "#636363"
LAYER_SHADE = "rgba(0,0,0,0.045)"


def attribution_bars(values, labels: list[str], layers: list[int | None], *, title: str,
                     measure: str = "logit difference", total: float | None = None,
                     total_label: str = "sum (the model's difference)") -> go.Figure:
    """``values [parts]``: each part's share of logit(answer) - logit(foil) at one position, as bars in stream order
    (``labels``; ``layers``: each part's layer, None for the embeddings and the final biases). The parts of one layer
    stand together on a shaded band named by its layer; ``total`` (the model's own difference) is one more grey bar,
    set apart. Hover: the exact value (3 significant digits) and its share of the total."""
    values = np.asarray(values, dtype=np.float64)
    xs, x, previous = [], 0.0, object()
    for layer in layers:
        if xs and layer != previous:
            x += 0.6  # a gap between groups
        xs.append(x)
        previous, x = layer, x + 1.0
    shown = style.plotly_texts(list(labels))

    def said(label: str, value: float) -> str:
        share = f" ({100 * value / total:.3g}% of the total)" if total else ""
        return f"{label}<br>{measure}: {style.format_number(value)}{share}"

    figure = go.Figure(go.Bar(
        x=xs, y=values, marker_color=[TOWARD_ANSWER if value > 0 else TOWARD_FOIL for value in values],
        hovertext=[said(label, value) for label, value in zip(shown, values, strict=True)], hoverinfo="text",
        name="parts", showlegend=False,
    ))
    ticks, texts = list(xs), list(shown)
    if total is not None:
        total_x = x + 0.6
        figure.add_trace(go.Bar(x=[total_x], y=[total], marker_color=TOTAL, name=total_label, showlegend=False,
                                hovertext=[f"{style.plotly_text(total_label)}<br>{measure}: "
                                           f"{style.format_number(total)}"], hoverinfo="text"))
        ticks.append(total_x)
        texts.append(style.plotly_text(total_label))
    for layer in sorted({layer for layer in layers if layer is not None}):
        inside = [at for at, of in zip(xs, layers, strict=True) if of == layer]
        if layer % 2 == 0:
            figure.add_shape(type="rect", xref="x", yref="paper", x0=min(inside) - 0.5, x1=max(inside) + 0.5, y0=0,
                             y1=1, fillcolor=LAYER_SHADE, line_width=0, layer="below")
        figure.add_annotation(x=(min(inside) + max(inside)) / 2, y=1, xref="x", yref="paper", yanchor="bottom",
                              text=f"layer {layer}", showarrow=False, font=dict(size=11, color="#555"))
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"), font=dict(family=style.FONT_FAMILY),
        xaxis=dict(tickmode="array", tickvals=ticks, ticktext=texts, tickangle=-60, showgrid=False),
        yaxis=dict(title=f"{measure} (+: toward the answer)", zeroline=True, zerolinecolor="#888"),
        height=440, margin=dict(l=10, r=10, t=70, b=10), plot_bgcolor="white", bargap=0.15,
    )
    return figure


def attribution_head_map(head_map, *, title: str, measure: str = "logit difference",
                         extra_column: list[float] | None = None, extra_label: str = "all heads",
                         width: int = 1000) -> go.Figure:
    """``head_map [layers, heads]``: each head's part at one position (NaN: no such head), layers as rows and heads
    as columns, on a diverging scale centred on 0; ``extra_column``: e.g. each layer's heads together, set apart."""
    rows = np.asarray(head_map, dtype=np.float64).shape[0]
    return importance_heatmap(head_map, [f"layer {layer}" for layer in range(rows)], title=title, measure=measure,
                              signed=True, extra_column=extra_column, extra_label=extra_label, width=width)


def lens_heatmap(difference, row_labels: list[str], tokens: list[str], *, title: str,
                 probability=None, rank=None, top_tokens: list[list[str]] | None = None, answer_top=None,
                 measure: str = "logit difference", width: int = 1000) -> go.Figure:
    """The logit lens: ``difference [rows, n]`` (logit(answer) - logit(foil) read at each layer boundary, rows, and
    each position, columns labelled by position and token) on a diverging scale centred on 0. Hover adds, where
    given, the answer's ``probability`` and ``rank`` and the ``top_tokens`` (``[rows][n]`` strings);
    ``answer_top`` (bool ``[rows, n]``) marks with a dot the cells where the answer is the top token."""
    matrix = np.asarray(difference, dtype=np.float64)
    rows, n = matrix.shape
    labels = style.plotly_texts(style.token_labels(list(tokens)))
    ticks, tick_text = style.thinned_ticks(labels, 48)
    finite = matrix[np.isfinite(matrix)]
    bound = float(np.abs(finite).max()) if finite.size else 1.0
    text = [["" if not np.isfinite(v) else style.format_number(v, 2) for v in row] for row in matrix.tolist()]
    height = int(min(700, max(260, 170 + 44 * rows)))
    fits = numbers_fit(text, *plot_area(width, height, rows, n))
    probabilities = None if probability is None else np.asarray(probability, dtype=np.float64)
    ranks = None if rank is None else np.asarray(rank)

    def hover(r: int, c: int) -> str:
        said = f"{row_labels[r]}, {labels[c]}<br>{measure}: {style.format_number(matrix[r, c])}"
        if probabilities is not None:
            said += f"<br>answer's probability: {style.format_number(probabilities[r, c])}"
        if ranks is not None:
            said += f"<br>answer's rank: {int(ranks[r, c])}"
        if top_tokens is not None:
            said += f"<br>top token: {style.plotly_text(top_tokens[r][c])}"
        return said

    figure = go.Figure(go.Heatmap(
        z=matrix, x=list(range(n)), y=list(range(rows)), text=text if fits else None,
        texttemplate="%{text}" if fits else None, textfont=dict(size=11),
        hovertext=[[hover(r, c) for c in range(n)] for r in range(rows)], hoverinfo="text", xgap=1, ygap=1,
        colorscale=style.SIGNED_COLORSCALE, zmin=-(bound or 1.0), zmax=bound or 1.0, zmid=0.0,
        colorbar=dict(title=dict(text=measure, side="right"), thickness=12),
    ))
    if answer_top is not None:
        marked = np.argwhere(np.asarray(answer_top, dtype=bool))  # [cells, 2]: (row, position)
        figure.add_trace(go.Scatter(
            x=marked[:, 1].tolist(), y=marked[:, 0].tolist(), mode="markers", hoverinfo="skip",
            marker=dict(symbol="circle", size=6, color="black"), name="the answer is the top token",
            showlegend=bool(len(marked)),
        ))
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"), font=dict(family=style.FONT_FAMILY),
        xaxis=dict(title="position (token)", tickmode="array", tickvals=ticks, ticktext=tick_text, tickangle=-60,
                   showgrid=False, range=[-0.5, n - 0.5]),
        yaxis=dict(tickmode="array", tickvals=list(range(rows)), ticktext=list(row_labels), autorange="reversed",
                   showgrid=False),
        legend=dict(orientation="h", yref="container", y=0, yanchor="bottom"),
        height=height, margin=dict(l=10, r=10, t=50, b=10), plot_bgcolor="white",
    )
    return figure
