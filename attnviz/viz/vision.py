"""The image a vision transformer saw, with one query's attention over its patches laid on top."""

from __future__ import annotations

import base64

import numpy as np
import plotly.graph_objects as go

from attnviz.viz import style

OVERLAY_WIDTH = 560


def overlay_figure(image: np.ndarray, grid: np.ndarray, layout, query: int, title: str,
                   width: int = OVERLAY_WIDTH) -> go.Figure:
    """``image [H, W, 3]`` uint8 under a translucent heatmap of ``grid [rows, cols]`` (one cell per patch of
    ``layout``, an :class:`attnviz.vision.PatchLayout`, at its place on the image); the query's own patch is
    outlined. Clicking a patch selects it (``customdata``: its token index). The image travels as one PNG, not as
    numbers."""
    from PIL import Image

    from attnviz.vision import png_bytes

    height, width_px = image.shape[:2]
    source = "data:image/png;base64," + base64.b64encode(png_bytes(Image.fromarray(image))).decode()
    patch = layout.patch
    figure = go.Figure()
    # go.Image centres pixel i at x0 + i: x0 = 0.5 puts pixel i on [i, i + 1], where the patch cells are
    figure.add_trace(go.Image(source=source, x0=0.5, y0=0.5, dx=1, dy=1, hoverinfo="skip"))
    figure.add_trace(go.Heatmap(
        z=grid, x=[patch * (c + 0.5) for c in range(layout.cols)], y=[patch * (r + 0.5) for r in range(layout.rows)],
        colorscale="Inferno", opacity=0.6, zmin=0, zmax=max(float(grid.max()), 1e-9),
        colorbar=dict(title=dict(text="weight"), thickness=12), hoverinfo="skip", name="attention",
    ))
    # Invisible points at the patches' centres: hovering names the patch and its weight, and clicking one selects
    # it (Streamlit reports point selections, not heatmap cells).
    places = [(r, c) for r in range(layout.rows) for c in range(layout.cols)]
    figure.add_trace(go.Scatter(
        x=[patch * (c + 0.5) for _, c in places], y=[patch * (r + 0.5) for r, _ in places], mode="markers",
        marker=dict(size=max(6, width * 0.8 / max(layout.cols, 1)), color="rgba(0,0,0,0)", symbol="square"),
        customdata=[[layout.token_of(r, c)] for r, c in places],
        hovertext=[f"patch ({r},{c})<br>weight {grid[r, c]:.3g}<br>click: make it the query" for r, c in places],
        hoverinfo="text", showlegend=False,
    ))
    place = layout.patch_of(query)
    if place is not None:
        row, col = place
        figure.add_shape(type="rect", x0=col * patch, x1=(col + 1) * patch, y0=row * patch, y1=(row + 1) * patch,
                         line=dict(color="#00e5ff", width=3))
    figure.update_layout(
        title=dict(text=title), font=dict(family=style.FONT_FAMILY),
        width=width, height=int(width * height / width_px) + 80, margin=dict(l=10, r=10, t=60, b=10),
        xaxis=dict(visible=False, range=[0, width_px], constrain="domain"),
        yaxis=dict(visible=False, range=[height, 0], scaleanchor="x", constrain="domain"),
    )
    return figure


def heads_overlay_figure(grids: list[np.ndarray], title: str, columns: int = 6, width: int = 1000) -> go.Figure:
    """Small multiples: one query's attention over the patches in each head of a layer, ``grids`` ``[rows,
    cols]`` each, on one colour scale (0 to the largest weight of any head), so heads compare at a glance."""
    from plotly.subplots import make_subplots

    n = len(grids)
    columns = min(columns, n)
    rows = -(-n // columns)
    figure = make_subplots(rows=rows, cols=columns, subplot_titles=[f"head {h}" for h in range(n)],
                           horizontal_spacing=0.02, vertical_spacing=0.08 / max(rows, 1) + 0.04)
    top = max(max(float(g.max()) for g in grids), 1e-9)
    for head, grid in enumerate(grids):
        figure.add_trace(go.Heatmap(z=grid, zmin=0, zmax=top, colorscale="Inferno", showscale=head == 0,
                                    colorbar=dict(title=dict(text="weight"), thickness=12),
                                    hovertemplate=f"head {head}<br>patch (%{{y}},%{{x}})<br>weight %{{z:.3g}}"
                                                  "<extra></extra>"),
                         row=head // columns + 1, col=head % columns + 1)
    figure.update_xaxes(visible=False)
    figure.update_yaxes(visible=False, autorange="reversed", scaleanchor="x")
    cell = (width - 80) / columns
    figure.update_layout(title=dict(text=title), font=dict(family=style.FONT_FAMILY), width=width,
                         height=int(rows * cell * grids[0].shape[0] / max(grids[0].shape[1], 1)) + 90,
                         margin=dict(l=10, r=10, t=70, b=10))
    return figure
