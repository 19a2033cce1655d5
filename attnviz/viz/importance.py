"""Figures of the "Does this head matter?" page: importance maps (layers x heads), a head's effect on each token,
and the induction circuit's ablations beside its attention scores (its patching experiment's figures are
:mod:`attnviz.viz.patching`)."""

from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go

from attnviz.viz import style
from attnviz.viz.matrix import numbers_fit, plot_area


def importance_heatmap(values, row_labels: list[str], *, title: str, measure: str, signed: bool = True,
                       highlight: tuple[int, int] | None = None, extra_column: list[float] | None = None,
                       extra_label: str = "all", value_range: tuple[float, float] | None = None,
                       width: int = 1000) -> go.Figure:
    """``values [rows, heads]`` (NaN: no such head) as a heatmap, rows labelled (``layer 0``, ...), columns by head
    number. ``signed``: a diverging scale centred on 0 (a loss change can be negative: the head hurt); else a
    plain one from 0; ``value_range`` fixes the scale (else the values' own spread). ``extra_column``: one more
    column after the heads (e.g. every head of the row at once), set apart. ``width``: the px it is drawn at
    (numbers are written in the cells only where they fit)."""
    matrix = np.asarray(values, dtype=np.float64)
    rows, heads = matrix.shape
    columns = [str(head) for head in range(heads)]
    if extra_column is not None:
        matrix = np.concatenate([matrix, np.full((rows, 1), np.nan), np.asarray(extra_column, float)[:, None]], 1)
        columns += ["", extra_label]
    finite = matrix[np.isfinite(matrix)]
    bound = float(np.abs(finite).max()) if finite.size else 1.0
    low, high = value_range or ((-(bound or 1.0), bound or 1.0) if signed else (0.0, bound or 1.0))
    colours = dict(colorscale=style.SIGNED_COLORSCALE if signed else style.PLAIN_COLORSCALE, zmin=low, zmax=high)
    if signed:
        colours["zmid"] = 0.0
    text = [["" if not np.isfinite(v) else style.format_number(v, 2) for v in row] for row in matrix.tolist()]
    height = int(min(900, max(240, 110 + 40 * rows)))
    shown = numbers_fit(text, *plot_area(width, height, rows, len(columns)))
    hover = [[f"{row_labels[r]}, {'head ' + columns[c] if c < heads else columns[c]}<br>{measure}: "
              f"{style.format_number(matrix[r, c])}" if text[r][c] else "" for c in range(len(columns))]
             for r in range(rows)]
    figure = go.Figure(go.Heatmap(
        z=matrix, x=list(range(len(columns))), y=list(range(rows)), text=text if shown else None,
        texttemplate="%{text}" if shown else None, textfont=dict(size=12),
        hovertext=hover, hoverinfo="text", xgap=1, ygap=1,
        colorbar=dict(title=dict(text=measure, side="right"), thickness=12), **colours,
    ))
    if highlight is not None:
        row, head = highlight
        figure.add_shape(type="rect", x0=head - 0.5, x1=head + 0.5, y0=row - 0.5, y1=row + 0.5,
                         line=dict(color="#ff7f0e", width=3))
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"),
        xaxis=dict(title="head", tickmode="array", tickvals=list(range(len(columns))), ticktext=columns,
                   showgrid=False, tickangle=0),
        yaxis=dict(tickmode="array", tickvals=list(range(rows)), ticktext=row_labels, autorange="reversed",
                   showgrid=False),
        height=height, margin=dict(l=10, r=10, t=50, b=10), plot_bgcolor="white",
        font=dict(family=style.FONT_FAMILY),
    )
    return figure


