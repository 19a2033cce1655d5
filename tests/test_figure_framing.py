"""Every figure as the pages frame it (attnviz.viz.framing, applied by ui.figures.show_figure): in presentation mode
no text inside a figure is under 16 px, and a title never sits where the toolbars appear under the pointer."""

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from attnviz.viz import framing
from attnviz.viz.charts import bar_chart, line_chart
from attnviz.viz.heads import statistic_heatmap
from attnviz.viz.matrix import SIGNED, heatmap_row, mask_heatmap, matrix_heatmap
from attnviz.viz.over_training import head_panels_figure

LABELS = [f"t{i}" for i in range(6)]


def figures() -> dict[str, go.Figure]:
    values = torch.rand(6, 6)
    return {
        "heatmap with cell values": matrix_heatmap(values, LABELS, LABELS, title="Weights", show_values=True),
        "signed heatmap": matrix_heatmap(values - 0.5, LABELS, LABELS, title="Scores", scale=SIGNED),
        "mask": mask_heatmap(torch.ones(6, 6, dtype=torch.long), LABELS, LABELS, title="Mask"),
        "panels with titles": heatmap_row([values, values], ["left verdict", "right verdict"], LABELS, LABELS,
                                          title="Conventions", show_values=True),
        "log line chart": line_chart([1, 2, 3], {"gap": [1e-3, 1e-9, 1e-16]}, title="Converging", x_title="blocks",
                                     y_title="difference", log_y=True),
        "bars with text": bar_chart(["a", "b"], [0.2, 0.8], title="Next token", y_title="p", text=["0.20", "0.80"]),
        "statistic map": statistic_heatmap(np.random.rand(3, 4), title="previous token", statistic="previous"),
        "small multiples with a legend title": head_panels_figure(
            [0, 10, 100], {"induction score": np.random.rand(3, 2, 2)}, named=[(1, 1)], span=(10, 100)),
    }


def font_sizes(figure: go.Figure) -> list[tuple[str, float]]:
    """Every explicit font size in the figure's JSON, with where it is."""
    found = []

    def walk(node, path):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "size" and path.endswith(("font", "tickfont")) and isinstance(value, (int, float)):
                    found.append((path, value))
                walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{path}[{index}]")

    walk(figure.to_plotly_json(), "")
    return found


@pytest.mark.parametrize("name", list(figures()))
def test_presentation_mode_leaves_no_text_under_16_px(name):
    figure = figures()[name]
    height = figure.layout.height
    framing.enlarge_text(figure, 1.35)
    sizes = font_sizes(figure)
    assert sizes and all(size >= framing.PROJECTOR_FLOOR for _, size in sizes), sizes
    assert figure.layout.font.size >= 16 and figure.layout.title.font.size >= 22  # 17 px x 1.35
    if figure.layout.legend.title.text:  # Plotly draws it at its own size, under 16 px unless given one
        assert figure.layout.legend.title.font.size >= 16, name
    for trace in figure.data:  # text drawn on the data (cell values, bar labels) has a size of its own
        if getattr(trace, "texttemplate", None) or getattr(trace, "text", None) is not None:
            assert trace.textfont.size >= 16, (name, trace.type)
    for axis in [*figure.select_xaxes(), *figure.select_yaxes()]:
        assert axis.tickfont.size >= 16
        if axis.type == "log":
            assert axis.minorloglabels == "none"  # not Plotly's smaller labels between the decades
    assert figure.layout.height == int((height or 400) * 1.35)


def test_on_a_screen_the_sizes_are_left_alone():
    figure = figures()["heatmap with cell values"]
    assert figure.layout.font.size is None  # Plotly's 12 px
    framed = framing.title_below_toolbar(figure)
    assert framed.layout.font.size is None


@pytest.mark.parametrize("name", list(figures()))
def test_the_title_sits_below_the_toolbars_band(name):
    figure = framing.title_below_toolbar(figures()[name])
    height = figure.layout.height or 450
    title = figure.layout.title
    assert title.yref == "container" and title.yanchor == "top"
    assert (1 - title.y) * height == pytest.approx(framing.TOOLBAR_BAND)  # its top edge 34 px down
    lines = title.text.count("<br>") + 1
    assert figure.layout.margin.t >= framing.TOOLBAR_BAND + lines * (title.font.size or 17) * framing.TITLE_LINE
    again = framing.title_below_toolbar(figure)  # idempotent: cached figures are framed on every rerun
    assert again.layout.margin.t == figure.layout.margin.t and again.layout.title.y == title.y


def test_the_title_goes_above_panel_titles_and_a_legend_over_the_plot():
    """What a figure puts between its title and its plot (subplots' panel titles, a legend laid out above the plot)
    keeps its room under the moved title, on a projector too (panel titles of two lines, enlarged first)."""
    from attnviz.viz.generation import sequence_heatmap

    values = torch.rand(6, 6)
    panels = heatmap_row([values, values], ["bool, True = may attend ✔ none on the future", "right"], LABELS, LABELS,
                         title="What PyTorch's SDPA does with each spelling", width=500)
    for band, scale in ((framing.TOOLBAR_BAND, 1.0), (framing.PROJECTOR_TOOLBAR_BAND, 1.35)):
        figure = framing.title_below_toolbar(framing.enlarge_text(go.Figure(panels), scale) if scale != 1 else
                                             go.Figure(panels), band)
        title_bottom = band + (figure.layout.title.font.size or framing.BASE_TITLE) * framing.TITLE_LINE
        panel = figure.layout.annotations[0]
        panel_height = (panel.text.count("<br>") + 1) * panel.font.size * framing.TITLE_LINE
        assert panel.text.count("<br>") >= 1  # the long panel title takes two lines
        assert figure.layout.margin.t >= title_bottom + panel_height, (band, figure.layout.margin.t)
    # the Generation page's whole-sequence heatmap: its legend ("the token after the earlier occurrence") above the
    # plot
    marked = sequence_heatmap(values, LABELS, [0, 0, 0, 1, 1, 1], [(4, 1)], title="Layer 1, head 3 over the sequence")
    unmarked = sequence_heatmap(values, LABELS, [0, 0, 0, 1, 1, 1], [], title="Layer 1, head 3 over the sequence")
    assert marked.layout.legend.y == 1.0 and unmarked.layout.legend.y is None
    top = {name: framing.title_below_toolbar(figure).layout.margin.t
           for name, figure in (("marked", marked), ("unmarked", unmarked))}
    legend_room = top["marked"] - top["unmarked"]
    assert legend_room >= framing.BASE_FONT * framing.TITLE_LINE


def test_the_title_goes_above_an_x_axis_drawn_on_top():
    """The layers x heads maps draw their "head" axis on top: its tick labels and title keep their room under the
    title (the corpus page's title ran into "head")."""
    from attnviz.viz.heads import statistic_heatmap

    figure = framing.title_below_toolbar(statistic_heatmap(np.random.rand(6, 12), title="weight on separators, every "
                                                           "head, over 120 documents", statistic="separator"))
    title_bottom = framing.TOOLBAR_BAND + framing.BASE_TITLE * framing.TITLE_LINE
    axis = framing.BASE_FONT * framing.TITLE_LINE * 2  # its tick labels and its title, one line each
    assert figure.layout.xaxis.side == "top" and figure.layout.xaxis.title.text == "head"
    assert figure.layout.margin.t >= title_bottom + axis
