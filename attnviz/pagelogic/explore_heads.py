"""Everything the "Explore heads" page computes, as functions of a :class:`~attnviz.models.capture.Capture`.

The page only reads widgets, calls these, and draws the figures they return; the benchmark calls the same.
"""

from __future__ import annotations

import dataclasses
import io
import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from attnviz import analysis, mask_patterns
from attnviz.models.capture import AttentionRecord, Capture
from attnviz.viz import style
from attnviz.viz.heads import attention_lines, head_grid, statistic_heatmap
from attnviz.viz.matrix import FULL_WIDTH, HALF_WIDTH, matrix_heatmap

VIEWS = {
    "head": "Head",
    "grid": "Grid",
    "lines": "Lines",
    "average": "Average",
    "rollout": "Rollout",
}
BLOCKS = ("all", "A→A", "A→B", "B→A", "B→B")
KIND_NAMES = {
    "self": "self-attention",
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention (causal)",
    "cross": "cross-attention (decoder → encoder)",
}
LINES_TOKEN_LIMIT = 128  # above this, the lines view draws only the followed tokens (or the first 128 rows)
POOL_LIMIT = 256  # cells a side drawn as they are; longer inputs are pooled to this many cells, with a zoom
ZOOM_SIZES = (32, 64, 128, 256)
SCALES = {  # colour scales of a weights heatmap: how the title says it
    "fixed": "weights on 0–1",
    "head": "scaled to this head's maximum",
    "row": "each row scaled to its maximum",
    "log": "log10 of the weights",
}
GRID_SCALES = {  # the grid's thumbnails: the same 0–1 as the head view, or each head to its own maximum
    "head": "each head scaled to its maximum",
    "fixed": "weights on 0–1",
}
THUMBNAIL = 24  # cells a side of a grid thumbnail
GRID_NOTES_LIMIT = 2048  # tokens: up to this length the grid's hover and badges carry each head's statistics
BADGES = {"previous-token head": "prev", "next-token head": "next", "self head": "self",
          "first-token head": "first", "delimiter head": "delim", "punctuation head": "punct", "broad head": "broad"}


@dataclass
class ViewOptions:
    kind: str = "self"
    layer: int = 0
    head: int = 0
    view: str = "head"
    hide_special: bool = False
    renormalise: bool = True
    block: str = "all"
    follow: list[int] = field(default_factory=list)
    line_heads: list[int] | None = None
    pooling: str = "max"  # for inputs longer than POOL_LIMIT: max or mean of each cell's weights
    scale: str = "fixed"  # a key of SCALES
    grid_scale: str = "head"  # a key of GRID_SCALES
    top_k: int | None = None  # the lines view: only each query's strongest keys
    rollout_layer: int | None = None  # the rollout view: through this layer (None: the last)
    zoom_query: int = 0  # the zoom window's first query and key, counted among the kept tokens
    zoom_key: int = 0
    zoom_size: int = 128

    @property
    def renormalises(self) -> bool:
        """Whether kept rows are rescaled to sum to 1: asked for, and some filter removed tokens."""
        return self.renormalise and (self.hide_special or self.block != "all")


def positions(capture: Capture, record: AttentionRecord, options: ViewOptions) -> tuple[list[int], list[int]]:
    """Query and key positions kept by the special-token and A/B filters."""
    n_q, n_k = record.n_q, record.n_k
    query_positions, key_positions = list(range(n_q)), list(range(n_k))
    same_tokens = record.query_tokens is capture.tokens and record.key_tokens is capture.tokens
    if options.block != "all" and same_tokens:
        source, target = options.block.split("→")
        query_positions = analysis.segment_indices(capture.segments, source)
        key_positions = analysis.segment_indices(capture.segments, target)
    if options.hide_special:
        query_special, key_special = capture.special_of(record.query_tokens), capture.special_of(record.key_tokens)
        query_positions = [i for i in query_positions if not query_special[i]]
        key_positions = [j for j in key_positions if not key_special[j]]
    if not query_positions or not key_positions:
        raise ValueError("the filters leave no tokens: show special tokens, or choose another A/B block")
    return query_positions, key_positions


def filtered(weights: torch.Tensor, capture: Capture, record: AttentionRecord, options: ViewOptions):
    """Apply the filters to ``[..., n_q, n_k]``; returns (weights, query labels, key labels)."""
    query_positions, key_positions = positions(capture, record, options)
    renormalise = options.renormalises
    subset = analysis.keep_tokens(weights, query_positions, key_positions, renormalise)
    query_labels = style.token_labels([record.query_tokens[i] for i in query_positions], query_positions)
    key_labels = style.token_labels([record.key_tokens[j] for j in key_positions], key_positions)
    return subset, query_labels, key_labels, query_positions, key_positions


def filter_note(options: ViewOptions) -> str:
    notes = []
    if options.hide_special:
        notes.append("special tokens hidden")
    if options.block != "all":
        notes.append(f"block {options.block}")
    if notes and options.renormalise:
        notes.append("rows renormalised to sum to 1")
    elif notes:
        notes.append("rows not renormalised: they sum to the share left after hiding")
    return f" ({'; '.join(notes)})" if notes else ""


@dataclass
class Matrix:
    """What a weights heatmap draws: values (already on the colour scale), labels, and how it was made."""

    values: torch.Tensor  # [rows, cols]
    row_labels: list[str]
    col_labels: list[str]
    pooled_from: tuple[int, int] | None = None  # (kept queries, kept keys) when cells are pooled
    window: tuple[int, int, int, int] | None = None  # zoom: first query position, first key position, rows, cols
    empty: bool = False  # no kept query gives any weight to a kept key (e.g. A -> B in a causal model)
    row_segments: list[int] | None = None  # sentence (0 = A, 1 = B) of each row and column, for a sentence pair
    col_segments: list[int] | None = None


def _on_scale(weights: torch.Tensor, scale: str) -> torch.Tensor:
    """Row scaling happens before pooling (each query's own structure), log after (see _finish)."""
    if scale == "row":
        return weights / weights.amax(-1, keepdim=True).clamp_min(1e-30)
    return weights


