"""The grid view: every head of every layer as a thumbnail, pooled by mean, labelled from the head statistics."""

from __future__ import annotations

import torch

from attnviz.core import analysis
from attnviz.models.record import AttentionRecord, Capture
from attnviz.pagelogic.explore_heads.matrices import stream_rows
from attnviz.pagelogic.explore_heads.options import GRID_SCALES, ViewOptions, positions
from attnviz.pagelogic.explore_heads.statistics import statistics_table
from attnviz.viz.heads import head_grid

THUMBNAIL = 24  # cells a side of a grid thumbnail
GRID_NOTES_LIMIT = 2048  # tokens: up to this length the grid's hover and badges carry each head's statistics
BADGES = {"previous-token head": "prev", "next-token head": "next", "self head": "self",
          "first-token head": "first", "delimiter head": "delim", "punctuation head": "punct", "broad head": "broad"}


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
        for ranks, weights in stream_rows(record, layer, heads, query_positions, key_positions, renormalise,
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


def labels_heads(record: AttentionRecord) -> bool:
    """Whether the grid labels each head from the head statistics: self-attention up to GRID_NOTES_LIMIT tokens
    (longer, the Head statistics tab computes them)."""
    return record.n_q == record.n_k <= GRID_NOTES_LIMIT


def grid_notes(capture: Capture, kind: str) -> tuple[list[list[str]], list[list[str]]] | None:
    """Per head, what the grid's hover says (label, entropy, top key) and its badge (a short label); None where
    the grid does not label heads (:func:`labels_heads`)."""
    record = capture.records[kind]
    if not labels_heads(record):
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


def grid_view(capture: Capture, record: AttentionRecord, options: ViewOptions, kind_name: str, note: str):
    """The grid view's figure and caption (a builder of views.VIEW_BUILDERS)."""
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
