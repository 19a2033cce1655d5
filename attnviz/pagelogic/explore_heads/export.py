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
    """All captured tensors as .npz, fp32: ``{kind}_queries``, ``{kind}_keys``, ``{kind}_values`` and the tokens
    (the tokenizer's raw pieces, ``token_ids`` their ids, ``display_tokens`` as the pages show them), and
    ``{kind}_weights`` (every layer and head) for inputs of at most DENSE_LIMIT tokens."""
    arrays = {"tokens": np.array(capture.tokens, dtype=object).astype(str),
              "display_tokens": np.array(capture.display_tokens, dtype=object).astype(str)}
    if capture.token_ids is not None:
        arrays["token_ids"] = np.array(capture.token_ids, dtype=np.int64)
    if capture.decoder_token_ids is not None:
        arrays["decoder_token_ids"] = np.array(capture.decoder_token_ids, dtype=np.int64)
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


def raw_labels(tokens: list[str], spans: list[tuple[int, int]]) -> list[str]:
    """Labels by position and the tokenizer's own piece, as it writes it (``"3 · Ġthe"``, ``"12–19 · Ġthe"`` for a
    pooled cell): what an export keeps, so it can be matched with the tokenizer."""
    return [f"{start} · {tokens[start]}" if start == end else f"{start}–{end} · {tokens[start]}"
            for start, end in spans]


def matrix_csv(matrix: Matrix, capture: Capture | None = None, kind: str = "self") -> str:
    """What a heatmap shows, as CSV. With the ``capture`` (and the attention ``kind``) it was made from, rows and
    columns are labelled by position and the tokenizer's raw piece (``"3 · Ġthe"``; pooled cells by their ranges);
    without, as on screen."""
    rows, columns = matrix.row_labels, matrix.col_labels
    if capture is not None and matrix.row_spans is not None and matrix.col_spans is not None:
        record = capture.records[kind]
        rows, columns = raw_labels(record.query_tokens, matrix.row_spans), raw_labels(record.key_tokens,
                                                                                        matrix.col_spans)
    return pd.DataFrame(matrix.values.numpy(), index=rows, columns=columns).to_csv()


def _tokens_of(capture: Capture, tokens: list[str], spans: list[tuple[int, int]] | None) -> dict:
    """Each row's (or column's) positions (first, last), and the tokenizer's raw piece and id at the first."""
    if spans is None:
        return {}
    ids = capture.ids_of(tokens)
    return {"positions": [list(span) for span in spans], "tokens": [tokens[start] for start, _ in spans],
            "ids": None if ids is None else [ids[start] for start, _ in spans]}


def matrix_json(capture: Capture, options: ViewOptions, matrix: Matrix) -> str:
    """What a heatmap shows, as JSON: its values and labels (as on screen), the tokenizer's raw pieces and ids of
    its rows and columns (``query_tokens``, ``query_ids``, ``query_positions``: the first and last position a row
    covers; the same for keys), with the model, the texts and the view's settings."""
    record = capture.records[options.kind]
    rows = _tokens_of(capture, record.query_tokens, matrix.row_spans)
    columns = _tokens_of(capture, record.key_tokens, matrix.col_spans)
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
            **{f"query_{name}": value for name, value in rows.items()},
            **{f"key_{name}": value for name, value in columns.items()},
            "values": matrix.values.tolist(),
        }
    )


def shown_matrix(capture: Capture, options: ViewOptions, zoomed: bool = False) -> Matrix:
    """The matrix the head (or average) view shows with these options, or its zoom window."""
    record = capture.records[options.kind]
    heads, _ = shown_heads(record, options)
    return (zoom_matrix if zoomed else head_matrix)(capture, record, options, heads)
