"""Figures of a model's heads: the layers x heads grid, the lines view, head sharing for GQA/MQA."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import torch
import torch.nn.functional as F

from attnviz.viz import style
from attnviz.viz.matrix import numbers_fit, plot_area

HEAD_COLOURS = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
    "#393b79", "#637939",
]


@dataclass(frozen=True)
class _GridPlacement:
    """Where each head's thumbnail sits on the grid's canvas: a row per layer, a column per head, ``gap`` blank
    cells apart."""

    layers: int
    heads: int
    size_q: int  # thumbnail rows
    size_k: int  # thumbnail columns
    gap: int = 1

    def top(self, layer: int) -> int:
        return layer * (self.size_q + self.gap)

    def left(self, head: int) -> int:
        return head * (self.size_k + self.gap)

    @property
    def every_head(self) -> list[tuple[int, int]]:
        return [(layer, head) for layer in range(self.layers) for head in range(self.heads)]


def _thumbnails(weights: torch.Tensor, thumbnail: int, per_head_max: bool) -> np.ndarray:
    """``weights [layers, heads, n_q, n_k]`` average-pooled to at most ``thumbnail`` cells a side, ``[layers,
    heads, size_q, size_k]``; ``per_head_max``: each divided by its own maximum."""
    layers, heads, n_q, n_k = weights.shape
    size_q, size_k = min(n_q, thumbnail), min(n_k, thumbnail)
    pooled = F.adaptive_avg_pool2d(weights.float().reshape(layers * heads, 1, n_q, n_k), (size_q, size_k))
    pooled = pooled.reshape(layers, heads, size_q, size_k)
    if per_head_max:  # each thumbnail by its own maximum, so sparse heads stay visible; the title says so
        pooled = pooled / pooled.amax(dim=(-2, -1), keepdim=True).clamp_min(1e-12)
    return pooled.numpy()


def _grid_canvas(thumbnails: np.ndarray, place: _GridPlacement) -> np.ndarray:
    """Every thumbnail on one canvas, NaN (blank) in the gaps between them."""
    canvas = np.full((place.top(place.layers) - place.gap, place.left(place.heads) - place.gap), np.nan,
                     dtype=np.float32)
    for layer, head in place.every_head:
        top, left = place.top(layer), place.left(head)
        canvas[top : top + place.size_q, left : left + place.size_k] = thumbnails[layer, head]
    return canvas


def _grid_layout(figure: go.Figure, place: _GridPlacement, title: str, row_names: list[str] | None) -> None:
    """Head names along the top, layer (or ``row_names``) names down the side, about square thumbnails."""
    layers, heads, size_q, size_k = place.layers, place.heads, place.size_q, place.size_k
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"),
        xaxis=dict(
            tickmode="array", tickvals=[place.left(h) + size_k / 2 - 0.5 for h in range(heads)],
            ticktext=[f"H{h}" for h in range(heads)], side="top", showgrid=False, zeroline=False,
        ),
        yaxis=dict(
            tickmode="array", tickvals=[place.top(layer) + size_q / 2 - 0.5 for layer in range(layers)],
            ticktext=row_names or [f"L{layer}" for layer in range(layers)], autorange="reversed", showgrid=False,
            zeroline=False,
        ),
        plot_bgcolor="white",
        margin=dict(l=10, r=10, t=100 if "<br>" in title else 70, b=10),
        # About square thumbnails in a ~1000 px wide page (a fixed aspect ratio would leave blank bands instead).
        height=int(min(1400, 90 + 1000 * layers * (size_q + place.gap) / (heads * (size_k + place.gap)))),
        font=dict(family=style.FONT_FAMILY),
    )


def _add_head_pickers(figure: go.Figure, place: _GridPlacement, row_names: list[str] | None,
                      notes: list[list[str]] | None, clickable: bool) -> None:
    """Invisible points at the thumbnails' centres: hovering names the head, and clicking one selects it
    (Streamlit reports point selections, not heatmap cells)."""
    centres = place.every_head
    figure.add_trace(
        go.Scatter(
            x=[place.left(h) + (place.size_k - 1) / 2 for _, h in centres],
            y=[place.top(layer) + (place.size_q - 1) / 2 for layer, _ in centres],
            mode="markers",
            marker=dict(size=max(8, 220 // max(place.heads, place.layers)), color="rgba(0,0,0,0)", symbol="square"),
            customdata=[[layer, head] for layer, head in centres],
            hovertext=[f"{row_names[layer] if row_names else f'layer {layer}'}, head {head}"
                       + (f"<br>{notes[layer][head]}" if notes else "")
                       + ("<br>click to open" if clickable else "") for layer, head in centres],
            hoverinfo="text",
            showlegend=False,
        )
    )


def _add_badges(figure: go.Figure, place: _GridPlacement, badges: list[list[str]]) -> None:
    """Each head's short label, printed at the bottom of its thumbnail."""
    centres = place.every_head
    figure.add_trace(go.Scatter(
        x=[place.left(h) + (place.size_k - 1) / 2 for _, h in centres],
        y=[place.top(layer) + place.size_q - 1 for layer, _ in centres],
        mode="text", text=[badges[layer][head] for layer, head in centres], textposition="top center",
        textfont=dict(size=10, color="#c2410c"), hoverinfo="skip", showlegend=False,
    ))


