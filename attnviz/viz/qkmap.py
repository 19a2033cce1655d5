"""Figures of the "Queries and keys" page: one head's queries and keys as points of one picture (2D or 3D), with
lines from a chosen query to the keys it attends to most, and every head of a layer as small pictures to click.
``points`` are :class:`attnviz.pagelogic.qkmap.HeadPoints` (read by attribute: viz imports the core only).
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.viz import style

QUERY_COLOR, KEY_COLOR = "#d62728", "#1f77b4"
COLOURINGS = ("query or key", "position", "document")
def _rounded(values) -> np.ndarray:
    """Coordinates as float32 arrays: Plotly sends them as typed arrays (4 bytes a number, not a decimal string),
    so a figure of tens of thousands of points stays under 2 MB."""
    return np.asarray(values, dtype=np.float32)


def _hover(points, which: str) -> list[str]:
    tokens = points.query_tokens if which == "query" else points.key_tokens
    positions = points.query_positions if which == "query" else points.key_positions
    documents = points.query_documents if which == "query" else points.key_documents
    several = len(points.documents) > 1
    return [f"{which} {position}: {style.plotly_text(token)}" + (f"<br>document {document}" if several else "")
            for token, position, document in zip(tokens, positions, documents, strict=True)]


def head_scatter(points, coordinates, *, title: str, colour: str = "query or key",
                 selected_query: int | None = None, strongest: int = 3, height: int = 560,
                 found: str = "") -> go.Figure:
    """Queries then keys (``coordinates`` ``[n_q + n_k, 2 or 3]``) as points: queries round, keys diamonds;
    coloured by kind, by position or by document. With ``selected_query``: lines from it to the ``strongest``
    keys it attends to, their weights on the lines' hover. ``found``: the queries and keys whose token contains it
    (ignoring case and the tokenizer's space marks) are ringed. Each point's customdata: (0 query / 1 key,
    index)."""
    coordinates = np.asarray(coordinates, dtype=np.float64)
    dims = coordinates.shape[1]
    n_q = len(points.queries)
    parts = {"query": (coordinates[:n_q], points.query_positions, points.query_documents, "circle", QUERY_COLOR),
             "key": (coordinates[n_q:], points.key_positions, points.key_documents, "diamond", KEY_COLOR)}
    figure = go.Figure()
    for kind, (xyz, positions, documents, symbol, plain) in parts.items():
        if colour == "position":
            colours = dict(color=np.asarray(positions, np.int32), colorscale=style.PLAIN_COLORSCALE,
                           showscale=kind == "query",
                           colorbar=dict(title="position", thickness=12))
        elif colour == "document":
            colours = dict(color=np.asarray(documents, np.int32), colorscale="Turbo", showscale=False)
        else:
            colours = dict(color=plain)
        marker = dict(symbol=symbol if dims == 2 else ("circle" if kind == "query" else "diamond"),
                      size=7 if dims == 2 else 3, opacity=0.8, line=dict(width=0), **colours)
        common = dict(mode="markers", name="queries" if kind == "query" else "keys", marker=marker,
                      text=_hover(points, kind),
                      hovertemplate="%{text}<extra></extra>",
                      customdata=np.stack([np.full(len(xyz), 0 if kind == "query" else 1), np.arange(len(xyz))],
                                          1).astype(np.int32))
        if dims == 2:
            figure.add_trace(go.Scattergl(x=_rounded(xyz[:, 0]), y=_rounded(xyz[:, 1]), **common))
        else:
            figure.add_trace(go.Scatter3d(x=_rounded(xyz[:, 0]), y=_rounded(xyz[:, 1]), z=_rounded(xyz[:, 2]),
                                          **common))
    if found.strip():
        _ring_found(figure, points, coordinates, found.strip().lower())
    if selected_query is not None and 0 <= selected_query < n_q:
        _lines_to_strongest(figure, points, coordinates, selected_query, strongest)
    layout = dict(title=dict(text=title), height=height, margin=dict(l=10, r=10, t=60, b=10),
                  legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"),
                  font=dict(family=style.FONT_FAMILY))
    if dims == 2:
        figure.update_layout(**layout, xaxis=dict(showticklabels=False, zeroline=False, title=""),
                             yaxis=dict(showticklabels=False, zeroline=False, title="", scaleanchor="x"),
                             dragmode="pan")
    else:
        hidden = dict(showticklabels=False, title="")
        figure.update_layout(**layout, scene=dict(xaxis=hidden, yaxis=hidden, zaxis=hidden))
    return figure


def matches(tokens: list[str], found: str) -> list[int]:
    """The positions of the tokens that contain ``found`` (lower case), their space marks left out."""
    return [index for index, token in enumerate(tokens) if found in token.lower().lstrip("Ġ▁␣ ")]


def _ring_found(figure: go.Figure, points, coordinates: np.ndarray, found: str) -> None:
    n_q = len(points.queries)
    chosen = [index for index in matches(points.query_tokens, found)]
    chosen += [n_q + index for index in matches(points.key_tokens, found)]
    if not chosen:
        return
    xyz = coordinates[chosen]
    marker = dict(symbol="circle-open", size=14, color="#111111", line=dict(width=2))
    common = dict(mode="markers", name=f"“{found}” ({len(chosen)})", marker=marker, hoverinfo="skip")
    if coordinates.shape[1] == 2:
        figure.add_trace(go.Scattergl(x=_rounded(xyz[:, 0]), y=_rounded(xyz[:, 1]), **common))
    else:
        figure.add_trace(go.Scatter3d(x=_rounded(xyz[:, 0]), y=_rounded(xyz[:, 1]), z=_rounded(xyz[:, 2]), **common))


def _lines_to_strongest(figure: go.Figure, points, coordinates: np.ndarray, query: int,
                        strongest: int) -> None:
    document = next(d for d in points.documents if query in d.queries)
    local = query - document.queries.start
    weights = document.weights[local]
    order = weights.argsort(descending=True)[:strongest].tolist()
    n_q = len(points.queries)
    dims = coordinates.shape[1]
    start = coordinates[query]
    for rank, key in enumerate(order):
        end = coordinates[n_q + document.keys.start + key]
        segment = np.stack([start, end])
        hover = (f"query {points.query_positions[query]} → key {key}: "
                 f"{style.plotly_text(points.key_tokens[document.keys.start + key])}, weight {float(weights[key]):.3f}")
        line = dict(color="#333333", width=max(1.0, 6 * float(weights[key])))
        common = dict(mode="lines", line=line, hovertemplate=f"{hover}<extra></extra>", showlegend=rank == 0,
                      name=f"strongest {strongest} keys")
        if dims == 2:
            figure.add_trace(go.Scatter(x=_rounded(segment[:, 0]), y=_rounded(segment[:, 1]), **common))
        else:
            figure.add_trace(go.Scatter3d(x=_rounded(segment[:, 0]), y=_rounded(segment[:, 1]),
                                          z=_rounded(segment[:, 2]), **common))


GRID_POINTS = 1_500  # queries (and as many keys) drawn per small picture: enough to see its shape, and 72 of them
# stay under 2 MB


def layer_grid(pictures: list[tuple], trusts: list[float], *, title: str, columns: int = 6,
               labels: list[str] | None = None, cells: list[tuple[int, int]] | None = None) -> go.Figure:
    """Small 2D pictures of heads (queries red, keys blue), each titled with its label (default ``head h``) and the
    share of its queries whose strongest key is their nearest; each point's customdata is its (layer, head) in
    ``cells`` (default (0, h)), for a click to choose it. At most GRID_POINTS queries and keys each are drawn per
    picture, evenly spaced."""
    labels = labels or [f"head {h}" for h in range(len(pictures))]
    cells = cells or [(0, h) for h in range(len(pictures))]
    rows = -(-len(pictures) // columns)
    figure = make_subplots(rows=rows, cols=columns, horizontal_spacing=0.02, vertical_spacing=0.3 / max(rows, 1),
                           subplot_titles=[f"{label} · {trust:.0%}" for label, trust in zip(labels, trusts,
                                                                                             strict=True)])
    for index, (points, coordinates) in enumerate(pictures):
        coordinates = np.asarray(coordinates, dtype=np.float64)
        n_q = len(points.queries)
        for part, colour in ((coordinates[:n_q], QUERY_COLOR), (coordinates[n_q:], KEY_COLOR)):
            part = part[np.linspace(0, len(part) - 1, min(len(part), GRID_POINTS)).astype(int)] if len(part) else part
            figure.add_trace(go.Scattergl(
                x=_rounded(part[:, 0]), y=_rounded(part[:, 1]), mode="markers", showlegend=False,
                marker=dict(color=colour, size=3, opacity=0.7),
                customdata=np.tile(np.asarray(cells[index], np.int16), (len(part), 1)),
                hovertemplate=f"{labels[index]}<extra></extra>"), row=index // columns + 1, col=index % columns + 1)
    figure.update_xaxes(showticklabels=False, showgrid=False, zeroline=False)
    figure.update_yaxes(showticklabels=False, showgrid=False, zeroline=False)
    figure.update_annotations(font_size=11)
    figure.update_layout(title=dict(text=title), height=int(150 * rows + 80), margin=dict(l=10, r=10, t=70, b=10),
                         font=dict(family=style.FONT_FAMILY))
    return figure