def _finish(values: torch.Tensor, scale: str) -> torch.Tensor:
    """After pooling: "head" divides by the matrix's maximum. On the log scale a zero weight (a masked key) has no
    logarithm: it is left out (drawn grey), so the colour range spans the weights that exist."""
    if scale == "head":
        return values / values.max().clamp_min(1e-30) if values.numel() else values
    if scale != "log":
        return values
    return torch.where(values > 0, torch.log10(values.clamp_min(1e-30)), torch.full_like(values, float("nan")))


def _stream_rows(record: AttentionRecord, layer: int, heads: list[int], query_positions: list[int],
                 key_positions: list[int], renormalise: bool, scale: str, block: int | None = None):
    """Yield ``(ranks, weights)``: the kept query rows block by block, ``[len(heads), rows, len(keys)]``, with
    each row's rank among the kept queries; filtered, renormalised and row-scaled as the view asks."""
    keep_rows = torch.zeros(record.n_q, dtype=torch.bool)
    keep_rows[query_positions] = True
    rank = torch.cumsum(keep_rows.long(), 0) - 1
    keys = torch.tensor(key_positions)
    block = block or record.block_rows()
    for start in range(0, record.n_q, block):
        end = min(record.n_q, start + block)
        rows = keep_rows[start:end].nonzero().flatten()
        if len(rows) == 0:
            continue
        weights = record.layer_weights(layer, start, end, heads=heads)[:, rows][:, :, keys]  # [h, kept rows, keys]
        if renormalise:
            totals = weights.sum(-1, keepdim=True)
            weights = torch.where(totals > 0, weights / totals.clamp_min(1e-30), weights)
        yield rank[start:end][rows], _on_scale(weights, scale)


def head_matrix(capture: Capture, record: AttentionRecord, options: ViewOptions, heads: list[int]) -> Matrix:
    """The head view's matrix (mean over ``heads``): exact up to POOL_LIMIT kept tokens a side, else pooled by
    ``options.pooling`` to POOL_LIMIT cells. Never holds more than one block of rows of the ``N x N`` weights."""
    query_positions, key_positions = positions(capture, record, options)
    renormalise = options.renormalises
    n_rows, n_cols = len(query_positions), len(key_positions)
    pooled = n_rows > POOL_LIMIT or n_cols > POOL_LIMIT
    row_cells, col_cells = analysis.bins(n_rows, POOL_LIMIT), analysis.bins(n_cols, POOL_LIMIT)
    pooler = analysis.Pooler((), int(row_cells[-1]) + 1, col_cells, options.pooling if pooled else "mean")
    total = 0.0
    for ranks, weights in _stream_rows(record, options.layer, heads, query_positions, key_positions, renormalise,
                                       options.scale):
        pooler.add(weights.mean(0), row_cells[ranks])  # the mean over heads (one head: itself)
        total += float(weights.sum())
    values = _finish(pooler.result(), options.scale)
    if not pooled:
        matrix = Matrix(values, _labels(record.query_tokens, query_positions),
                        _labels(record.key_tokens, key_positions), empty=total == 0)
    else:
        matrix = Matrix(values, _range_labels(record.query_tokens, query_positions, n_rows),
                        _range_labels(record.key_tokens, key_positions, n_cols), pooled_from=(n_rows, n_cols),
                        empty=total == 0)
    return with_segments(matrix, capture, record, query_positions, key_positions)


def _window(kept: list[int], start_position: int, size: int) -> tuple[int, int]:
    """The zoom window among the kept tokens, ``(first rank, end rank)``: it starts at the first kept token at or
    after ``start_position`` and is shifted back near the end, so it always holds ``size`` tokens (or all)."""
    first = next((rank for rank, position in enumerate(kept) if position >= start_position), len(kept) - 1)
    first = max(0, min(first, len(kept) - size))
    return first, min(len(kept), first + size)


def zoom_matrix(capture: Capture, record: AttentionRecord, options: ViewOptions, heads: list[int]) -> Matrix:
    """A window of ``options.zoom_size`` kept queries x keys from token positions ``zoom_query`` and
    ``zoom_key`` (shifted back at the end), at full resolution: exact values."""
    query_positions, key_positions = positions(capture, record, options)
    renormalise = options.renormalises
    q0, q1 = _window(query_positions, options.zoom_query, options.zoom_size)
    k0, k1 = _window(key_positions, options.zoom_key, options.zoom_size)
    rows = query_positions[q0:q1]
    parts = []
    for _, weights in _stream_rows(record, options.layer, heads, rows, key_positions, renormalise, options.scale):
        parts.append(weights.mean(0)[:, k0:k1])
    values = _finish(torch.cat(parts), options.scale)
    window_keys = key_positions[k0:k1]
    matrix = Matrix(values, _labels(record.query_tokens, rows), _labels(record.key_tokens, window_keys),
                    window=(rows[0], window_keys[0], len(rows), len(window_keys)))
    return with_segments(matrix, capture, record, rows, window_keys)


def dense_matrix(values: torch.Tensor, query_tokens: list[str], key_tokens: list[str],
                 query_positions: list[int] | None = None, key_positions: list[int] | None = None,
                 how: str = "mean") -> Matrix:
    """A matrix already in memory (rollout, what-if, compare), drawn like the head view: as it is up to POOL_LIMIT
    a side, else pooled (signed values by mean, so + and - do not cancel into the max)."""
    query_positions = list(range(values.shape[0])) if query_positions is None else query_positions
    key_positions = list(range(values.shape[1])) if key_positions is None else key_positions
    n_rows, n_cols = values.shape
    if n_rows <= POOL_LIMIT and n_cols <= POOL_LIMIT:
        return Matrix(values, _labels(query_tokens, query_positions), _labels(key_tokens, key_positions))
    row_cells, col_cells = analysis.bins(n_rows, POOL_LIMIT), analysis.bins(n_cols, POOL_LIMIT)
    pooler = analysis.Pooler((), int(row_cells[-1]) + 1, col_cells, how)
    pooler.add(values.float(), row_cells)
    return Matrix(pooler.result(), _range_labels(query_tokens, query_positions, n_rows),
                  _range_labels(key_tokens, key_positions, n_cols), pooled_from=(n_rows, n_cols))


