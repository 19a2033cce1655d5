"""Figures of the "Queries and keys" page: one head's queries and keys (and values, where asked) as points of one
picture (2D or 3D), with lines from a chosen query to the keys it attends to most, and every head of a layer as
small pictures to click. ``points`` are :class:`attnviz.core.qk_geometry.HeadPoints`.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.core.analysis import TOKEN_CATEGORIES
from attnviz.core.qk_geometry import HeadPoints
from attnviz.viz import style

QUERY_COLOR, KEY_COLOR, VALUE_COLOR = "#d62728", "#1f77b4", "#2ca02c"
COLOURINGS = ("query or key", "position", "token category", "document")
CATEGORY_COLOURS = dict(zip(TOKEN_CATEGORIES, ("#7f7f7f", "#ff7f0e", "#9467bd", "#1f77b4", "#17becf"), strict=True))
CONTEXT = 2  # tokens shown either side of a point's own in its hover


MAX_DRAWN = 40_000  # points drawn in one head's picture (queries, keys and values together); past it each set is
# thinned evenly, and the title says so


def _rounded(values) -> np.ndarray:
    """Coordinates as typed arrays (Plotly sends them as bytes, not decimal strings): float32, or the int16 of
    :func:`quantised` as they are."""
    values = np.asarray(values)
    return values if values.dtype == np.int16 else values.astype(np.float32)


def quantised(coordinates) -> np.ndarray:
    """``coordinates [n, dims]`` as int16 on one scale for every axis (so distances keep their proportions): 65,535
    steps across the picture's widest side, finer than a screen's pixels; 2 bytes a number."""
    coordinates = np.asarray(coordinates, dtype=np.float64)
    if not len(coordinates):
        return coordinates.astype(np.int16)
    low = coordinates.min(0)
    width = float((coordinates.max(0) - low).max()) or 1.0
    return np.round((coordinates - low) / width * 65_534 - 32_767).astype(np.int16)


def _in_context(tokens: list[str], start: int, stop: int, index: int) -> str:
    """The token at ``index`` in bold between its neighbours in the same document (``start``..``stop``)."""
    before = "".join(style.plotly_text(t) for t in tokens[max(start, index - CONTEXT):index])
    after = "".join(style.plotly_text(t) for t in tokens[index + 1:min(stop, index + 1 + CONTEXT)])
    return f"{'…' if index - CONTEXT > start else ''}{before}<b>{style.plotly_text(tokens[index])}</b>{after}" \
           f"{'…' if index + 1 + CONTEXT < stop else ''}"


CONTEXT_POINTS = 12_000  # up to this many points in a picture, each hover shows its token in context; past it,
# the token alone (the figure stays under 2 MB: ~90 bytes a point with context, ~40 without)


def _hover(points: HeadPoints, which: str, context: bool) -> tuple[list[str], str]:
    """Each point's hover text and the template that shows it with its position and document (customdata
    ``[code, position, document]``): the token in context, or alone past CONTEXT_POINTS."""
    tokens = points.key_tokens if which in ("key", "value") else points.query_tokens
    texts = []
    for document in points.documents:
        span = document.queries if which == "query" else document.keys
        texts += ([_in_context(tokens, span.start, span.stop, at) for at in span] if context
                  else [style.plotly_text(tokens[at]) for at in span])
    where = " · document %{customdata[2]}" if len(points.documents) > 1 else ""
    return texts, f"{which} %{{customdata[1]}}{where}<br>%{{text}}<extra></extra>"


def _colours(points: HeadPoints, kind: str, colour: str, positions, documents, plain: str,
             shown: np.ndarray) -> dict:
    if colour == "position":
        return dict(color=np.asarray(positions, np.int32), colorscale=style.PLAIN_COLORSCALE,
                    showscale=kind == "query", colorbar=dict(title="position", thickness=12))
    if colour == "document":
        return dict(color=np.asarray(documents, np.int32), colorscale="Turbo", showscale=False)
    if colour == "token category":
        categories = points.query_categories if kind == "query" else points.key_categories
        if categories:  # a number per point on a stepped scale: 1 byte a point, not a colour's name
            categories = [categories[i] for i in shown]
            names = list(CATEGORY_COLOURS)
            steps = [[edge, shade] for index, shade in enumerate(CATEGORY_COLOURS.values())
                     for edge in (index / len(names), (index + 1) / len(names))]
            return dict(color=np.asarray([names.index(c) if c in names else 0 for c in categories], np.int8),
                        colorscale=steps, cmin=-0.5, cmax=len(names) - 0.5, showscale=False)
    return dict(color=plain)


SYMBOLS = {"query": "circle", "key": "diamond", "value": "triangle-up"}
SYMBOLS_3D = {"query": "circle", "key": "diamond", "value": "square"}  # Scatter3d draws no triangles


def head_caption(colour: str, dims: int) -> str:
    """The caption of :func:`head_scatter` coloured by ``colour`` in ``dims`` dimensions, saying what the figure
    shows: queries are red only where points are coloured by kind (round always, keys diamonds); a click chooses a
    query only in 2D, since Streamlit passes on Plotly's selections, which a 3D picture never makes (it only
    clicks, and Streamlit drops those: checked in Chromium with Streamlit 1.67)."""
    look = "a red circle" if colour == COLOURINGS[0] else "a circle; keys are diamonds"
    if dims == 2:
        return (f"Click a query ({look}) to draw lines to the three keys it attends to most (thicker: more weight). "
                "Hover a point for its token in context.")
    return (f"Queries are circles{', red,' if colour == COLOURINGS[0] else ''} and keys diamonds; hover a point for "
            "its token in context. A click follows a query in 2D only: switch to 2D to draw its lines to the keys it "
            "attends to most.")


def head_scatter(points: HeadPoints, coordinates, *, title: str, colour: str = "query or key",
                 selected_query: int | None = None, strongest: int = 3, height: int = 560,
                 found: str = "") -> go.Figure:
    """Queries then keys (then values, where ``coordinates`` has rows for them: ``[n_q + n_k (+ n_k), 2 or
    3]``) as points: queries round, keys diamonds, values triangles (squares in 3D); coloured by kind, by position,
    by token category or by document. With ``selected_query``: lines from it to the ``strongest`` keys it attends
    to, their weights on the lines' hover. ``found``: the queries and keys whose token contains it (ignoring case
    and the tokenizer's space marks) are ringed. Coordinates are drawn :func:`quantised`; past MAX_DRAWN points each set
    is thinned evenly. Each point's customdata: (3 x its index + 0 for a query, 1 a key, 2 a value; its position;
    its document)."""
    coordinates = quantised(coordinates)
    dims = coordinates.shape[1]
    n_q, n_k = len(points.queries), len(points.keys)
    parts = {"query": (coordinates[:n_q], points.query_positions, points.query_documents, QUERY_COLOR),
             "key": (coordinates[n_q:n_q + n_k], points.key_positions, points.key_documents, KEY_COLOR)}
    if len(coordinates) >= n_q + 2 * n_k and n_k:
        parts["value"] = (coordinates[n_q + n_k:n_q + 2 * n_k], points.key_positions, points.key_documents,
                          VALUE_COLOR)
    figure = go.Figure()
    total = sum(len(part[0]) for part in parts.values())
    step = -(-total // MAX_DRAWN)  # every step-th point of each set is drawn (1: all)
    context = total <= CONTEXT_POINTS
    for number, (kind, part) in enumerate(parts.items()):
        figure.add_trace(_point_trace(points, kind, number, part, step=step, colour=colour, context=context,
                                      dims=dims))
    if step > 1:
        title += f"<br><sup>1 point in {step} drawn ({MAX_DRAWN:,} at most): the measures use them all</sup>"
    if colour == "token category" and points.query_categories:
        for category, shade in CATEGORY_COLOURS.items():  # a legend of the categories (no points of their own)
            if category in points.query_categories or category in points.key_categories:
                figure.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=category,
                                            marker=dict(color=shade, size=8)))
    if found.strip():
        _ring_found(figure, points, coordinates, found.strip().lower())
    if selected_query is not None and 0 <= selected_query < n_q:
        _lines_to_strongest(figure, points, coordinates, selected_query, strongest)
    _scatter_layout(figure, title, height, dims)
    return figure


def _point_trace(points: HeadPoints, kind: str, number: int, part: tuple, *, step: int, colour: str, context: bool,
                 dims: int):
    """One set of points (queries, keys or values), every ``step``-th drawn; ``number`` codes the kind in each
    point's customdata."""
    xyz, positions, documents, plain = part
    shown = np.arange(0, len(xyz), step)
    positions, documents = np.asarray(positions)[shown], np.asarray(documents, dtype=np.int64)[shown]
    colours = _colours(points, kind, colour, positions, documents, plain, shown)
    if kind == "value" and colour == "query or key":
        colours = dict(color=VALUE_COLOR)
    marker = dict(symbol=SYMBOLS[kind] if dims == 2 else SYMBOLS_3D[kind],
                  size=7 if dims == 2 else 3, opacity=0.8 if kind != "value" else 0.6, line=dict(width=0),
                  **colours)
    texts, template = _hover(points, kind, context)
    names = [points.document_name(index) for index in documents] if len(points.documents) > 1 else documents
    common = dict(mode="markers", name=f"{kind}s" if kind != "query" else "queries", marker=marker,
                  text=[texts[i] for i in shown], hovertemplate=template,
                  customdata=np.stack([shown * 3 + number, positions, names], 1).astype(np.int32))
    xyz = xyz[shown]
    if dims == 2:
        return go.Scattergl(x=_rounded(xyz[:, 0]), y=_rounded(xyz[:, 1]), **common)
    return go.Scatter3d(x=_rounded(xyz[:, 0]), y=_rounded(xyz[:, 1]), z=_rounded(xyz[:, 2]), **common)


