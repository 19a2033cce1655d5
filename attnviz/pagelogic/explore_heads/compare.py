"""The Compare tab: the same head on two texts, and their difference where the token lists line up."""

from __future__ import annotations

import plotly.graph_objects as go

from attnviz.models.record import Capture
from attnviz.pagelogic.explore_heads.matrices import dense_matrix, head_heatmap, pooled_title, square_height
from attnviz.viz.matrix import HALF_WIDTH, SIGNED, matrix_heatmap


def _both(token_a: str, token_b: str) -> str:
    return token_a if token_a == token_b else f"{token_a} / {token_b}"


def compare_figures(first: Capture, second: Capture, kind: str, layer: int, head: int) -> tuple[list[go.Figure], str]:
    """The same head on two texts, and their difference where the token lists line up."""
    first.records[kind].check_dense()
    second.records[kind].check_dense()
    figures = []
    for name, capture in (("A", first), ("B", second)):
        record = capture.records[kind]
        figures.append(head_heatmap(capture, record, record.head_weights(layer, head),
                                    f"Text {name}: layer {layer}, head {head}", width=HALF_WIDTH))
    a, b = first.records[kind], second.records[kind]
    if (a.n_q, a.n_k) == (b.n_q, b.n_k):
        difference = b.head_weights(layer, head) - a.head_weights(layer, head)
        both_q = [_both(x, y) for x, y in zip(a.query_display, b.query_display, strict=True)]
        both_k = [_both(x, y) for x, y in zip(a.key_display, b.key_display, strict=True)]
        matrix = dense_matrix(difference, both_q, both_k, how="mean")
        figures.append(
            matrix_heatmap(
                matrix.values, matrix.row_labels, matrix.col_labels, scale=SIGNED,
                title=pooled_title("Difference B − A (positions line up)", matrix),
                height=square_height(len(matrix.row_labels)), show_values=matrix.pooled_from is None,
            )
        )
        return figures, "Red: B attends more than A; blue: less. Tokens that differ are shown as 'A / B'."
    return figures, (
        f"The texts have {len(a.query_tokens)} and {len(b.query_tokens)} tokens, so positions do not line up and no "
        "difference is drawn. Change one word at a time (same token count) to see a difference map."
    )
