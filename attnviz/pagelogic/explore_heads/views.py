"""The View tab: the head, lines, average and rollout views (the grid is in :mod:`.grid`), one builder per view in
:data:`VIEW_BUILDERS`, each ``(capture, record, options, kind name, filter note) -> (figure, caption)``."""

from __future__ import annotations

import dataclasses

import plotly.graph_objects as go
import torch

from attnviz.core import analysis
from attnviz.models.record import AttentionRecord, Capture
from attnviz.pagelogic.explore_heads.grid import grid_view
from attnviz.pagelogic.explore_heads.matrices import (
    POOL_LIMIT,
    Matrix,
    dense_matrix,
    head_matrix,
    matrix_title,
    piece_notes,
    scale_matrix,
    scale_rows,
    span_notes,
    stream_rows,
    weights_heatmap,
    with_segments,
    zoom_matrix,
    zoom_window,
)
from attnviz.pagelogic.explore_heads.options import KIND_NAMES, VIEWS, ViewOptions, filter_note, filtered, positions
from attnviz.viz.heads import attention_lines

LINES_TOKEN_LIMIT = 64  # a side: above this, the lines view draws a window of queries and the keys they use most


def mark_zoom(figure: go.Figure, capture: Capture, record: AttentionRecord, matrix: Matrix,
              options: ViewOptions) -> None:
    """Outline, on a pooled heatmap, the cells the zoom window covers."""
    rows, cols = matrix.pooled_from
    query_positions, key_positions = positions(capture, record, options)
    row_cells, col_cells = analysis.bins(rows, POOL_LIMIT), analysis.bins(cols, POOL_LIMIT)
    q0, q1 = zoom_window(query_positions, options.zoom_query, options.zoom_size)
    k0, k1 = zoom_window(key_positions, options.zoom_key, options.zoom_size)
    figure.add_shape(type="rect", xref="x", yref="y", x0=int(col_cells[k0]) - 0.5, x1=int(col_cells[k1 - 1]) + 0.5,
                     y0=int(row_cells[q0]) - 0.5, y1=int(row_cells[q1 - 1]) + 0.5,
                     line=dict(color="#ff7f0e", width=2))


def shown_heads(record: AttentionRecord, options: ViewOptions) -> tuple[list[int], str]:
    """The heads the head or average view shows, and how a title names them."""
    if options.view == "average":
        return list(range(record.n_heads)), f"Layer {options.layer}: average of {record.n_heads} heads"
    return [options.head], f"Layer {options.layer}, head {options.head}"


def zoom_figure(capture: Capture, options: ViewOptions) -> tuple[go.Figure, str]:
    """The zoom window of the head (or average) view at full resolution: every cell exact on hover."""
    record = capture.records[options.kind]
    heads, name = shown_heads(record, options)
    matrix = zoom_matrix(capture, record, options, heads)
    figure = weights_heatmap(matrix, matrix_title(f"{name}, zoomed", matrix, options), options.scale,
                             notes=span_notes(capture, record, matrix))
    return figure, ("The orange box on the pooled view, cell by cell: hover for each query, key and weight. Move it "
                    "with the zoom inputs.")


def _head_view(capture: Capture, record: AttentionRecord, options: ViewOptions, kind_name: str, note: str):
    matrix = head_matrix(capture, record, options, [options.head])
    base = f"Layer {options.layer}, head {options.head}: {kind_name}{note}"
    figure = weights_heatmap(matrix, matrix_title(base, matrix, options), options.scale,
                             notes=span_notes(capture, record, matrix))
    if matrix.pooled_from:
        mark_zoom(figure, capture, record, matrix, options)
    caption = "Each row is one query token's attention over the keys; hover a cell for its query, key and weight."
    if matrix.empty:
        caption = ("Every weight here is 0: these queries give no attention to these keys (in a causal model, "
                   "sentence A comes first and cannot see sentence B), so there is nothing to renormalise.")
    if matrix.pooled_from:
        caption += (f" Each cell is the {options.pooling} of a block of weights: zoom below for exact values of "
                    "any window.")
    return figure, caption