def _segments(capture: Capture, tokens: list[str], kept: list[int], pooled: bool) -> list[int] | None:
    """The sentence (0 = A, 1 = B) of each row or column (a pooled cell: of its first token), when ``tokens`` are
    the capture's own and it holds a sentence pair; else None."""
    if tokens is not capture.tokens or not any(capture.segments):
        return None
    if not pooled:
        return [capture.segments[i] for i in kept]
    return [capture.segments[kept[first]] for first, _ in analysis.bin_edges(len(kept), POOL_LIMIT)]


def with_segments(matrix: Matrix, capture: Capture, record: AttentionRecord, query_positions: list[int],
                  key_positions: list[int]) -> Matrix:
    """``matrix`` with the sentence of each row and column, so the heatmap marks where sentence B starts."""
    pooled = matrix.pooled_from is not None
    return dataclasses.replace(
        matrix, row_segments=_segments(capture, record.query_tokens, query_positions, pooled),
        col_segments=_segments(capture, record.key_tokens, key_positions, pooled))


def _labels(tokens: list[str], kept: list[int]) -> list[str]:
    return style.token_labels([tokens[i] for i in kept], kept)


def _range_labels(tokens: list[str], kept: list[int], n: int) -> list[str]:
    """One label per pooled cell: the positions it covers and its first token."""
    labels = []
    for first, last in analysis.bin_edges(n, POOL_LIMIT):
        start, end = kept[first], kept[last]
        single = end == start
        labels.append(style.token_label(start, tokens[start]) if single else f"{start}–{end} · {tokens[start][:10]}")
    return labels


def _pooled_title(base: str, matrix: Matrix, how: str = "max") -> str:
    if not matrix.pooled_from:
        return base
    rows, cols = matrix.pooled_from
    return f"{base}<br><sup>{rows:,} x {cols:,} pooled to {len(matrix.row_labels)} x {len(matrix.col_labels)}</sup>"


def matrix_title(base: str, matrix: Matrix, options: ViewOptions) -> str:
    parts = [base]
    if matrix.pooled_from:
        rows, cols = matrix.pooled_from
        parts.append(f"{rows:,} x {cols:,} pooled to {len(matrix.row_labels)} x {len(matrix.col_labels)} cells by "
                     f"{options.pooling}")
    if matrix.window:
        q0, k0, n_rows, n_cols = matrix.window
        parts.append(f"zoom: {n_rows} queries from position {q0}, {n_cols} keys from position {k0}")
    if options.scale != "fixed":
        parts.append(f"colour: {SCALES[options.scale]}")
    return parts[0] + ("<br><sup>" + "; ".join(parts[1:]) + "</sup>" if len(parts) > 1 else "")


def weights_heatmap(matrix: Matrix, title: str, scale: str, height: int | None = None,
                    width: int = FULL_WIDTH) -> go.Figure:
    return matrix_heatmap(matrix.values, matrix.row_labels, matrix.col_labels, title=title, colour=scale,
                          height=height or _square_height(len(matrix.row_labels)), width=width,
                          show_values=matrix.pooled_from is None, row_segments=matrix.row_segments,
                          col_segments=matrix.col_segments)


def _mark_zoom(figure: go.Figure, capture: Capture, record: AttentionRecord, matrix: Matrix,
               options: ViewOptions) -> None:
    """Outline, on a pooled heatmap, the cells the zoom window covers."""
    rows, cols = matrix.pooled_from
    query_positions, key_positions = positions(capture, record, options)
    row_cells, col_cells = analysis.bins(rows, POOL_LIMIT), analysis.bins(cols, POOL_LIMIT)
    q0, q1 = _window(query_positions, options.zoom_query, options.zoom_size)
    k0, k1 = _window(key_positions, options.zoom_key, options.zoom_size)
    figure.add_shape(type="rect", xref="x", yref="y", x0=int(col_cells[k0]) - 0.5, x1=int(col_cells[k1 - 1]) + 0.5,
                     y0=int(row_cells[q0]) - 0.5, y1=int(row_cells[q1 - 1]) + 0.5,
                     line=dict(color="#ff7f0e", width=2))


def _views_heads(record: AttentionRecord, options: ViewOptions) -> tuple[list[int], str]:
    if options.view == "average":
        return list(range(record.n_heads)), f"Layer {options.layer}: average of {record.n_heads} heads"
    return [options.head], f"Layer {options.layer}, head {options.head}"


def zoom_figure(capture: Capture, options: ViewOptions) -> tuple[go.Figure, str]:
    """The zoom window of the head (or average) view at full resolution: every cell exact on hover."""
    record = capture.records[options.kind]
    heads, name = _views_heads(record, options)
    matrix = zoom_matrix(capture, record, options, heads)
    figure = weights_heatmap(matrix, matrix_title(f"{name}, zoomed", matrix, options), options.scale)
    return figure, ("The orange box on the pooled view, cell by cell: hover for each query, key and weight. Move it "
                    "with the zoom inputs.")


def _head_view(capture: Capture, record: AttentionRecord, options: ViewOptions, kind_name: str, note: str):
    matrix = head_matrix(capture, record, options, [options.head])
    base = f"Layer {options.layer}, head {options.head}: {kind_name}{note}"
    figure = weights_heatmap(matrix, matrix_title(base, matrix, options), options.scale)
    if matrix.pooled_from:
        _mark_zoom(figure, capture, record, matrix, options)
    caption = "Each row is one query token's attention over the keys; hover a cell for its query, key and weight."
    if matrix.empty:
        caption = ("Every weight here is 0: these queries give no attention to these keys (in a causal model, "
                   "sentence A comes first and cannot see sentence B), so there is nothing to renormalise.")
    if matrix.pooled_from:
        caption += (f" Each cell is the {options.pooling} of a block of weights: zoom below for exact values of "
                    "any window.")
    return figure, caption