def token_effect_chart(tokens: list[str], changes, *, title: str, measure: str,
                       axis: str = "predicted token") -> go.Figure:
    """Each target token's loss change (positive: the head helped predict it; red) as bars along the text (or, for
    an encoder without a loss, each token's hidden-state change; ``axis`` names the tokens)."""
    values = np.asarray(changes, dtype=np.float64)
    labels = style.token_labels(tokens)
    colours = ["#d6604d" if value > 0 else "#4393c3" for value in values]
    figure = go.Figure(go.Bar(
        x=list(range(len(values))), y=values, marker_color=colours,
        hovertext=[f"{label}<br>{measure}: {style.format_number(value)}" for label, value in zip(labels, values,
                                                                                             strict=True)],
        hoverinfo="text",
    ))
    step = max(1, len(labels) // 60)
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"), font=dict(family=style.FONT_FAMILY),
        xaxis=dict(tickmode="array", tickvals=list(range(0, len(labels), step)), ticktext=labels[::step],
                   tickangle=-45, title=axis),
        yaxis=dict(title=measure, zeroline=True, zerolinecolor="#888"),
        height=380, margin=dict(l=10, r=10, t=50, b=10), plot_bgcolor="white",
    )
    return figure


def token_effect_html(tokens: list[str], changes, *, first: str | None = None) -> str:
    """The text as token chips coloured by each token's loss change (red: the head helped predict it; blue: it
    hurt; the strongest change fully coloured), the exact value on hover. ``first``: a token shown before the
    coloured ones, uncoloured (a decoder's first token, which nothing predicts)."""
    values = np.asarray(changes, dtype=np.float64)
    bound = float(np.abs(values).max()) if values.size else 0.0
    parts = [] if first is None else [f'<span style="color:#777" title="nothing predicts the first token">'
                                      f"{html.escape(first)}</span>"]
    for token, value in zip(tokens, values, strict=True):
        strength = abs(value) / bound if bound else 0.0
        colour = "214,96,77" if value > 0 else "67,147,195"
        parts.append(f'<span title="{html.escape(token)}: {style.format_number(value)}" style="background:'
                     f"rgba({colour},{0.08 + 0.8 * strength:.2f}); border-radius:3px; padding:0 2px; margin:0 1px; "
                     f'white-space:pre">{html.escape(token)}</span>')
    return ('<div style="font-size:1.05rem; line-height:2; max-height:12rem; overflow-y:auto">'
            + "".join(parts) + "</div>")


def circuit_chart(head_labels: list[str], first, second, clean_first: float, clean_second: float, *,
                  title: str) -> go.Figure:
    """For each head ablated: the loss on a repeated sequence's first copy and second copy, against the clean
    run's (dashed). An induction head's ablation lifts the second copy only."""
    figure = go.Figure([
        go.Bar(name="first copy (nothing to copy from)", x=head_labels, y=list(first), marker_color="#9ecae1",
               hovertemplate="%{x}<br>first copy: %{y:.3g} nats<extra></extra>"),
        go.Bar(name="second copy (copying possible)", x=head_labels, y=list(second), marker_color="#d6604d",
               hovertemplate="%{x}<br>second copy: %{y:.3g} nats<extra></extra>"),
    ])
    ends = [-0.5, len(head_labels) - 0.5]
    for value, colour, name in ((clean_first, "#3182bd", "first copy, no head removed"),
                                (clean_second, "#b2182b", "second copy, no head removed")):
        figure.add_trace(go.Scatter(x=ends, y=[value, value], mode="lines", line=dict(color=colour, dash="dash",
                                                                                      width=2),
                                    name=f"{name}: {style.format_number(value)}", hoverinfo="skip",
                                    xaxis="x2"))
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"), barmode="group", font=dict(family=style.FONT_FAMILY),
        xaxis=dict(title="head ablated (zeroed)"),
        yaxis=dict(title="next-token loss (nats per token)", rangemode="tozero"),
        # the dashed lines span the bars on a numeric axis laid over the category one
        xaxis2=dict(overlaying="x", range=ends, visible=False),
        legend=dict(orientation="h", yref="container", y=0, yanchor="bottom"), height=440,
        margin=dict(l=10, r=10, t=50, b=10),
        plot_bgcolor="white",
    )
    return figure