def _add_highlight(figure: go.Figure, place: _GridPlacement, layer: int, head: int) -> None:
    """An orange box around the selected head's thumbnail."""
    figure.add_shape(
        type="rect", x0=place.left(head) - 0.8, x1=place.left(head) + place.size_k - 0.2,
        y0=place.top(layer) - 0.8, y1=place.top(layer) + place.size_q - 0.2,
        line=dict(color="#ff7f0e", width=3),
    )


def head_grid(weights: torch.Tensor, *, title: str, thumbnail: int = 24, highlight: tuple[int, int] | None = None,
              row_names: list[str] | None = None, clickable: bool = True, per_head_max: bool = True,
              notes: list[list[str]] | None = None, badges: list[list[str]] | None = None) -> go.Figure:
    """Every head of every layer as a thumbnail in one heatmap, ``weights [layers, heads, n_q, n_k]``.

    Long inputs are average-pooled to ``thumbnail`` cells a side, so 512 tokens cost the same as 24.
    ``per_head_max``: each thumbnail scaled to its own maximum (faint heads show), else the weights on 0–1 as in
    the head view. ``notes[layer][head]`` is added to a thumbnail's hover (its label, entropy, top key);
    ``badges[layer][head]`` is a short label printed on the thumbnail.
    """
    if isinstance(weights, (list, tuple)):
        weights = torch.stack(list(weights))  # rows given one by one, e.g. [before, after]
    thumbnails = _thumbnails(weights, thumbnail, per_head_max)  # [layers, heads, size_q, size_k]
    place = _GridPlacement(*thumbnails.shape)
    figure = go.Figure(
        go.Heatmap(
            z=_grid_canvas(thumbnails, place), colorscale=style.WEIGHT_COLORSCALE, zmin=0, zmax=1, showscale=False,
            hoverinfo="skip", xgap=0, ygap=0,
        )
    )
    _grid_layout(figure, place, title, row_names)
    _add_head_pickers(figure, place, row_names, notes, clickable)
    if badges:
        _add_badges(figure, place, badges)
    if highlight is not None:
        _add_highlight(figure, place, *highlight)
    return figure


# Line width and opacity by weight: (from, below, width, opacity)
LINE_BUCKETS = [(0.0, 0.1, 1.0, 0.25), (0.1, 0.3, 2.5, 0.45), (0.3, 0.6, 4.5, 0.65), (0.6, 1.01, 7.0, 0.85)]