def grid_thumbnails(record: AttentionRecord, progress=None, query_positions: list[int] | None = None,
                    key_positions: list[int] | None = None, renormalise: bool = False) -> torch.Tensor:
    """Every head pooled to THUMBNAIL x THUMBNAIL cells by mean, ``[layers, heads, t_q, t_k]``, streamed by blocks
    of rows (every head of a long input is computed once per set of filters; kept with the record). The filters:
    the kept query and key positions (default all), and whether kept rows are renormalised to sum to 1."""
    query_positions = list(range(record.n_q)) if query_positions is None else query_positions
    key_positions = list(range(record.n_k)) if key_positions is None else key_positions
    memo_key = _thumbnails_key(query_positions, key_positions, renormalise)
    if memo_key in record.memo:
        return record.memo[memo_key]
    row_cells = analysis.bins(len(query_positions), THUMBNAIL)
    col_cells = analysis.bins(len(key_positions), THUMBNAIL)
    heads = list(range(record.n_heads))
    layers = []
    for layer in range(record.n_layers):
        if progress:
            progress(layer, record.n_layers)
        pooler = analysis.Pooler((record.n_heads,), int(row_cells[-1]) + 1, col_cells, "mean")
        for ranks, weights in _stream_rows(record, layer, heads, query_positions, key_positions, renormalise,
                                           "fixed"):
            pooler.add(weights, row_cells[ranks])
        layers.append(pooler.result())
    record.memo[memo_key] = torch.stack(layers)
    return record.memo[memo_key]


def _thumbnails_key(query_positions: list[int], key_positions: list[int], renormalise: bool) -> tuple:
    return ("thumbnails", tuple(query_positions), tuple(key_positions), renormalise)


def filtered_thumbnails(capture: Capture, record: AttentionRecord, options: ViewOptions,
                        progress=None) -> torch.Tensor:
    """:func:`grid_thumbnails` under the view's filters (special tokens, sentence block, renormalising)."""
    query_positions, key_positions = positions(capture, record, options)
    return grid_thumbnails(record, progress, query_positions, key_positions, options.renormalises)


def has_thumbnails(capture: Capture, record: AttentionRecord, options: ViewOptions) -> bool:
    """Whether the grid's thumbnails for these filters are computed already (else the page shows progress)."""
    query_positions, key_positions = positions(capture, record, options)
    return _thumbnails_key(query_positions, key_positions, options.renormalises) in record.memo


def grid_notes(capture: Capture, kind: str) -> tuple[list[list[str]], list[list[str]]] | None:
    """Per head, what the grid's hover says (label, entropy, top key) and its badge (a short label); None for
    cross-attention and above GRID_NOTES_LIMIT tokens (the Head statistics tab computes them there)."""
    record = capture.records[kind]
    if record.n_q != record.n_k or record.n_q > GRID_NOTES_LIMIT:
        return None
    table = statistics_table(capture, kind)
    notes = [[""] * record.n_heads for _ in range(record.n_layers)]
    badges = [[""] * record.n_heads for _ in range(record.n_layers)]
    for _, row in table.iterrows():
        layer, head = int(row["layer"]), int(row["head"])
        notes[layer][head] = (f"{row['label']}<br>entropy {row['entropy (nats)']:.3g} nats<br>top key "
                              f"{row['top key']} ({row['top key share']:.2f} of each row on average)")
        badges[layer][head] = BADGES.get(row["label"], "")
    return notes, badges


def _grid_view(capture: Capture, record: AttentionRecord, options: ViewOptions, kind_name: str, note: str):
    thumbnails = filtered_thumbnails(capture, record, options)
    annotations = grid_notes(capture, options.kind)
    per_head_max = options.grid_scale == "head"
    figure = head_grid(
        thumbnails, title=f"All {record.n_layers} x {record.n_heads} heads: {kind_name}{note}"
                          f"<br><sup>colour: {GRID_SCALES[options.grid_scale]}</sup>",
        highlight=(options.layer, options.head), thumbnail=THUMBNAIL, per_head_max=per_head_max,
        notes=annotations[0] if annotations else None, badges=annotations[1] if annotations else None,
    )
    scale = ("scaled to its own maximum so faint heads show" if per_head_max
             else "on the head view's 0–1 scale, so heads compare directly")
    badges = (" Badges name each head's label from the Head statistics tab; hover for its entropy and top key."
              if annotations else f" Above {GRID_NOTES_LIMIT:,} tokens, labels are in the Head statistics tab.")
    return figure, (
        f"Each thumbnail is one head (rows = queries, columns = keys), pooled by mean and {scale}; the orange box "
        f"is the selected head. Click a thumbnail to open that head.{badges}"
    )


def _lines_view(capture: Capture, record: AttentionRecord, options: ViewOptions, kind_name: str, note: str):
    query_positions, key_positions = positions(capture, record, options)
    followed = [q for q in options.follow if q in query_positions]
    cut = ""
    if len(query_positions) <= LINES_TOKEN_LIMIT:
        drawn = query_positions  # every query listed; lines for the followed ones (or all)
    elif followed:
        drawn = followed[:LINES_TOKEN_LIMIT]
    else:
        drawn = query_positions[:LINES_TOKEN_LIMIT]
        cut = f" Only the first {LINES_TOKEN_LIMIT} queries are drawn; follow tokens to see others."
    renormalise = options.renormalises
    heads = options.line_heads if options.line_heads else [options.head]
    # Only the drawn rows are computed, for the heads drawn: [heads, drawn, kept keys]
    weights = torch.cat([w for _, w in _stream_rows(record, options.layer, heads, drawn, key_positions,
                                                    renormalise, "fixed")], dim=1)
    plural = "s" if len(heads) > 1 else ""
    figure = attention_lines(
        weights,
        [record.query_tokens[i] for i in drawn],
        [record.key_tokens[j] for j in key_positions],
        list(range(len(heads))),
        title=f"Layer {options.layer}: {kind_name}, head{plural} {', '.join(map(str, heads))}{note}",
        follow=[drawn.index(q) for q in followed] or None,
        query_ids=drawn,
        head_names=heads,
        top_k=options.top_k,
    )
    strongest = f"; only each query's {options.top_k} strongest keys" if options.top_k else ""
    return figure, (
        f"Line width and opacity = attention weight (lines under 0.02 hidden{strongest}); one colour per head. "
        "Hover a token to see its lines alone; click a query token to follow it, click it again to see all." + cut
    )


