"""The Export tab: the figure as self-contained HTML, the numbers a heatmap shows as CSV or JSON, and every
captured tensor as .npz."""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attnviz.models.record import Capture
from attnviz.pagelogic.explore_heads.matrices import Matrix, head_matrix, zoom_matrix
from attnviz.pagelogic.explore_heads.options import SCALES, ViewOptions, filter_note
from attnviz.pagelogic.explore_heads.views import shown_heads


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
    """What a heatmap shows, as JSON: its values and labels, with the model, the texts and the view's settings."""
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
    heads, _ = shown_heads(record, options)
    return (zoom_matrix if zoomed else head_matrix)(capture, record, options, heads)
