"""Explore heads for a vision transformer: what the Image tab draws over the photo (one head, the mean of a
layer's heads, or rollout; every head of the layer side by side), the line that says what the model saw, and the
key an upload is cached by."""

from __future__ import annotations

import hashlib

from attnviz.core import vision
from attnviz.models.record import Capture
from attnviz.viz.vision import heads_overlay_figure, overlay_figure

IMAGE_TABS = ["Image", "View", "Head statistics", "Export"]
IMAGE_SOURCES = ["Sample photo", "Upload an image"]


def upload_key(data: bytes) -> str:
    """An uploaded image's cache key: its bytes' digest (the same file twice is captured once)."""
    return "upload:" + hashlib.sha256(data).hexdigest()


def image_summary(name: str, description: str, capture: Capture) -> str:
    """The line under the image picker: the model, and the tokens it made of the image."""
    layout = capture.layout
    return (f"**{name}** · {description} · {len(capture.tokens)} tokens: "
            + (f"{', '.join(layout.prefix)} and " if layout.prefix else "")
            + f"{layout.rows} x {layout.cols} patches")


def overlay_view(capture: Capture, layer: int, mode: str, head: int, query: int, opacity: float):
    """Where the query token looks, over the pixels the model saw: ``(figure, caption)``."""
    layout = capture.layout
    shown = vision.overlay(capture, layer, mode, head, query)  # grid: [rows, cols]
    first = layout.prefix[0] if layout.prefix else "the first patch"
    figure = overlay_figure(capture.image, shown.grid, layout, query, shown.title, opacity=opacity)
    caption = (f"Where {capture.tokens[query]} looks, on the {layout.image_size[1]} x {layout.image_size[0]} pixels "
               f"the model saw ({layout.rows} x {layout.cols} patches of {layout.patch} px). Click a patch to make it "
               f"the query; choose {first} in the query box to go back.")
    return figure, caption


def every_head_view(capture: Capture, layer: int, query: int, opacity: float):
    """Every head of ``layer`` over the image, one colour scale, the query's patch outlined: ``(figure,
    caption)``."""
    record, layout = capture.records["self"], capture.layout
    grids = [vision.overlay(capture, layer, "head", each, query).grid for each in range(record.n_heads)]
    figure = heads_overlay_figure(grids, f"Every head of layer {layer}: where {capture.tokens[query]} looks",
                                  image=capture.image, query_patch=layout.patch_of(query), opacity=opacity)
    return figure, ("One colour scale for all heads, over the image with the query's patch outlined: the heads of "
                    "one layer often split the work (nearby patches, the object, the background, [CLS]).")