def _average_view(capture: Capture, record: AttentionRecord, options: ViewOptions, kind_name: str, note: str):
    matrix = head_matrix(capture, record, options, list(range(record.n_heads)))
    base = f"Layer {options.layer}: average of {record.n_heads} heads{note}"
    figure = weights_heatmap(matrix, matrix_title(base, matrix, options), options.scale)
    if matrix.pooled_from:
        _mark_zoom(figure, capture, record, matrix, options)
    return figure, "The mean over heads hides what single heads do: compare with the grid."


def _rollout_view(capture: Capture, record: AttentionRecord, options: ViewOptions, kind_name: str, note: str):
    if options.kind == "cross" or record.n_q != record.n_k:
        raise ValueError("rollout needs square self-attention; choose another attention kind")
    record.check_dense()  # rollout multiplies whole N x N matrices through the layers
    through = record.n_layers - 1 if options.rollout_layer is None else options.rollout_layer
    if not 0 <= through < record.n_layers:
        raise ValueError(f"rollout through layer {through}: this model has layers 0 to {record.n_layers - 1}")
    rolled = analysis.attention_rollout(record.weights)[through]
    weights, _, _, query_positions, key_positions = filtered(rolled, capture, record, options)
    matrix = dense_matrix(weights, record.query_tokens, record.key_tokens, query_positions, key_positions,
                          options.pooling)
    matrix = Matrix(_finish(_on_scale(matrix.values, options.scale), options.scale), matrix.row_labels,
                    matrix.col_labels, matrix.pooled_from)
    matrix = with_segments(matrix, capture, record, query_positions, key_positions)
    base = f"Attention rollout through layers 0..{through}{note}"
    figure = weights_heatmap(matrix, matrix_title(base, matrix, options), options.scale)
    return figure, (
        "Rollout (Abnar & Zuidema, 2020) multiplies the head-averaged attention, mixed half-and-half with the "
        "residual identity, through the layers: how much each input token reaches each position."
    )


VIEW_BUILDERS = {"head": _head_view, "grid": _grid_view, "lines": _lines_view, "average": _average_view,
                 "rollout": _rollout_view}


def view_figure(capture: Capture, options: ViewOptions) -> tuple[go.Figure, str]:
    """The figure and its caption for the chosen view (one of :data:`VIEWS`)."""
    if options.view not in VIEW_BUILDERS:
        raise ValueError(f"unknown view {options.view!r}; choose one of {list(VIEWS)}")
    record = capture.records[options.kind]
    kind_name = KIND_NAMES.get(options.kind, options.kind)
    return VIEW_BUILDERS[options.view](capture, record, options, kind_name, filter_note(options))


def _square_height(n: int) -> int:
    return int(min(950, max(320, 120 + 24 * n)))


# HeadStats field -> the table's column name
STATISTICS_COLUMNS = {
    "entropy": "entropy (nats)", "normalised_entropy": "normalised entropy", "mean_distance": "mean distance",
    "self": "self", "previous": "previous token", "next": "next token", "first": "first token",
    "separator": "separators", "punctuation": "punctuation", "top_key": "top key", "top_key_share": "top key share",
}


def statistics_table(capture: Capture, kind: str, progress=None) -> pd.DataFrame:
    """One row per head: entropy, distance, shares and label (self-attention only). Computed block by block of
    query rows, so a long input never holds a head's whole N x N matrix; ``progress(layer, n_layers)``."""
    record = capture.records[kind]
    if record.n_q != record.n_k:
        raise ValueError("head statistics are computed for self-attention; choose encoder or decoder attention")
    if "statistics" in record.memo:  # the grid's hover and the Head statistics tab share one computation
        return record.memo["statistics"].copy()
    tokens = record.key_tokens
    special = capture.special_of(tokens)
    rows = []
    for layer in range(record.n_layers):
        if progress:
            progress(layer, record.n_layers)
        accumulator = analysis.StatisticsAccumulator(record.n_heads, tokens, special)
        block = record.block_rows()
        for start in range(0, record.n_q, block):
            accumulator.add(start, record.layer_weights(layer, start, min(record.n_q, start + block)))
        rows += accumulator.result(layer)
    frame = pd.DataFrame([dataclasses.asdict(row) for row in rows])
    frame["top_key"] = [style.token_label(j, tokens[j]) for j in frame["top_key"]]
    frame = frame.rename(columns=STATISTICS_COLUMNS)
    frame = frame[["layer", "head", "label", *STATISTICS_COLUMNS.values()]]
    record.memo["statistics"] = frame
    return frame.copy()


MAPPABLE_STATISTICS = ("previous token", "next token", "self", "first token", "separators", "punctuation",
                       "entropy (nats)", "normalised entropy", "mean distance", "top key share")


