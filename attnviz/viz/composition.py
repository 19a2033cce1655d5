"""Figures of composition between heads (Elhage et al. 2021), read from the weights: every sender x receiver pair's
score coloured by its distance from the random baseline, and the scores' spread against that baseline.

Pure: arrays and numbers in (the ``scores``, ``labels`` and baseline of
``attnviz.interventions.composition.CompositionScores``), a ``go.Figure`` out."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from attnviz.viz import style
from attnviz.viz.matrix import numbers_fit, plot_area

_KIND_WORDS = {"Q": "queries", "K": "keys", "V": "values"}


def _as_array(values) -> np.ndarray:
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=np.float64)


def _pooled(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """``scores [layers, heads, layers, heads]`` as ``[layers, layers]``: each layer pair's strongest pair, with the
    sender and receiver heads that reach it (``[layers, layers]`` each, -1 where there is none) and layer labels."""
    layers, heads = scores.shape[:2]
    per_pair = scores.transpose(0, 2, 1, 3).reshape(layers, layers, heads * heads)  # [layers, layers, heads^2]
    finite = np.isfinite(per_pair).any(axis=2)
    best = np.where(finite, np.argmax(np.where(np.isfinite(per_pair), per_pair, -np.inf), axis=2), -1)
    pooled = np.where(finite, np.take_along_axis(per_pair, np.maximum(best, 0)[..., None], 2)[..., 0], np.nan)
    sender, receiver = np.where(finite, best // heads, -1), np.where(finite, best % heads, -1)
    return pooled, sender, receiver, [f"L{layer}" for layer in range(layers)]


def composition_heatmap(scores, labels: list[str], *, kind: str, baseline_mean: float, baseline_spread: float,
                        measure: str = "score", title: str | None = None, width: int = 1000,
                        max_heads: int = 192) -> go.Figure:
    """``scores [layers, heads, layers, heads]`` (sender layer, head, receiver layer, head; NaN: no pair) as a
    heatmap, senders down, receivers across, on a diverging scale centred on the random baseline: red pairs score
    above what Gaussian matrices of the same shapes do, blue below. ``measure``: "score" (the scores, the colour bar
    centred on ``baseline_mean``) or "spreads" (baseline spreads above the baseline's mean, centred on 0). The hover
    gives both. With more than ``max_heads`` heads each layer pair is one cell, its strongest pair (named on
    hover), so the browser never gets a huge grid; the title says so. Thin lines part the layers."""
    if measure not in ("score", "spreads"):
        raise ValueError(f"measure is 'score' or 'spreads', not {measure!r}")
    values = _as_array(scores)
    layers, heads = values.shape[:2]
    count = layers * heads
    pooled = count > max_heads
    if pooled:
        matrix, senders, receivers, axis_labels = _pooled(values)
        names = [[f"L{r} H{senders[r, c]} → L{c} H{receivers[r, c]}" if senders[r, c] >= 0 else ""
                  for c in range(layers)] for r in range(layers)]
    else:
        matrix = values.reshape(count, count)  # [senders, receivers], layer by layer
        axis_labels = list(labels)
        names = [[f"{axis_labels[r]} → {axis_labels[c]}" for c in range(count)] for r in range(count)]
    spreads = (matrix - baseline_mean) / baseline_spread
    shown = matrix if measure == "score" else spreads
    middle = baseline_mean if measure == "score" else 0.0
    finite = shown[np.isfinite(shown)]
    bound = float(np.abs(finite - middle).max()) if finite.size else 1.0
    bound = bound or 1.0
    rows = matrix.shape[0]
    text = [["" if not np.isfinite(v) else style.format_number(v, 2) for v in row] for row in shown.tolist()]
    height = int(min(900, max(300, 130 + 22 * rows)))
    fits = numbers_fit(text, *plot_area(width, height, rows, rows))
    hover = [[f"{names[r][c]}<br>{kind}-composition score: {style.format_number(matrix[r, c])}<br>"
              f"{style.format_number(spreads[r, c])} baseline spreads above the baseline"
              if np.isfinite(matrix[r, c]) else "" for c in range(rows)] for r in range(rows)]
    bar = f"{kind}-score" if measure == "score" else "spreads above baseline"
    figure = go.Figure(go.Heatmap(
        z=shown, x=list(range(rows)), y=list(range(rows)), text=text if fits else None,
        texttemplate="%{text}" if fits else None, textfont=dict(size=11), hovertext=hover, hoverinfo="text",
        xgap=1 if rows <= 64 else 0, ygap=1 if rows <= 64 else 0, colorscale=style.SIGNED_COLORSCALE,
        zmin=middle - bound, zmax=middle + bound, zmid=middle,
        colorbar=dict(title=dict(text=bar, side="right"), thickness=12),
    ))
    if not pooled:
        for layer in range(1, layers):
            edge = layer * heads - 0.5
            figure.add_shape(type="line", x0=edge, x1=edge, y0=-0.5, y1=rows - 0.5, line=dict(color="#888", width=1))
            figure.add_shape(type="line", x0=-0.5, x1=rows - 0.5, y0=edge, y1=edge, line=dict(color="#888", width=1))
    if title is None:
        title = (f"{kind}-composition: how much each later head reads an earlier head's output into its "
                 f"{_KIND_WORDS.get(kind, kind)} (baseline {style.format_number(baseline_mean)} ± "
                 f"{style.format_number(baseline_spread)})")
        if pooled:
            title += f"<br><sup>{count} heads: each cell is the strongest pair of a sender layer and a receiver layer"
            title += "</sup>"
    ticks, tick_text = style.thinned_ticks(style.plotly_texts(axis_labels))
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"),
        xaxis=dict(title="receiver (later layer)", tickmode="array", tickvals=ticks, ticktext=tick_text,
                   tickangle=-60 if rows > 12 else 0, showgrid=False, side="bottom"),
        yaxis=dict(title="sender (writes into the residual stream)", tickmode="array", tickvals=ticks,
                   ticktext=tick_text, autorange="reversed", showgrid=False),
        height=height, margin=dict(l=10, r=10, t=70, b=10), plot_bgcolor="white",
        font=dict(family=style.FONT_FAMILY),
    )
    return figure


def composition_distribution(scores, *, kind: str, baseline_mean: float, baseline_spread: float,
                             threshold: float = 2.0, title: str | None = None) -> go.Figure:
    """Every scored pair's score as a histogram against the random baseline: a dashed line at its mean and a band
    ``threshold`` spreads either side. Pairs that stand out lie right of the band; a map that is flat sits in it."""
    values = _as_array(scores).ravel()
    values = values[np.isfinite(values)]
    figure = go.Figure(go.Histogram(
        x=values, nbinsx=int(min(80, max(10, np.sqrt(values.size) * 2))), marker_color="#4393c3",
        name="head pairs", hovertemplate="score %{x}<br>%{y} pairs<extra></extra>",
    ))
    low, high = baseline_mean - threshold * baseline_spread, baseline_mean + threshold * baseline_spread
    figure.add_vrect(x0=low, x1=high, fillcolor="#bbbbbb", opacity=0.35, line_width=0,
                     annotation_text=f"random ± {threshold:.1f} spreads", annotation_position="top left")
    figure.add_vline(x=baseline_mean, line=dict(color="#444", dash="dash", width=2))
    if title is None:
        title = (f"{kind}-composition of {values.size} head pairs against random matrices of the same shapes "
                 f"({style.format_number(baseline_mean)} ± {style.format_number(baseline_spread)})")
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"), font=dict(family=style.FONT_FAMILY),
        xaxis=dict(title=f"{kind}-composition score", rangemode="tozero"), yaxis=dict(title="head pairs"),
        bargap=0.05, height=360, margin=dict(l=10, r=10, t=50, b=10), plot_bgcolor="white", showlegend=False,
    )
    return figure