def _lines_view(capture: Capture, record: AttentionRecord, options: ViewOptions, kind_name: str, note: str):
    query_positions, key_positions = positions(capture, record, options)
    followed = [q for q in options.follow if q in query_positions]
    cut = ""
    if len(query_positions) <= LINES_TOKEN_LIMIT:
        drawn = query_positions  # every query listed; lines for the followed ones (or all)
    elif followed:
        drawn = followed[:LINES_TOKEN_LIMIT]
    else:  # a window of consecutive queries, which the page can move
        start = max(0, min(options.lines_start, len(query_positions) - LINES_TOKEN_LIMIT))
        drawn = query_positions[start:start + LINES_TOKEN_LIMIT]
        cut = (f" Queries {start:,}–{start + LINES_TOKEN_LIMIT - 1:,} of {len(query_positions):,} are drawn: move the "
               "window, or follow tokens.")
    renormalise = options.renormalises
    heads = options.line_heads if options.line_heads else [options.head]
    # Only the drawn rows are computed, for the heads drawn: [heads, drawn, kept keys]
    weights = torch.cat([w for _, w in stream_rows(record, options.layer, heads, drawn, key_positions,
                                                   renormalise, "fixed")], dim=1)
    if len(key_positions) > LINES_TOKEN_LIMIT:  # a readable column of keys: those these queries use most
        weights, key_positions, share = strongest_keys(weights, key_positions, LINES_TOKEN_LIMIT)
        cut += (f" Keys: the {LINES_TOKEN_LIMIT} of {len(positions(capture, record, options)[1]):,} that receive the "
                f"most weight from the drawn queries ({share:.0%} of it), in text order.")
    plural = "s" if len(heads) > 1 else ""
    figure = attention_lines(
        weights,
        [record.query_display[i] for i in drawn],
        [record.key_display[j] for j in key_positions],
        list(range(len(heads))),
        title=f"Layer {options.layer}: {kind_name}, head{plural} {', '.join(map(str, heads))}{note}",
        follow=[drawn.index(q) for q in followed] or None,
        query_ids=drawn,
        head_names=heads,
        top_k=options.top_k,
        key_ids=key_positions,
        query_notes=piece_notes(capture, record.query_tokens, drawn),
        key_notes=piece_notes(capture, record.key_tokens, key_positions),
    )
    strongest = f"; only each query's {options.top_k} strongest keys" if options.top_k else ""
    return figure, (
        f"Line width and opacity = attention weight (lines under 0.02 hidden{strongest}); one colour per head. "
        "Hover a token to see its lines alone; click a query token to follow it, click it again to see all." + cut
    )


def strongest_keys(weights: torch.Tensor, key_positions: list[int], count: int) -> tuple[torch.Tensor, list[int],
                                                                                          float]:
    """The ``count`` keys of ``weights [heads, queries, keys]`` that receive the most weight in total, in text order:
    their weights, positions, and the share of all the weight they hold."""
    received = weights.sum(dim=(0, 1))  # [keys]
    kept = sorted(torch.topk(received, count).indices.tolist())
    share = float(received[kept].sum() / received.sum().clamp_min(1e-30))
    return weights[..., kept], [key_positions[j] for j in kept], share


def _average_view(capture: Capture, record: AttentionRecord, options: ViewOptions, kind_name: str, note: str):
    matrix = head_matrix(capture, record, options, list(range(record.n_heads)))
    base = f"Layer {options.layer}: average of {record.n_heads} heads{note}"
    figure = weights_heatmap(matrix, matrix_title(base, matrix, options), options.scale,
                             notes=span_notes(capture, record, matrix))
    if matrix.pooled_from:
        mark_zoom(figure, capture, record, matrix, options)
    return figure, "The mean over heads hides what single heads do: compare with the grid."


def _rollout_view(capture: Capture, record: AttentionRecord, options: ViewOptions, kind_name: str, note: str):
    if options.kind == "cross" or record.n_q != record.n_k:
        raise ValueError("rollout needs square self-attention; choose another attention kind")
    record.check_dense()  # rollout multiplies whole N x N matrices through the layers
    through = record.n_layers - 1 if options.rollout_layer is None else options.rollout_layer
    if not 0 <= through < record.n_layers:
        raise ValueError(f"rollout through layer {through}: this model has layers 0 to {record.n_layers - 1}")
    rolled = analysis.attention_rollout(record.weights)[through]
    kept = filtered(rolled, capture, record, options)
    query_positions, key_positions = kept.query_positions, kept.key_positions
    matrix = dense_matrix(kept.weights, record.query_display, record.key_display, query_positions, key_positions,
                          options.pooling)
    matrix = dataclasses.replace(matrix, values=scale_matrix(scale_rows(matrix.values, options.scale), options.scale))
    matrix = with_segments(matrix, capture, record, query_positions, key_positions)
    base = f"Attention rollout through layers 0..{through}{note}"
    figure = weights_heatmap(matrix, matrix_title(base, matrix, options), options.scale,
                             notes=span_notes(capture, record, matrix))
    return figure, (
        "Rollout (Abnar & Zuidema, 2020) multiplies the head-averaged attention, mixed half-and-half with the "
        "residual identity, through the layers: how much each input token reaches each position."
    )


VIEW_BUILDERS = {"head": _head_view, "grid": grid_view, "lines": _lines_view, "average": _average_view,
                 "rollout": _rollout_view}


def view_figure(capture: Capture, options: ViewOptions) -> tuple[go.Figure, str]:
    """The figure and its caption for the chosen view (one of :data:`VIEWS`)."""
    if options.view not in VIEW_BUILDERS:
        raise ValueError(f"unknown view {options.view!r}; choose one of {list(VIEWS)}")
    record = capture.records[options.kind]
    kind_name = KIND_NAMES.get(options.kind, options.kind)
    return VIEW_BUILDERS[options.view](capture, record, options, kind_name, filter_note(options))
