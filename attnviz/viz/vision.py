"""The image a vision transformer saw, with one query's attention over its patches laid on top."""

from __future__ import annotations

import base64

import numpy as np
import plotly.graph_objects as go

from attnviz.viz import style

OVERLAY_WIDTH = 560
# Attention over a photo: transparent where the weight is 0, so the photo stays readable, rising through orange to a
# saturated red (not Inferno's pale yellow, which tints a near-uniform map into a yellow photo).
OVERLAY_COLOURS = [[0.0, "rgba(255,170,0,0)"], [0.2, "rgba(255,150,0,0.25)"], [0.5, "rgba(245,90,20,0.55)"],
                   [0.8, "rgba(215,25,40,0.8)"], [1.0, "rgba(160,0,60,0.92)"]]
UNIFORM_HEADROOM = 4  # the colour scale reaches at least this many times the uniform weight 1 / patches


def overlay_top(grids) -> float:
    """The top of the overlay's colour scale: the largest weight, but at least UNIFORM_HEADROOM x the uniform weight,
    so that a head spreading its weight evenly stays faint instead of painting the whole photo."""
    patches = max(np.asarray(grids[0]).size, 1)
    return max(max(float(np.max(grid)) for grid in grids), UNIFORM_HEADROOM / patches, 1e-9)


def thumbnail_source(image: np.ndarray, rows: int, cols: int, pixels_per_patch: int = 8) -> str:
    """The image shrunk to ``pixels_per_patch`` per patch, as a PNG data URL (a few kB) for the small multiples."""
    from PIL import Image

    from attnviz.core.vision import png_bytes

    small = Image.fromarray(image).resize((cols * pixels_per_patch, rows * pixels_per_patch), Image.BILINEAR)
    return "data:image/png;base64," + base64.b64encode(png_bytes(small)).decode()


def overlay_figure(image: np.ndarray, grid: np.ndarray, layout, query: int, title: str,
                   width: int = OVERLAY_WIDTH, opacity: float = 0.8) -> go.Figure:
    """``image [H, W, 3]`` uint8 under a heatmap of ``grid [rows, cols]`` (one cell per patch of ``layout``, an
    :class:`attnviz.core.vision.PatchLayout`, at its place on the image) whose colours are transparent at 0 and whose
    strongest colour is ``opacity`` x :data:`OVERLAY_COLOURS`' own; the query's own patch is outlined. Clicking a
    patch selects it (``customdata``: its token index). The image travels as one PNG, not as numbers."""
    from PIL import Image

    from attnviz.core.vision import png_bytes

    height, width_px = image.shape[:2]
    source = "data:image/png;base64," + base64.b64encode(png_bytes(Image.fromarray(image))).decode()
    patch = layout.patch
    figure = go.Figure()
    # go.Image centres pixel i at x0 + i: x0 = 0.5 puts pixel i on [i, i + 1], where the patch cells are
    figure.add_trace(go.Image(source=source, x0=0.5, y0=0.5, dx=1, dy=1, hoverinfo="skip"))
    figure.add_trace(go.Heatmap(
        z=grid, x=[patch * (c + 0.5) for c in range(layout.cols)], y=[patch * (r + 0.5) for r in range(layout.rows)],
        colorscale=OVERLAY_COLOURS, opacity=opacity, zmin=0, zmax=overlay_top([grid]),
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


def heads_overlay_figure(grids: list[np.ndarray], title: str, columns: int = 6, width: int = 1000, *,
                         image: np.ndarray | None = None, query_patch: tuple[int, int] | None = None,
                         opacity: float = 0.8) -> go.Figure:
    """Small multiples: one query's attention over the patches in each head of a layer, ``grids`` ``[rows,
    cols]`` each, on one colour scale (0 to the largest weight of any head), so heads compare at a glance; each
    over a small copy of ``image`` (one PNG shared by all) with the query's patch ``(row, col)`` outlined."""
    from plotly.subplots import make_subplots

    n = len(grids)
    columns = min(columns, n)
    rows = -(-n // columns)
    figure = make_subplots(rows=rows, cols=columns, subplot_titles=[f"head {h}" for h in range(n)],
                           horizontal_spacing=0.02, vertical_spacing=0.08 / max(rows, 1) + 0.04)
    top = overlay_top(grids)
    grid_rows, grid_cols = grids[0].shape
    pixels = 8  # per patch in the thumbnails' image
    source = thumbnail_source(image, grid_rows, grid_cols, pixels) if image is not None else None
    for head, grid in enumerate(grids):
        place = dict(row=head // columns + 1, col=head % columns + 1)
        if source is not None:  # pixel i of the small image covers patch coordinates [i/8 - 0.5, (i+1)/8 - 0.5]
            figure.add_trace(go.Image(source=source, x0=-0.5 + 0.5 / pixels, y0=-0.5 + 0.5 / pixels,
                                      dx=1 / pixels, dy=1 / pixels, hoverinfo="skip"), **place)
        figure.add_trace(go.Heatmap(z=grid, zmin=0, zmax=top, colorscale=OVERLAY_COLOURS, opacity=opacity,
                                    showscale=head == 0, colorbar=dict(title=dict(text="weight"), thickness=12),
                                    hovertemplate=f"head {head}<br>patch (%{{y}},%{{x}})<br>weight %{{z:.3g}}"
                                                  "<extra></extra>"), **place)
        if query_patch is not None:
            row, col = query_patch
            figure.add_shape(type="rect", x0=col - 0.5, x1=col + 0.5, y0=row - 0.5, y1=row + 0.5,
                             line=dict(color="#00e5ff", width=2), **place)
    figure.update_xaxes(visible=False, range=[-0.5, grid_cols - 0.5])
    figure.update_yaxes(visible=False, range=[grid_rows - 0.5, -0.5])
    for index in range(1, rows * columns + 1):  # square patches: each thumbnail's y follows its own x
        figure.layout[f"yaxis{index if index > 1 else ''}"].scaleanchor = f"x{index if index > 1 else ''}"
    cell = (width - 80) / columns
    figure.update_layout(title=dict(text=title), font=dict(family=style.FONT_FAMILY), width=width,
                         height=int(rows * cell * grids[0].shape[0] / max(grids[0].shape[1], 1)) + 90,
                         margin=dict(l=10, r=10, t=70, b=10))
    return figure