def statistic_figure(table: pd.DataFrame, statistic: str, labels: list[str],
                     selected: tuple[int, int]) -> tuple[go.Figure, str]:
    """A layers x heads heatmap of one column of :func:`statistics_table`; heads whose label is not in ``labels``
    are left blank. Click a cell to open that head."""
    if statistic not in MAPPABLE_STATISTICS:
        raise ValueError(f"unknown statistic {statistic!r}; choose one of {MAPPABLE_STATISTICS}")
    layers, heads = int(table["layer"].max()) + 1, int(table["head"].max()) + 1
    values = np.full((layers, heads), np.nan)
    names = [[""] * heads for _ in range(layers)]
    for _, row in table.iterrows():
        layer, head = int(row["layer"]), int(row["head"])
        names[layer][head] = row["label"]
        if row["label"] in labels:
            values[layer, head] = row[statistic]
    figure = statistic_heatmap(values, title=f"{statistic} of every head", statistic=statistic, labels=names,
                               highlight=selected)
    hidden = int(np.isnan(values).sum())
    note = f" Blank: {hidden} heads with other labels." if hidden else ""
    return figure, f"One cell per head; the orange box is the page's Layer and Head. Click a cell to open it.{note}"


STATISTICS_SHORT = {  # the table's narrow column headers (the full name is the header's tooltip)
    "entropy (nats)": "entropy", "normalised entropy": "norm. H", "mean distance": "distance", "self": "self",
    "previous token": "prev.", "next token": "next", "first token": "first", "separators": "sep.",
    "punctuation": "punct.", "top key share": "top share",
}


def statistics_column_config(column_config) -> dict:
    """Narrow columns (short headers, 3 significant digits), so the whole table fits about 1,000 px."""
    config = {name: column_config.NumberColumn(short, help=name, format="%.3g", width=60)
              for name, short in STATISTICS_SHORT.items()}
    config.update(layer=column_config.NumberColumn("layer", width=45),
                  head=column_config.NumberColumn("head", width=45),
                  label=column_config.TextColumn("label", width=140),
                  **{"top key": column_config.TextColumn("top key", width=110)})
    return config


def label_rules_text() -> str:
    rules = [f"**{label}**: share on {stat} ≥ {threshold}" for label, (stat, threshold) in analysis.LABEL_RULES.items()]
    rules.append(f"**broad head**: normalised entropy ≥ {analysis.BROAD_ENTROPY}")
    return "; ".join(rules) + ". The strongest rule that holds wins; otherwise **mixed**."


# ---------------------------------------------------------------------------------------------------------------
# The Q·K view (bertviz's neuron view, for every architecture captured)


@dataclass
class QueryKey:
    """How one score is made: the query and key vectors as attention saw them (after RoPE, if any), their
    element-wise product, its sum times the model's scaling (plus any position bias or soft-capping: the
    record's own scores), and the softmax over every key of the row."""

    query: torch.Tensor  # [d]
    key: torch.Tensor  # [d]
    product: torch.Tensor  # [d]
    dot: float  # product.sum()
    scale: float
    score: float  # what the softmax sees for this key (the record's scores: scaling, soft-capping, bias)
    scores: torch.Tensor  # [n_k], the whole row
    weights: torch.Tensor  # [n_k], the row's weights (the model's mask applied)


QK_BARS = 64  # keys drawn in the Q·K view's softmax row when there are more


def query_key(record: AttentionRecord, layer: int, head: int, query: int, key: int) -> QueryKey:
    """The anatomy of the score of ``query`` for ``key`` in one head (``record`` of any captured model)."""
    if not (0 <= query < record.n_q and 0 <= key < record.n_k):
        raise ValueError(f"query {query} or key {key} is outside the {record.n_q} x {record.n_k} tokens")
    q = record.queries[layer, head, query].float()  # [d]
    k = record.keys[layer, record.kv_head(head), key].float()  # [d]
    scores = record.scores(layer, query, query + 1, heads=[head])[0, 0]  # [n_k]
    weights = record.head_weights(layer, head, query, query + 1)[0]  # [n_k]
    product = q * k
    return QueryKey(q, k, product, float(product.sum()), float(record.scales[layer]), float(scores[key]), scores,
                    weights)


def query_key_figures(anatomy: QueryKey, record: AttentionRecord, layer: int, head: int, query: int,
                      key: int) -> tuple[go.Figure, go.Figure, str]:
    """The vectors (q, k, q∘k as three rows over the head's dimensions) and the row (scores and weights over the
    keys, the chosen key marked), with a caption that does the arithmetic."""
    from attnviz.viz.charts import bar_chart

    query_label = style.token_label(query, record.query_tokens[query])
    key_label = style.token_label(key, record.key_tokens[key])
    rows = torch.stack([anatomy.query, anatomy.key, anatomy.product])  # [3, d]
    dims = [f"d{i}" for i in range(rows.shape[1])]
    vectors = matrix_heatmap(rows, [f"q · {query_label}", f"k · {key_label}", "q∘k"], dims, kind="signed",
                             title=f"Layer {layer}, head {head}: query {query_label} and key {key_label}",
                             x_title="dimension of the head", y_title="", show_values=False, height=300)
    shown = list(range(record.n_k))
    title = f"The softmax over every key of {query_label}"
    if record.n_k > QK_BARS:  # long inputs: the strongest keys (and the chosen one), in their order
        strongest = set(anatomy.weights.topk(QK_BARS - 1).indices.tolist()) | {key}
        shown = sorted(strongest)
        title = f"The softmax over the keys of {query_label}: the {len(shown)} largest of {record.n_k:,}"
    labels = [style.token_label(j, record.key_tokens[j]) for j in shown]
    row = bar_chart(labels, anatomy.weights[shown].tolist(), title=title, y_title="weight",
                    text=[f"{float(anatomy.weights[j]):.2f}" if j == key else "" for j in shown])
    row.data[0].marker.color = ["#ff7f0e" if j == key else "#1f77b4" for j in shown]
    adjusted = "" if abs(anatomy.score - anatomy.dot * anatomy.scale) < 1e-6 * max(1.0, abs(anatomy.score)) else (
        f", then the model's own adjustments (position bias or soft-capping) make it {anatomy.score:.4g}")
    rank = int((anatomy.weights > anatomy.weights[key]).sum()) + 1
    sinks = record.sinks[layer] if record.sinks else None
    softmax = "The softmax of the row's scores" if sinks is None else (
        f"The softmax of the row's scores and this head's sink logit {float(sinks[head]):.4g} (a column every row "
        f"has, dropped after the softmax: the row keeps {float(anatomy.weights.sum()):.3g} of its weight)")
    caption = (f"q·k = Σ q∘k = {anatomy.dot:.4g}; times the scaling {anatomy.scale:.4g} gives the score "
               f"{anatomy.dot * anatomy.scale:.4g}{adjusted}. {softmax} gives {key_label} the "
               f"weight {float(anatomy.weights[key]):.3g} (rank {rank} of {record.n_k}).")
    return vectors, row, caption


