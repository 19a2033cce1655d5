"""Figures of the "Does this head matter?" page: importance maps (layers x heads), a head's effect on each token,
activation patching, and the induction circuit's ablations beside its attention scores."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from attnviz.viz import style


def importance_heatmap(values, row_labels: list[str], *, title: str, measure: str, signed: bool = True,
                       highlight: tuple[int, int] | None = None, extra_column: list[float] | None = None,
                       extra_label: str = "all heads") -> go.Figure:
    """``values [rows, heads]`` (NaN: no such head) as a heatmap, rows labelled (``layer 0``, ...). ``signed``: a
    diverging scale centred on 0 (a loss change can be negative: the head hurt); else a plain one from 0.
    ``extra_column``: one more column after the heads (e.g. every head of the row at once), set apart."""
    matrix = np.asarray(values, dtype=np.float64)
    rows, heads = matrix.shape
    columns = [f"head {head}" for head in range(heads)]
    if extra_column is not None:
        matrix = np.concatenate([matrix, np.full((rows, 1), np.nan), np.asarray(extra_column, float)[:, None]], 1)
        columns += ["", extra_label]
    finite = matrix[np.isfinite(matrix)]
    bound = float(np.abs(finite).max()) if finite.size else 1.0
    bound = bound or 1.0
    colours = dict(colorscale=style.SIGNED_COLORSCALE, zmin=-bound, zmax=bound, zmid=0.0) if signed else \
        dict(colorscale=style.PLAIN_COLORSCALE, zmin=0.0, zmax=bound)
    text = [["" if not np.isfinite(v) else style.format_number(v) for v in row] for row in matrix.tolist()]
    hover = [[f"{row_labels[r]}, {columns[c]}<br>{measure}: {text[r][c]}" if text[r][c] else ""
              for c in range(len(columns))] for r in range(rows)]
    figure = go.Figure(go.Heatmap(
        z=matrix, x=list(range(len(columns))), y=list(range(rows)), text=text,
        texttemplate="%{text}" if rows * len(columns) <= 400 else None, textfont=dict(size=12),
        hovertext=hover, hoverinfo="text", xgap=1, ygap=1,
        colorbar=dict(title=dict(text=measure, side="right")), **colours,
    ))
    if highlight is not None:
        row, head = highlight
        figure.add_shape(type="rect", x0=head - 0.5, x1=head + 0.5, y0=row - 0.5, y1=row + 0.5,
                         line=dict(color="#ff7f0e", width=3))
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"),
        xaxis=dict(tickmode="array", tickvals=list(range(len(columns))), ticktext=columns, side="top",
                   showgrid=False),
        yaxis=dict(tickmode="array", tickvals=list(range(rows)), ticktext=row_labels, autorange="reversed",
                   showgrid=False),
        height=int(min(900, max(260, 120 + 40 * rows))), margin=dict(l=10, r=10, t=90, b=10),
        plot_bgcolor="white", font=dict(family=style.FONT_FAMILY),
    )
    return figure


def token_effect_chart(tokens: list[str], changes, *, title: str, measure: str) -> go.Figure:
    """Each target token's loss change (positive: the head helped predict it; red) as bars along the text."""
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
                   tickangle=-45, title="predicted token"),
        yaxis=dict(title=measure, zeroline=True, zerolinecolor="#888"),
        height=380, margin=dict(l=10, r=10, t=50, b=10), plot_bgcolor="white",
    )
    return figure


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
    for value, colour, name in ((clean_first, "#3182bd", "first copy, no ablation"),
                                (clean_second, "#b2182b", "second copy, no ablation")):
        figure.add_hline(y=value, line=dict(color=colour, dash="dash", width=2),
                         annotation_text=f"{name}: {style.format_number(value)}", annotation_position="top left")
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"), barmode="group", font=dict(family=style.FONT_FAMILY),
        xaxis=dict(title="head ablated (zeroed)"), yaxis=dict(title="next-token loss (nats)", rangemode="tozero"),
        legend=dict(orientation="h", y=-0.25), height=440, margin=dict(l=10, r=10, t=50, b=10),
        plot_bgcolor="white",
    )
    return figure
