"""The weights matrix a heatmap draws (:class:`Matrix`): streamed block by block of query rows, pooled above
POOL_LIMIT tokens a side, zoomed to exact values, put on the chosen colour scale, and titled."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import plotly.graph_objects as go
import torch

from attnviz.core import analysis
from attnviz.core.tokens_display import piece_note
from attnviz.models.record import AttentionRecord, Capture
from attnviz.pagelogic.explore_heads.options import SCALES, ViewOptions, positions
from attnviz.viz import style
from attnviz.viz.matrix import FULL_WIDTH, WEIGHTS, WEIGHTS_LOG, WEIGHTS_PER_HEAD, WEIGHTS_PER_ROW, matrix_heatmap

POOL_LIMIT = 256  # cells a side drawn as they are; longer inputs are pooled to this many cells, with a zoom
ZOOM_SIZES = (32, 64, 128, 256)


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
    # The token positions each row and column covers, (first, last): one token, or a pooled cell's range. Exports
    # read the tokenizer's raw pieces and ids at these positions.
    row_spans: list[tuple[int, int]] | None = None
    col_spans: list[tuple[int, int]] | None = None


def scale_rows(weights: torch.Tensor, scale: str) -> torch.Tensor:
    """Row scaling happens before pooling (each query's own structure), log after (see scale_matrix)."""
    if scale == "row":
        return weights / weights.amax(-1, keepdim=True).clamp_min(1e-30)
    return weights


def scale_matrix(values: torch.Tensor, scale: str) -> torch.Tensor:
    """After pooling: "head" divides by the matrix's maximum. On the log scale a zero weight (a masked key) has no
    logarithm: it is left out (drawn grey), so the colour range spans the weights that exist."""
    if scale == "head":
        return values / values.max().clamp_min(1e-30) if values.numel() else values
    if scale != "log":
        return values
    return torch.where(values > 0, torch.log10(values.clamp_min(1e-30)), torch.full_like(values, float("nan")))


def stream_rows(record: AttentionRecord, layer: int, heads: list[int], query_positions: list[int],
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
        yield rank[start:end][rows], scale_rows(weights, scale)


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
    for ranks, weights in stream_rows(record, options.layer, heads, query_positions, key_positions, renormalise,
                                       options.scale):
        pooler.add(weights.mean(0), row_cells[ranks])  # the mean over heads (one head: itself)
        total += float(weights.sum())
    values = scale_matrix(pooler.result(), options.scale)
    matrix = labelled(values, record.query_display, record.key_display, query_positions, key_positions, pooled)
    matrix.empty = total == 0
    return with_segments(matrix, capture, record, query_positions, key_positions)


def zoom_window(kept: list[int], start_position: int, size: int) -> tuple[int, int]:
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
    q0, q1 = zoom_window(query_positions, options.zoom_query, options.zoom_size)
    k0, k1 = zoom_window(key_positions, options.zoom_key, options.zoom_size)
    rows = query_positions[q0:q1]
    parts = []
    for _, weights in stream_rows(record, options.layer, heads, rows, key_positions, renormalise, options.scale):
        parts.append(weights.mean(0)[:, k0:k1])
    values = scale_matrix(torch.cat(parts), options.scale)
    window_keys = key_positions[k0:k1]
    matrix = labelled(values, record.query_display, record.key_display, rows, window_keys, pooled=False)
    matrix.window = (rows[0], window_keys[0], len(rows), len(window_keys))
    return with_segments(matrix, capture, record, rows, window_keys)


def dense_matrix(values: torch.Tensor, query_tokens: list[str], key_tokens: list[str],
                 query_positions: list[int] | None = None, key_positions: list[int] | None = None,
                 how: str = "mean") -> Matrix:
    """A matrix already in memory (rollout, what-if, compare), drawn like the head view: as it is up to POOL_LIMIT
    a side, else pooled (signed values by mean, so + and - do not cancel into the max). ``query_tokens`` and
    ``key_tokens`` are the tokens as the labels show them (a record's ``query_display`` / ``key_display``)."""
    query_positions = list(range(values.shape[0])) if query_positions is None else query_positions
    key_positions = list(range(values.shape[1])) if key_positions is None else key_positions
    n_rows, n_cols = values.shape
    if n_rows <= POOL_LIMIT and n_cols <= POOL_LIMIT:
        return labelled(values, query_tokens, key_tokens, query_positions, key_positions, pooled=False)
    row_cells, col_cells = analysis.bins(n_rows, POOL_LIMIT), analysis.bins(n_cols, POOL_LIMIT)
    pooler = analysis.Pooler((), int(row_cells[-1]) + 1, col_cells, how)
    pooler.add(values.float(), row_cells)
    return labelled(pooler.result(), query_tokens, key_tokens, query_positions, key_positions, pooled=True)


def labelled(values: torch.Tensor, query_tokens: list[str], key_tokens: list[str], query_positions: list[int],
             key_positions: list[int], pooled: bool) -> Matrix:
    """A :class:`Matrix` of ``values`` with its labels and spans: one per kept token, or per pooled cell."""
    row_spans, col_spans = spans(query_positions, pooled), spans(key_positions, pooled)
    return Matrix(values, span_labels(query_tokens, row_spans), span_labels(key_tokens, col_spans),
                  pooled_from=(len(query_positions), len(key_positions)) if pooled else None,
                  row_spans=row_spans, col_spans=col_spans)


def spans(kept: list[int], pooled: bool) -> list[tuple[int, int]]:
    """The token positions each row (or column) covers, (first, last): one kept token each, or when ``pooled`` the
    kept tokens of each of the POOL_LIMIT cells."""
    if not pooled:
        return [(position, position) for position in kept]
    return [(kept[first], kept[last]) for first, last in analysis.bin_edges(len(kept), POOL_LIMIT)]


def span_labels(tokens: list[str], cells: list[tuple[int, int]]) -> list[str]:
    """One label per row or column: ``"3 · ␣the"`` for one token, ``"12–19 · ␣the"`` (the positions and the first
    token) for a pooled cell."""
    return [style.token_label(start, tokens[start]) if start == end else f"{start}–{end} · {tokens[start][:10]}"
            for start, end in cells]


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


def pooled_title(base: str, matrix: Matrix) -> str:
    """``base``, and under it how the cells were pooled when they were."""
    if not matrix.pooled_from:
        return base
    rows, cols = matrix.pooled_from
    return f"{base}<br><sup>{rows:,} x {cols:,} pooled to {len(matrix.row_labels)} x {len(matrix.col_labels)}</sup>"


def matrix_title(base: str, matrix: Matrix, options: ViewOptions) -> str:
    """``base``, and under it how the cells were pooled, the zoom window and the colour scale (where not 0–1)."""
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


# The heatmap's colour scale for each key of SCALES (the values arrive divided by a maximum, or as log10).
COLOUR_SCALES = {"fixed": WEIGHTS, "head": WEIGHTS_PER_HEAD, "row": WEIGHTS_PER_ROW, "log": WEIGHTS_LOG}


def weights_heatmap(matrix: Matrix, title: str, scale: str, height: int | None = None,
                    width: int = FULL_WIDTH, notes: tuple[list | None, list | None] = (None, None)) -> go.Figure:
    """The heatmap of ``matrix`` on the colour ``scale`` (a key of SCALES): values printed when not pooled.
    ``notes``: what the hover adds to each row's and column's label (:func:`span_notes`)."""
    return matrix_heatmap(matrix.values, matrix.row_labels, matrix.col_labels, title=title, scale=COLOUR_SCALES[scale],
                          height=height or square_height(len(matrix.row_labels)), width=width,
                          show_values=matrix.pooled_from is None, row_segments=matrix.row_segments,
                          col_segments=matrix.col_segments, row_notes=notes[0], col_notes=notes[1])


def piece_notes(capture: Capture, tokens: list[str], positions: list[int]) -> list[str] | None:
    """What the hover of each token at ``positions`` adds: the tokenizer's raw piece and its id
    (:func:`attnviz.core.tokens_display.piece_note`); None when there is nothing to add (no ids, tokens shown as
    written: an image's patches)."""
    shown, ids = capture.display_of(tokens), capture.ids_of(tokens)
    if ids is None and shown is tokens:
        return None
    return [piece_note(tokens[p], None if ids is None else ids[p]) for p in positions]


def span_notes(capture: Capture, record: AttentionRecord, matrix: Matrix) -> tuple[list | None, list | None]:
    """What the hover adds to each row's and column's label of ``matrix``: a single token's :func:`piece_notes`
    (only the id where the piece reads as it is shown, as WordPiece's do), nothing for a pooled cell (its label
    names its positions)."""

    def notes(tokens: list[str], spans: list[tuple[int, int]] | None) -> list | None:
        firsts = None if spans is None else [first for first, _ in spans]
        full = None if firsts is None else piece_notes(capture, tokens, firsts)
        if full is None:
            return None
        shown, ids = capture.display_of(tokens), capture.ids_of(tokens)
        return [None if first != last else
                (f"id {ids[first]}" if ids is not None else None) if shown[first] == tokens[first] else note
                for (first, last), note in zip(spans, full, strict=True)]

    return notes(record.query_tokens, matrix.row_spans), notes(record.key_tokens, matrix.col_spans)


def head_heatmap(capture: Capture, record: AttentionRecord, weights: torch.Tensor, title: str,
                 width: int = FULL_WIDTH) -> go.Figure:
    """One head's whole ``[n_q, n_k]`` weights on 0–1 (compare, what-if): pooled by max above POOL_LIMIT a side
    (the title says so), sentence B marked."""
    matrix = dense_matrix(weights, record.query_display, record.key_display, how="max")
    matrix = with_segments(matrix, capture, record, list(range(record.n_q)), list(range(record.n_k)))
    return weights_heatmap(matrix, pooled_title(title, matrix), "fixed", width=width)


def square_height(n: int) -> int:
    """Pixels high for a heatmap of ``n`` rows: about square, within a screen."""
    return int(min(950, max(320, 120 + 24 * n)))