# ---------------------------------------------------------------------------------------------------------------
# Compare two sentences


def _both(token_a: str, token_b: str) -> str:
    return token_a if token_a == token_b else f"{token_a} / {token_b}"


def compare_figures(first: Capture, second: Capture, kind: str, layer: int, head: int) -> tuple[list[go.Figure], str]:
    """The same head on two texts, and their difference where the token lists line up."""
    first.records[kind].check_dense()
    second.records[kind].check_dense()
    figures = []
    for name, capture in (("A", first), ("B", second)):
        record = capture.records[kind]
        matrix = dense_matrix(record.head_weights(layer, head), record.query_tokens, record.key_tokens, how="max")
        matrix = with_segments(matrix, capture, record, list(range(record.n_q)), list(range(record.n_k)))
        figures.append(weights_heatmap(matrix, _pooled_title(f"Text {name}: layer {layer}, head {head}", matrix),
                                       "fixed", width=HALF_WIDTH))
    a, b = first.records[kind], second.records[kind]
    if (a.n_q, a.n_k) == (b.n_q, b.n_k):
        difference = b.head_weights(layer, head) - a.head_weights(layer, head)
        both_q = [_both(x, y) for x, y in zip(a.query_tokens, b.query_tokens, strict=True)]
        both_k = [_both(x, y) for x, y in zip(a.key_tokens, b.key_tokens, strict=True)]
        matrix = dense_matrix(difference, both_q, both_k, how="mean")
        figures.append(
            matrix_heatmap(
                matrix.values, matrix.row_labels, matrix.col_labels, kind="signed",
                title=_pooled_title("Difference B − A (positions line up)", matrix),
                height=_square_height(len(matrix.row_labels)), show_values=matrix.pooled_from is None,
            )
        )
        return figures, "Red: B attends more than A; blue: less. Tokens that differ are shown as 'A / B'."
    return figures, (
        f"The texts have {len(a.query_tokens)} and {len(b.query_tokens)} tokens, so positions do not line up and no "
        "difference is drawn. Change one word at a time (same token count) to see a difference map."
    )


# ---------------------------------------------------------------------------------------------------------------
# What-if: the model's real Q and K under another mask or without scaling


MODEL_OWN_MASK = "model"  # the what-if keeps the model's own mask
WHAT_IF_MASKS = (MODEL_OWN_MASK, "full", "causal", "sliding_window", "bigbird")  # keys of mask_patterns.PATTERNS


def what_if_mask_label(key: str) -> str:
    return "the model's own" if key == MODEL_OWN_MASK else mask_patterns.label(key)


def what_if_mask(key: str, n_q: int, n_k: int, **params) -> torch.Tensor | None:
    """The replacement mask ``[n_q, n_k]`` (bool, True = may attend), or None for the model's own."""
    if key == MODEL_OWN_MASK:
        return None
    if key not in WHAT_IF_MASKS:
        raise ValueError(f"unknown what-if mask {key!r}; choose one of {WHAT_IF_MASKS}")
    return mask_patterns.build(key, n_q, n_k, **params).mask


def what_if(
    record: AttentionRecord, layer: int, mask: torch.Tensor | None, *, unscaled: bool, temperature: float = 1.0
):
    """Heads of ``layer`` before (the model) and after (our replay with another mask / scale / temperature), each
    ``[heads, n_q, n_k]``. ``mask`` is bool (True = may attend), or None for the model's own."""
    record.check_dense()
    after = record.layer_weights(layer, mask=mask, scale=1.0 if unscaled else None, temperature=temperature)
    return record.weights[layer], after


@dataclass
class WhatIfEffect:
    """What a what-if did to one layer, in numbers for its caption."""

    largest_change: float  # max |after - before| over every head and cell
    gained_on_blocked: float  # mean share of each row the rule moved onto keys the model's own mask blocked
    lost_to_rule: float  # mean share of each row the model had on keys the rule blocks
    scale_is_one: bool  # the model applies no 1/sqrt(d_k) here (T5): removing it changes nothing


def what_if_effect(record: AttentionRecord, layer: int, before: torch.Tensor, after: torch.Tensor,
                   mask: torch.Tensor | None) -> WhatIfEffect:
    blocked_by_model = ~record.allowed[layer]  # [n_q, n_k]
    blocked_by_rule = torch.zeros_like(blocked_by_model) if mask is None else ~mask
    return WhatIfEffect(
        largest_change=(after - before).abs().amax().item(),
        gained_on_blocked=float((after * blocked_by_model).sum(-1).mean()),
        lost_to_rule=float((before * blocked_by_rule).sum(-1).mean()),
        scale_is_one=abs(record.scales[layer] - 1.0) < 1e-12,
    )


def what_if_caption(effect: WhatIfEffect, unscaled: bool, temperature: float = 1.0) -> str:
    """The after-panel's caption: what moved, in the numbers of this layer (never a claim the numbers deny)."""
    parts = []
    if effect.lost_to_rule > 0:
        parts.append(f"keys your rule blocks lose their weight ({effect.lost_to_rule:.1%} of each row on average) and "
                     "the rest is renormalised")
    if effect.gained_on_blocked > 0:
        parts.append(f"keys the model's own mask blocked (the future, in a decoder) now take "
                     f"{effect.gained_on_blocked:.1%} of each row: this is not something the model ever did")
    if unscaled and effect.scale_is_one:
        parts.append("this model applies no 1/√d_k here (T5 folds it into its weights), so removing it changes "
                     "nothing")
    elif unscaled:
        parts.append("without the 1/√d_k the logits grow and the softmax sharpens")
    if temperature != 1.0:
        parts.append(f"T = {temperature:g} divides every logit, so the softmax "
                     + ("flattens" if temperature > 1 else "sharpens"))
    if not parts:
        return "The same rule as the model's: nothing moves."
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."


