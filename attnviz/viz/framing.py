"""How every figure is framed on a page: text large enough for a projector, and a title the toolbar cannot cover.

Pure functions on a Plotly figure (the page's ``show_figure`` calls them), so tests can check the numbers."""

from __future__ import annotations

import plotly.graph_objects as go

BASE_FONT = 12  # px: Plotly's default text size, which the figures keep on a screen
BASE_TITLE = 17  # px
PROJECTOR_FLOOR = 16  # px: no text inside a figure is smaller in presentation mode
TOOLBAR_BAND = 34  # px at the top of a figure where the toolbars appear under the pointer (Plotly's and Streamlit's)
PROJECTOR_TOOLBAR_BAND = 56  # the same in presentation mode, whose larger text makes Streamlit's toolbar 40 px tall
# and reach 49 px into a figure (measured in Chromium at 1280 x 720)
TITLE_LINE = 1.35  # a title line's height, in font sizes


def _at_least(size, floor: float) -> int:
    return int(max(floor, size or 0))


def enlarge_text(figure: go.Figure, scale: float, floor: int = PROJECTOR_FLOOR) -> go.Figure:
    """Every text in ``figure`` scaled by ``scale`` and at least ``floor`` px: the base font, the title, axis ticks
    and titles, cell values and other trace text, annotations, legends and colour bars (which may set their own
    smaller sizes). Log axes label their decades only (Plotly draws the labels between them smaller).
    The figure grows by ``scale`` so that the larger text keeps its room. Returns ``figure``, changed in place."""
    layout = figure.layout
    base = _at_least(BASE_FONT * scale, floor)
    figure.update_layout(font_size=base, title_font_size=_at_least((layout.title.font.size or BASE_TITLE) * scale,
                                                                   floor),
                         height=int((layout.height or 400) * scale))
    # Set even where the figure sets none: Plotly draws a legend's entries smaller than the base font otherwise.
    figure.update_layout(legend_font_size=_at_least((layout.legend.font.size or BASE_FONT) * scale, floor))
    if layout.legend.title.text:  # its own size, else drawn below the floor
        figure.update_layout(legend_title_font_size=_at_least(
            (layout.legend.title.font.size or layout.legend.font.size or BASE_FONT) * scale, floor))
    for axis in [*figure.select_xaxes(), *figure.select_yaxes()]:
        axis.tickfont.size = _at_least((axis.tickfont.size or BASE_FONT) * scale, floor)
        if axis.title.font.size:
            axis.title.font.size = _at_least(axis.title.font.size * scale, floor)
        if axis.type == "log":
            axis.minorloglabels = "none"  # Plotly draws the labels between the decades smaller: decades only
    for trace in figure.data:
        textfont = getattr(trace, "textfont", None)
        if textfont is not None and textfont.size is not None:
            textfont.size = _at_least(textfont.size * scale, floor)
        elif textfont is not None and (getattr(trace, "text", None) is not None
                                       or getattr(trace, "texttemplate", None)):
            textfont.size = base  # cell values and labels drawn on the data follow the base size
        colorbar = getattr(trace, "colorbar", None)
        if colorbar is not None:
            colorbar.tickfont.size = _at_least((colorbar.tickfont.size or BASE_FONT) * scale, floor)
        marker_bar = getattr(getattr(trace, "marker", None), "colorbar", None)
        if marker_bar is not None and getattr(trace.marker, "showscale", None):
            marker_bar.tickfont.size = _at_least((marker_bar.tickfont.size or BASE_FONT) * scale, floor)
    for annotation in layout.annotations or ():
        annotation.font.size = _at_least((annotation.font.size or BASE_FONT) * scale, floor)
    if layout.coloraxis.colorbar.tickfont.size or layout.coloraxis.colorscale:
        layout.coloraxis.colorbar.tickfont.size = _at_least(
            (layout.coloraxis.colorbar.tickfont.size or BASE_FONT) * scale, floor)
    return figure


def title_below_toolbar(figure: go.Figure, band: int = TOOLBAR_BAND) -> go.Figure:
    """Places a titled figure's title under the ``band`` px where the toolbars appear when the pointer is over the
    figure (Plotly's at the top right, Streamlit's above it), and makes the top margin hold both. Returns
    ``figure``."""
    text = getattr(figure.layout.title, "text", None)
    if not text:
        return figure
    title_size = figure.layout.title.font.size or BASE_TITLE
    lines = text.count("<br>") + 1
    # px: band, title, what sits between the title and the plot (panel titles, a legend), a gap above the plot
    top = band + int(lines * title_size * TITLE_LINE) + _above_the_plot(figure) + 10
    height = figure.layout.height or 450
    figure.update_layout(
        margin_t=max(figure.layout.margin.t or 0, top),
        title=dict(yref="container", y=1 - band / height, yanchor="top"),
    )
    return figure


def _above_the_plot(figure: go.Figure) -> int:
    """Pixels of text that the figure places just above its plot area (in its top margin, under the title): the
    subplots' panel titles and a legend laid out above the plot. The title goes above them, not over them."""
    layout = figure.layout
    above = 0.0
    for annotation in layout.annotations or ():
        placed_above = (annotation.yref in (None, "paper") and (annotation.y or 0) >= 1
                        and annotation.yanchor in (None, "auto", "bottom"))
        if placed_above and annotation.text:
            size = annotation.font.size or layout.font.size or BASE_FONT
            above = max(above, (annotation.text.count("<br>") + 1) * size * TITLE_LINE + (annotation.yshift or 0))
    for axis in figure.select_xaxes():  # an x axis drawn on top: its tick labels, then its title, under the title
        if axis.side == "top" and axis.visible is not False:
            ticks = (axis.tickfont.size or layout.font.size or BASE_FONT) * TITLE_LINE + 6
            named = axis.title.text and (axis.title.font.size or layout.font.size or BASE_FONT) * TITLE_LINE + 6
            above = max(above, ticks + (named or 0))
    legend = layout.legend
    if legend.y is not None and legend.y >= 1 and legend.yanchor == "bottom" and legend.yref in (None, "paper"):
        size = legend.font.size or layout.font.size or BASE_FONT
        above = max(above, size * TITLE_LINE + 10)  # one row of entries and the legend's padding
    return int(above)