def _scatter_layout(figure: go.Figure, title: str, height: int, dims: int) -> None:
    """The scatter's frame: no ticks (the axes of a projection have no units), equal scales in 2D, pan to move."""
    layout = dict(title=dict(text=title), height=height, margin=dict(l=10, r=10, t=60, b=10),
                  legend=dict(orientation="h", y=-0.02, x=0.5, xanchor="center", yanchor="top"),
                  font=dict(family=style.FONT_FAMILY))
    if dims == 2:
        figure.update_layout(**layout, xaxis=dict(showticklabels=False, zeroline=False, title=""),
                             yaxis=dict(showticklabels=False, zeroline=False, title="", scaleanchor="x"),
                             dragmode="pan")
    else:
        hidden = dict(showticklabels=False, title="")
        figure.update_layout(**layout, scene=dict(xaxis=hidden, yaxis=hidden, zaxis=hidden))


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
    _, document = points.document_of_query(query)
    local = query - document.queries.start
    order = document.strongest_keys[local, :strongest].tolist()
    weights = dict(zip(order, document.strongest_weights[local, :strongest].tolist(), strict=True))
    n_q = len(points.queries)
    dims = coordinates.shape[1]
    start = coordinates[query]
    for rank, key in enumerate(order):
        if weights[key] <= 0:  # a query with fewer keys allowed than lines asked
            continue
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
    """Small 2D pictures of heads (``pictures``: each its number of queries and its coordinates, queries first;
    queries red, keys blue), each titled with its label (default ``head h``) and the share of its queries whose
    strongest key is their nearest (:func:`attnviz.core.qk_geometry.trust` at k = 1: of the queries with more than one
    key; "–" where none has); each point's customdata is its (layer, head) in ``cells`` (default (0, h)), for a
    click to choose it. At most GRID_POINTS queries and keys each are drawn per picture, evenly spaced."""
    labels = labels or [f"head {h}" for h in range(len(pictures))]
    cells = cells or [(0, h) for h in range(len(pictures))]
    rows = -(-len(pictures) // columns)
    figure = make_subplots(rows=rows, cols=columns, horizontal_spacing=0.02, vertical_spacing=0.3 / max(rows, 1),
                           subplot_titles=[f"{label} · {trust:.0%}" if trust == trust else f"{label} · –"
                                           for label, trust in zip(labels, trusts, strict=True)])
    for index, (n_q, coordinates) in enumerate(pictures):
        coordinates = np.asarray(coordinates, dtype=np.float64)
        for part, colour in ((coordinates[:n_q], QUERY_COLOR), (coordinates[n_q:], KEY_COLOR)):
            part = part[np.linspace(0, len(part) - 1, min(len(part), GRID_POINTS)).astype(int)] if len(part) else part
            figure.add_trace(go.Scattergl(
                x=_rounded(part[:, 0]), y=_rounded(part[:, 1]), mode="markers", showlegend=False,
                marker=dict(color=colour, size=3, opacity=0.7),
                # a click selects a point: Plotly would then fade the rest of the head just opened
                selected=dict(marker=dict(opacity=0.7)), unselected=dict(marker=dict(opacity=0.7)),
                customdata=np.tile(np.asarray(cells[index], np.int16), (len(part), 1)),
                hovertemplate=f"{labels[index]}<extra></extra>"), row=index // columns + 1, col=index % columns + 1)
    figure.update_xaxes(showticklabels=False, showgrid=False, zeroline=False)
    figure.update_yaxes(showticklabels=False, showgrid=False, zeroline=False)
    figure.update_annotations(font_size=11)
    figure.update_layout(title=dict(text=title), height=int(150 * rows + 80), margin=dict(l=10, r=10, t=70, b=10),
                         font=dict(family=style.FONT_FAMILY))
    return figure