# ---------------------------------------------------------------------------------------------------------------
# Export


def figure_html(figure: go.Figure) -> str:
    """A self-contained HTML file: plotly.js is inlined, so it opens offline."""
    return figure.to_html(include_plotlyjs=True, full_html=True)


def capture_npz(capture: Capture) -> bytes:
    """All captured tensors as .npz, fp32: ``{kind}_queries``, ``{kind}_keys``, ``{kind}_values`` and the tokens,
    and ``{kind}_weights`` (every layer and head) for inputs of at most DENSE_LIMIT tokens."""
    arrays = {"tokens": np.array(capture.tokens, dtype=object).astype(str)}
    for kind, record in capture.records.items():
        if record.dense_ok:
            arrays[f"{kind}_weights"] = record.weights.numpy()
        for name in ("queries", "keys", "values"):
            arrays[f"{kind}_{name}"] = getattr(record, name).float().numpy()
        arrays[f"{kind}_query_tokens"] = np.array(record.query_tokens).astype(str)
        arrays[f"{kind}_key_tokens"] = np.array(record.key_tokens).astype(str)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def matrix_csv(matrix: Matrix) -> str:
    """What a heatmap shows, as CSV: the rows and columns labelled as on screen (pooled cells by their ranges)."""
    return pd.DataFrame(matrix.values.numpy(), index=matrix.row_labels, columns=matrix.col_labels).to_csv()


def matrix_json(capture: Capture, options: ViewOptions, matrix: Matrix) -> str:
    return json.dumps(
        {
            "model": capture.model_name,
            "text": capture.text,
            "text_pair": capture.text_pair,
            "kind": options.kind,
            "layer": options.layer,
            "head": options.head if options.view != "average" else "average",
            "filters": filter_note(options).strip(" ()") or "none",
            "colour": SCALES[options.scale],
            "pooled_from": matrix.pooled_from,
            "pooling": options.pooling if matrix.pooled_from else None,
            "zoom_window": matrix.window,
            "query_labels": matrix.row_labels,
            "key_labels": matrix.col_labels,
            "values": matrix.values.tolist(),
        }
    )


def shown_matrix(capture: Capture, options: ViewOptions, zoomed: bool = False) -> Matrix:
    """The matrix the head (or average) view shows with these options, or its zoom window."""
    record = capture.records[options.kind]
    heads, _ = _views_heads(record, options)
    return (zoom_matrix if zoomed else head_matrix)(capture, record, options, heads)


# ---------------------------------------------------------------------------------------------------------------
# bertviz (online only: its page loads require.js, d3 and jQuery from a CDN)


def _inert_token(token: str) -> str:
    # bertviz writes tokens into a <script> with json.dumps, which leaves "</script>" intact: a typed or linked
    # sentence must not be able to inject markup, so angle brackets and ampersands become look-alikes.
    return token.replace("&", "＆").replace("<", "‹").replace(">", "›")


def bertviz_html(capture: Capture, kind: str, which: str) -> str:
    """bertviz's head view or model view for a captured attention kind, as an HTML string."""
    from bertviz import head_view, model_view

    record = capture.records[kind]
    attention = tuple(record.weights[layer].unsqueeze(0) for layer in range(record.n_layers))  # [1, heads, n, n] each
    tokens = [_inert_token(t) for t in record.key_tokens]
    if record.query_tokens != record.key_tokens:
        raise ValueError("bertviz shows self-attention; choose encoder or decoder attention")
    view = head_view if which == "head view" else model_view
    return BERTVIZ_OFFLINE_CHECK + view(attention, tokens, html_action="return").data


BERTVIZ_WAIT_MS = 6000  # how long bertviz gets to load its scripts from the CDN and draw
# bertviz's page fetches require.js, d3 and jQuery from a CDN: offline it draws nothing but an empty "Layer:"
# dropdown. This note, inside its frame, appears when nothing was drawn after BERTVIZ_WAIT_MS.
BERTVIZ_OFFLINE_CHECK = f"""
<div id="attnviz-bertviz-offline" style="display:none; font-family: sans-serif; padding: 12px; margin-bottom: 8px;
 background: #fff4e5; border: 1px solid #f0b46c; border-radius: 6px; color: #5c3b00;">
<b>bertviz did not load.</b> Its scripts (require.js, d3, jQuery) come from a CDN and could not be fetched: this
machine seems to be offline. Every other view of attnviz works offline: the Head, Grid and Lines views show the
same weights.
</div>
<script>
setTimeout(function () {{
  var drawn = document.querySelector('svg');
  if (typeof window.require === 'undefined' || !drawn) {{  // d3 and jQuery load as AMD modules, not globals
    document.getElementById('attnviz-bertviz-offline').style.display = 'block';
  }}
}}, {BERTVIZ_WAIT_MS});
</script>
"""


# ---------------------------------------------------------------------------------------------------------------
# Long texts that ship with Python, for trying long inputs offline


SAMPLE_TOPICS = ("if", "while", "for", "try", "with", "function", "class", "assignment", "import", "exceptions",
                 "execmodel", "naming", "types", "datamodel", "specialnames", "numbers", "sequence-types",
                 "typesseq", "typesmapping", "formatstrings")


def sample_text() -> str:
    """English prose from Python's own documentation (``pydoc_data.topics``, shipped with every Python): about
    120,000 words, enough for any length a model reads."""
    from pydoc_data.topics import topics

    chosen = [topics[name] for name in SAMPLE_TOPICS if name in topics]
    rest = [text for name, text in sorted(topics.items()) if name not in SAMPLE_TOPICS]
    return "\n\n".join(chosen + rest)
