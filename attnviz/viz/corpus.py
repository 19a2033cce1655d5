"""Figures of a scan (Heads across a corpus): the layers x heads map of a statistic with its spread, a head's offset
profile and largest-weight histogram, the difference of two scans, and an example drawn on its text."""

from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go

from attnviz.viz import style
from attnviz.viz.charts import bar_chart
from attnviz.viz.heads import statistic_heatmap

RANGES = {"entropy": None, "mean_distance": None}  # statistics on their own spread; every share on 0..1


def statistic_range(statistic: str, values: np.ndarray) -> tuple[float, float] | None:
    """Shares and label frequencies are coloured on 0..1 (comparable between heads and scans); entropy and
    distance on their own spread."""
    if statistic in RANGES or not np.isfinite(values).any():
        return None
    return (0.0, 1.0)


def plotly_text(text: str) -> str:
    """``text`` as Plotly shows it literally (its titles read a few HTML tags, so "</s>" would vanish), with a
    line break for each newline."""
    return html.escape(text, quote=False).replace("\n", "<br>")


def statistic_map(mean: np.ndarray, spread: np.ndarray, *, statistic: str, title: str,
                  highlight: tuple[int, int] | None = None) -> go.Figure:
    """Every head's mean of ``statistic`` over the scan, its spread in the hover (and the cell when it fits)."""
    notes = (None if spread is None else
             [[f"spread ± {style.format_number(s)}" if np.isfinite(s) else "" for s in row] for row in spread])
    return statistic_heatmap(mean, title=plotly_text(title), statistic=statistic, labels=notes, highlight=highlight,
                             value_range=statistic_range(statistic, mean))


def difference_map(difference: np.ndarray, *, statistic: str, title: str) -> go.Figure:
    """This scan minus another, head by head, on a scale centred on 0."""
    figure = statistic_heatmap(difference, title=plotly_text(title), statistic=f"Δ {statistic}")
    bound = float(np.nanmax(np.abs(difference))) if np.isfinite(difference).any() else 1.0
    figure.update_traces(selector=dict(type="heatmap"), colorscale=style.SIGNED_COLORSCALE,
                         zmin=-max(bound, 1e-9), zmax=max(bound, 1e-9))
    return figure


def offset_profile(offsets: list[int], weights: list[float], *, title: str) -> go.Figure:
    """Mean weight at each offset (key position - query position; 0 is the query itself): a previous-token head is
    one bar at -1."""
    labels = [f"{o:+d}" if o else "0" for o in offsets]
    figure = bar_chart(labels, [0.0 if w is None or not np.isfinite(w) else w for w in weights], title=title,
                       y_title="mean weight", height=320)
    figure.update_xaxes(type="category", title="key position − query position", tickangle=0,  # "+1" is no number
                        tickvals=[labels[i] for i in range(0, len(labels), 4)])
    return figure


def largest_weight_histogram(bins: int, queries: list[int], *, title: str) -> go.Figure:
    """How many queries put at most each share on their strongest key: a sharp head piles up at the right."""
    labels = [f"{b / bins:.2f}–{(b + 1) / bins:.2f}" for b in range(bins)]
    total = max(sum(queries), 1)
    figure = bar_chart(labels, [q / total for q in queries], title=title, y_title="share of queries", height=300)
    figure.update_xaxes(title="a query's largest weight", tickvals=[labels[i] for i in range(0, bins, 4)],
                        tickangle=0)
    return figure


def example_html(tokens: list[str], weights: list[float], positions: list[int], query: int, key: int | None) -> str:
    """An example's context as HTML: each token (at ``positions`` of its document) shaded by the weight the query
    gives it (the same blue as every weight in attnviz), the query boxed in orange, the criterion's key underlined;
    where the positions jump (a far key shown apart from the query's context), a gap saying how many tokens are left
    out. Tokens are escaped."""
    spans = []
    previous = None
    for position, token, weight in zip(positions, tokens, weights, strict=True):
        if previous is not None and position > previous + 1:
            skipped = position - previous - 1
            spans.append(f'<span style="color: #6b7785; padding: 1px 6px; font-style: italic">… {skipped:,} '
                         f'token{"s" if skipped != 1 else ""} …</span>')
        previous = position
        alpha = max(0.0, min(1.0, float(weight)))
        colour = "#ffffff" if alpha > 0.55 else "#1f2d3d"
        border = "2px solid #ff7f0e" if position == query else "1px solid transparent"
        underline = "text-decoration: underline 2px;" if position == key and position != query else ""
        spans.append(
            f'<span title="position {position}, weight {weight:.3f}" style="background: rgba(33, 102, 172, '
            f'{alpha:.3f}); color: {colour}; border: {border}; border-radius: 3px; padding: 1px 3px; margin: 1px; '
            f'{underline} white-space: pre; display: inline-block; font-family: monospace">{html.escape(token)}</span>')
    return '<div style="line-height: 2.1; font-size: 0.95rem">' + "".join(spans) + "</div>"
