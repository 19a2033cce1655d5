"""What the Explore heads page is set to (:class:`ViewOptions`), and the filters every tab applies: special
tokens hidden, a sentence block of a pair, rows renormalised."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from attnviz.core import analysis
from attnviz.models.record import AttentionRecord, Capture
from attnviz.viz import style

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
SCALES = {  # colour scales of a weights heatmap: how the title says it
    "fixed": "weights on 0–1",
    "head": "scaled to this head's maximum",
    "row": "each row scaled to its maximum",
    "log": "log10 of the weights",
}
LONG_TEXT = 300  # tokens a side: above this a row's weights are mostly near 0, and on 0–1 a head looks blank


def automatic_scale(n_q: int, n_k: int) -> str:
    """The colour scale a head view opens on: weights on 0–1 (heads comparable) up to :data:`LONG_TEXT` tokens a
    side; above, each row to its maximum, which shows the structure a 0–1 scale hides in near-zero weights."""
    return "row" if max(n_q, n_k) > LONG_TEXT else "fixed"


def automatic_scale_note(n_q: int, n_k: int) -> str:
    """What the page says when the automatic scale stretched the rows (empty when it did not)."""
    if automatic_scale(n_q, n_k) == "fixed":
        return ""
    return (f"Colour: each row scaled to its maximum, chosen automatically because the text has "
            f"{max(n_q, n_k):,} tokens: spread over that many keys most weights are near 0, and on 0–1 the head would "
            "look blank. Choose **weights on 0–1** under Colour to compare heads' absolute weights.")


GRID_SCALES = {  # the grid's thumbnails: the same 0–1 as the head view, or each head to its own maximum
    "head": "each head scaled to its maximum",
    "fixed": "weights on 0–1",
}


@dataclass
class ViewOptions:
    """Every choice of the page that changes what a view draws (one value per widget)."""

    kind: str = "self"
    layer: int = 0
    head: int = 0
    view: str = "head"
    hide_special: bool = False
    renormalise: bool = True
    block: str = "all"
    follow: list[int] = field(default_factory=list)
    line_heads: list[int] | None = None
    pooling: str = "max"  # for inputs longer than matrices.POOL_LIMIT: max or mean of each cell's weights
    scale: str = "fixed"  # a key of SCALES
    automatic_scale: bool = False  # the scale was chosen by the text's length (automatic_scale), not by the user
    grid_scale: str = "head"  # a key of GRID_SCALES
    top_k: int | None = None  # the lines view: only each query's strongest keys
    lines_start: int = 0  # the lines view on a long text: the first of the window of queries drawn
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


class Filtered(NamedTuple):
    """Weights after the filters, with the labels and positions of the rows and columns kept."""

    weights: torch.Tensor  # [..., kept queries, kept keys]
    query_labels: list[str]
    key_labels: list[str]
    query_positions: list[int]
    key_positions: list[int]


def filtered(weights: torch.Tensor, capture: Capture, record: AttentionRecord, options: ViewOptions) -> Filtered:
    """Apply the filters to ``[..., n_q, n_k]`` weights: the kept rows and columns, renormalised if asked."""
    query_positions, key_positions = positions(capture, record, options)
    subset = analysis.keep_tokens(weights, query_positions, key_positions, options.renormalises)
    query_labels = style.token_labels([record.query_display[i] for i in query_positions], query_positions)
    key_labels = style.token_labels([record.key_display[j] for j in key_positions], key_positions)
    return Filtered(subset, query_labels, key_labels, query_positions, key_positions)


def filter_note(options: ViewOptions) -> str:
    """What the filters did, for a title: " (special tokens hidden; ...)", or "" when none is on."""
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