def _strongest_lines(head_weights: torch.Tensor, top_k: int | None, min_weight: float,
                     max_lines: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The lines to draw of one head's ``[queries, n_k]`` weights: ``(weights, flat indices)``, strongest first,
    at least ``min_weight``, at most ``max_lines``; with ``top_k``, only each query's ``top_k`` strongest keys."""
    n_k = head_weights.shape[-1]
    if top_k is not None and top_k < n_k:  # only each query's strongest keys
        threshold = head_weights.topk(top_k, dim=-1).values[:, -1:]  # [queries, 1]
        head_weights = torch.where(head_weights >= threshold, head_weights, torch.full_like(head_weights, -1.0))
    values, flat = head_weights.flatten().sort(descending=True)
    keep = values >= min_weight
    return values[keep][:max_lines], flat[keep][:max_lines]


def _add_head_lines(figure: go.Figure, values: torch.Tensor, flat: torch.Tensor, queries: list[int], n_k: int,
                    name: int) -> tuple[list[list[float]], list[int]]:
    """One head's lines (``values`` at ``flat`` indices of its ``[queries, n_k]`` weights), one trace per weight
    bucket, and its legend entry. Returns the lines drawn (query row, key row, weight) and their traces' indices."""
    colour = HEAD_COLOURS[name % len(HEAD_COLOURS)]
    drawn_lines, line_traces = [], []
    for low, high, width, opacity in LINE_BUCKETS:
        in_bucket = (values >= low) & (values < high)
        if not in_bucket.any():
            continue
        xs, ys = [], []
        for index, value in zip(flat[in_bucket].tolist(), values[in_bucket].tolist(), strict=True):
            query, key = queries[index // n_k], index % n_k
            xs += [0, 1, None]
            ys += [query, key, None]
            drawn_lines.append([query, key, round(value, 3)])
        line_traces.append(len(figure.data))
        figure.add_trace(
            go.Scatter(
                x=xs, y=ys, mode="lines", line=dict(color=colour, width=width), opacity=opacity,
                hoverinfo="skip", showlegend=False, legendgroup=f"h{name}",
            )
        )
    figure.add_trace(  # legend entry per head
        go.Scatter(x=[None], y=[None], mode="lines", line=dict(color=colour, width=4), name=f"head {name}",
                   legendgroup=f"h{name}")
    )
    return drawn_lines, line_traces


def _add_token_columns(figure: go.Figure, query_tokens: list[str], key_tokens: list[str], n_q: int, n_k: int,
                       followed: set[int], query_ids: list[int] | None, key_ids: list[int] | None = None,
                       query_notes: list[str] | None = None, key_notes: list[str] | None = None) -> None:
    """The ``n_q`` queries' labels on the left (``followed`` rows in red; a click names the ``query_ids``
    position), the ``n_k`` keys' on the right; labelled by their positions in the text (``query_ids``,
    ``key_ids``) when given. ``query_notes`` / ``key_notes`` add a line to each token's hover (its raw piece)."""
    labels_q = style.plotly_texts(style.token_labels(query_tokens, query_ids))  # "<s>" as text, not markup
    labels_k = style.plotly_texts(style.token_labels(key_tokens, key_ids))
    figure.add_trace(
        go.Scatter(
            x=[-0.02] * n_q, y=list(range(n_q)), mode="text+markers", text=labels_q, textposition="middle left",
            marker=dict(size=12, color="rgba(0,0,0,0)"),
            customdata=[[position] for position in (query_ids or list(range(n_q)))],
            hovertext=[f"query {label}: click to follow" + _note(query_notes, i) for i, label in enumerate(labels_q)],
            hoverinfo="text", showlegend=False,
            textfont=dict(color=["#d62728" if i in followed else "#1b1f24" for i in range(n_q)]),
            name="queries",
        )
    )
    figure.add_trace(
        go.Scatter(
            x=[1.02] * n_k, y=list(range(n_k)), mode="text+markers", text=labels_k, textposition="middle right",
            marker=dict(size=12, color="rgba(0,0,0,0)"),
            hovertext=[f"key {label}" + _note(key_notes, j) for j, label in enumerate(labels_k)], hoverinfo="text",
            showlegend=False, name="keys", textfont=dict(color="#1b1f24"),
        )
    )


def _note(notes: list[str] | None, index: int) -> str:
    return f"<br>{style.plotly_text(notes[index])}" if notes and notes[index] else ""


def _lines_layout(figure: go.Figure, title: str, n_q: int, n_k: int, drawn_lines: list[list[float]],
                  line_traces: list[int]) -> None:
    """Two columns of tokens, one row each; ``layout.meta`` tells the page's script which lines to highlight (the
    last trace, ``highlight``, is where it draws them)."""
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"),
        xaxis=dict(range=[-0.6, 1.6], visible=False, fixedrange=True),
        yaxis=dict(range=[max(n_q, n_k) - 0.5, -0.5], visible=False),
        height=min(4000, max(320, 70 + 22 * max(n_q, n_k))),
        margin=dict(l=10, r=10, t=60, b=10),
        plot_bgcolor="white",
        legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"),
        font=dict(family=style.FONT_FAMILY),
        meta=dict(attnviz="lines", lines=drawn_lines, line_traces=line_traces, highlight=len(figure.data) - 1),
    )


def attention_lines(
    weights: torch.Tensor,
    query_tokens: list[str],
    key_tokens: list[str],
    heads: list[int],
    *,
    title: str,
    follow: list[int] | None = None,
    min_weight: float = 0.02,
    max_lines_per_head: int = 2000,
    query_ids: list[int] | None = None,
    head_names: list[int] | None = None,
    top_k: int | None = None,
    key_ids: list[int] | None = None,
    query_notes: list[str] | None = None,
    key_notes: list[str] | None = None,
) -> go.Figure:
    """bertviz-style lines: queries on the left, keys on the right, line width and opacity = weight.

    ``weights [heads_total, n_q, n_k]`` of one layer; ``heads`` picks which heads to draw (one colour each);
    ``follow`` keeps only those query positions. Lines below ``min_weight`` are dropped, and at most the
    ``max_lines_per_head`` strongest per head are drawn, so long inputs stay responsive. ``query_ids`` (the
    queries' positions in the full text) are attached to the query labels, so a click can name the token;
    ``head_names`` are the heads' numbers in the model when ``weights`` holds only the drawn heads; ``top_k``
    keeps only each query's ``top_k`` strongest keys. ``query_ids`` and ``key_ids`` (the keys' positions) label the
    tokens by position; ``query_notes`` / ``key_notes`` (one string per token, e.g. its raw piece and id) are added
    to their hovers. ``layout.meta`` lists the drawn lines (query row, key row, weight) and the traces that draw
    them, so the page's script can highlight a token's lines on hover.
    """
    n_q, n_k = weights.shape[-2:]
    figure = go.Figure()
    queries = list(range(n_q)) if not follow else [q for q in follow if 0 <= q < n_q]
    drawn_lines: list[list[float]] = []  # [query row, key row, weight] of every line, for the hover highlight
    line_traces: list[int] = []
    for head in heads:
        values, flat = _strongest_lines(weights[head][queries], top_k, min_weight, max_lines_per_head)
        name = head if head_names is None else head_names[head]
        head_lines, head_traces = _add_head_lines(figure, values, flat, queries, n_k, name)
        drawn_lines += head_lines
        line_traces += head_traces
    _add_token_columns(figure, query_tokens, key_tokens, n_q, n_k, set(queries) if follow else set(), query_ids,
                       key_ids, query_notes, key_notes)
    figure.add_trace(  # filled by the page's script while a token is hovered: that token's lines, drawn dark
        go.Scatter(x=[], y=[], mode="lines", line=dict(color="#111111", width=3), hoverinfo="skip",
                   showlegend=False, name="highlight")
    )
    _lines_layout(figure, title, n_q, n_k, drawn_lines, line_traces)
    return figure


def drawn_query_heads(n_heads: int, n_kv_heads: int, max_heads: int | None = None) -> list[int]:
    """The query heads :func:`head_sharing` draws: all of them when they fit in ``max_heads``; else whole K/V
    groups sampled across the model, at least two query heads of each group drawn (its first and its last) so that
    sharing shows: MHA draws single heads spread over all of them, GQA pairs that share a K/V head, MQA many heads
    on one."""
    if not max_heads or n_heads <= max_heads:
        return list(range(n_heads))
    size = n_heads // n_kv_heads  # query heads per K/V head
    per_group = 1 if size == 1 else min(size, max(2, max_heads // n_kv_heads))
    n_groups = max(1, min(n_kv_heads, max_heads // per_group))
    groups = sorted({round(i * (n_kv_heads - 1) / max(n_groups - 1, 1)) for i in range(n_groups)})
    heads = []
    for group in groups:
        first = group * size
        within = list(range(per_group - 1)) + [size - 1] if per_group > 1 else [0]  # the first ones and the last
        heads += [first + offset for offset in sorted(set(within))]
    return heads


def head_sharing(n_heads: int, n_kv_heads: int, *, title: str, max_heads: int | None = None) -> go.Figure:
    """Which query heads read which K/V head (MHA: one each; GQA: groups; MQA: all share one).

    ``max_heads`` draws at most that many query heads (:func:`drawn_query_heads`: whole groups sampled across the
    model), each with its real K/V head; a "…" marks query heads left out between two drawn ones."""
    from attnviz.core.attention import kv_head_of_query_head

    full_mapping = kv_head_of_query_head(n_heads, n_kv_heads)
    drawn = drawn_query_heads(n_heads, n_kv_heads, max_heads)
    shown = len(drawn)
    mapping = [full_mapping[h] for h in drawn]
    groups = sorted(set(mapping))  # the K/V heads the drawn query heads read
    figure = go.Figure()
    span = max(shown - 1, 1)
    # Each K/V head sits under the middle of the query heads it serves among those drawn.
    kv_x = {g: sum(x for x, m in enumerate(mapping) if m == g) / mapping.count(g) for g in groups}
    for x, group in enumerate(mapping):
        figure.add_trace(
            go.Scatter(
                x=[x, kv_x[group]], y=[1, 0], mode="lines", showlegend=False, hoverinfo="skip",
                line=dict(color=HEAD_COLOURS[group % len(HEAD_COLOURS)], width=2),
            )
        )
    gaps = [x + 0.5 for x in range(shown - 1) if drawn[x + 1] != drawn[x] + 1]  # heads left out between these
    if gaps:
        figure.add_trace(
            go.Scatter(x=gaps, y=[1] * len(gaps), mode="text", text=["…"] * len(gaps), textposition="middle center",
                       textfont=dict(size=16, color="#555"), hoverinfo="skip", showlegend=False)
        )
    # The rows are named once, at the left, and each head by its number: "KV18" under every square overlapped its
    # neighbours' in a third of a 900-px window.
    figure.add_trace(go.Scatter(x=[-1, -1], y=[1, 0], mode="text", text=["<b>Q</b>", "<b>K/V</b>"],
                                textposition="middle center", hoverinfo="skip", showlegend=False))
    figure.add_trace(
        go.Scatter(
            x=list(range(shown)), y=[1] * shown, mode="markers+text", text=[str(h) for h in drawn],
            textposition="top center",
            marker=dict(size=14, color=[HEAD_COLOURS[g % len(HEAD_COLOURS)] for g in mapping]),
            hovertext=[f"query head {h} reads K/V head {g}" for h, g in zip(drawn, mapping, strict=True)],
            hoverinfo="text", showlegend=False,
        )
    )
    figure.add_trace(
        go.Scatter(
            x=[kv_x[g] for g in groups], y=[0] * len(groups), mode="markers+text", text=[str(g) for g in groups],
            textposition="bottom center",
            marker=dict(size=18, symbol="square", color=[HEAD_COLOURS[g % len(HEAD_COLOURS)] for g in groups]),
            hovertext=[f"K/V head {g}: {full_mapping.count(g)} query heads" for g in groups], hoverinfo="text",
            showlegend=False,
        )
    )
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"),
        xaxis=dict(visible=False, range=[-1.6, span + 1]),
        yaxis=dict(visible=False, range=[-0.5, 1.5]),
        height=260, margin=dict(l=10, r=10, t=50, b=10), plot_bgcolor="white",
        font=dict(family=style.FONT_FAMILY),
    )
    return figure


def statistic_heatmap(values, *, title: str, statistic: str, labels: list[list[str]] | None = None,
                      highlight: tuple[int, int] | None = None, width: int = 1000,
                      value_range: tuple[float, float] | None = None) -> go.Figure:
    """One statistic of every head as a layers x heads heatmap, ``values [layers, heads]``, to find heads at a
    glance, coloured on ``value_range`` (default: the values' own spread). Each cell holds an invisible point with
    ``customdata = [layer, head]``: clicking it selects that head (Streamlit reports point selections, not heatmap
    cells). The hover names the head, the value and its label."""
    matrix = np.asarray(values, dtype=np.float64)
    layers, heads = matrix.shape
    height = int(min(900, max(280, 130 + 44 * layers)))
    text = [[style.format_number(v) for v in row] for row in matrix.tolist()]
    show_text = numbers_fit(text, *plot_area(width, height, layers, heads))
    figure = go.Figure(go.Heatmap(
        z=matrix, x=list(range(heads)), y=list(range(layers)), colorscale=style.PLAIN_COLORSCALE,
        zmin=value_range[0] if value_range else None, zmax=value_range[1] if value_range else None,
        text=text if show_text else None, texttemplate="%{text}" if show_text else None,
        textfont=dict(size=12), hoverinfo="skip", colorbar=dict(title=dict(text=statistic, side="right")),
        xgap=1, ygap=1,
    ))
    centres = [(layer, head) for layer in range(layers) for head in range(heads)]
    figure.add_trace(go.Scatter(
        x=[h for _, h in centres], y=[layer for layer, _ in centres], mode="markers",
        marker=dict(size=max(10, min(40, 600 // max(heads, layers))), color="rgba(0,0,0,0)", symbol="square"),
        customdata=[[layer, head] for layer, head in centres],
        hovertext=[f"layer {layer}, head {head}<br>{statistic} {style.format_number(matrix[layer, head])}"
                   + (f"<br>{labels[layer][head]}" if labels else "") + "<br>click to open"
                   for layer, head in centres],
        hoverinfo="text", showlegend=False,
    ))
    if highlight is not None:
        layer, head = highlight
        figure.add_shape(type="rect", x0=head - 0.5, x1=head + 0.5, y0=layer - 0.5, y1=layer + 0.5,
                         line=dict(color="#ff7f0e", width=3))
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"),
        xaxis=dict(title="head", tickmode="array", tickvals=list(range(heads)), side="top", showgrid=False),
        yaxis=dict(title="layer", tickmode="array", tickvals=list(range(layers)), autorange="reversed",
                   showgrid=False),
        height=height, margin=dict(l=10, r=10, t=90, b=10), plot_bgcolor="white",
        font=dict(family=style.FONT_FAMILY),
    )
    return figure
