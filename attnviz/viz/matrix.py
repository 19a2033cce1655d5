"""Heatmaps of matrices with their numbers written in: attention weights, scores, Q/K/V.

A heatmap's colour scale is one value that says what the numbers are: :data:`WEIGHTS` (and its per-row, per-head
and log variants) for attention weights, :class:`SignedScale` (:data:`SIGNED`) for scores and differences,
:data:`PLAIN` for anything else."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
import plotly.graph_objects as go

from attnviz.viz import style

TEXT_LIMIT = 400  # cells: numbers are written in each cell up to 20 x 20, where they fit
DETAIL_LIMIT = 4096  # cells: cell borders up to 64 x 64
RANK_LIMIT = 256 * 256  # cells: the hover gives each weight's rank in its row up to 256 x 256 (2 bytes a cell)
FULL_WIDTH = 1000  # px: a figure the page's full width on a laptop (layout="wide"); figures in columns pass less
HALF_WIDTH = 460  # px: a figure in one of two columns (the least figure_columns' default column is drawn at)
NARROW_FULL_WIDTH = 740  # px: a figure the page's full width in a 900-px window (the sidebar collapses there)
NARROW_PANEL = 220  # px: side-by-side panels narrower than this label their x axis by position only
CELL_TEXT_SIZE = 12  # px: numbers in cells are printed at this fixed size, or not at all
X_TICK_SPACING = 18  # px between two x tick labels (turned by 45 degrees)
Y_TICK_SPACING = 14  # px between two y tick labels
SENTENCE_COLOURS = ("#1b1f24", "#c2410c")  # tick labels of sentence A and sentence B
BOUNDARY_COLOUR = "#c2410c"


@dataclass(frozen=True)
class WeightScale:
    """Attention weights on the shared 0..1 scale, so heads can be compared; or, with ``log``, log10 weights on a
    scale from the smallest power of ten present (1e-12 at the least, 1e-1 at the most) to 1, ticks read as powers
    of ten. ``value_name`` is what the hover calls a cell, and says what the values are (the weights, or the
    weights divided by a maximum). Cells print 2 decimals (4 characters fit more cells; the hover has 3
    significant digits), and the hover gives each weight's rank in its row."""

    value_name: str = "weight"
    log: bool = False
    ranks_in_hover: ClassVar[bool] = True

    def cell_text(self, value: float) -> str:
        return f"{value:.2f}" if np.isfinite(value) else style.format_number(value)

    def colour_settings(self, finite: np.ndarray) -> dict:
        """Plotly's colour arguments for the values ``finite`` (NaN where a cell is blank)."""
        if not self.log:
            return dict(colorscale=style.WEIGHT_COLORSCALE, zmin=0.0, zmax=1.0)
        low = float(np.nanmin(finite)) if np.isfinite(finite).any() else -6.0
        low = max(min(np.floor(low), -1.0), -12.0)
        ticks = list(range(int(low), 1))
        return dict(colorscale=style.WEIGHT_COLORSCALE, zmin=low, zmax=0.0,
                    colorbar=dict(tickvals=ticks, ticktext=[f"1e{t}" if t else "1" for t in ticks]))


@dataclass(frozen=True)
class SignedScale:
    """Values of either sign (scores, differences, Q/K/V) on a diverging scale centred on 0, from -bound to +bound.

    ``bound`` fixes it, so that figures meant to be compared share one scale; without it the bound is the largest
    |value|, or with ``robust`` its 99th percentile (so that a few outliers do not wash out the rest)."""

    bound: float | None = None
    robust: bool = False
    value_name: ClassVar[str] = "value"
    ranks_in_hover: ClassVar[bool] = False

    def cell_text(self, value: float) -> str:
        return style.format_number(value)

    def bound_of(self, finite: np.ndarray) -> float:
        """The bound this scale takes from ``finite`` without a fixed one: 0.0 when no value is finite."""
        magnitudes = np.abs(finite[np.isfinite(finite)])
        if not magnitudes.size:
            return 0.0
        return float(np.percentile(magnitudes, 99) if self.robust else magnitudes.max())

    def colour_settings(self, finite: np.ndarray) -> dict:
        """Plotly's colour arguments for the values ``finite`` (NaN where a cell is blank); all zeros get ±1."""
        bound = self.bound or self.bound_of(finite) or 1.0
        return dict(colorscale=style.SIGNED_COLORSCALE, zmin=-bound, zmax=bound, zmid=0.0)


@dataclass(frozen=True)
class PlainScale:
    """Values that are neither weights nor signed, on a sequential scale over their own range."""

    value_name: ClassVar[str] = "value"
    ranks_in_hover: ClassVar[bool] = False

    def cell_text(self, value: float) -> str:
        return style.format_number(value)

    def colour_settings(self, finite: np.ndarray) -> dict:
        return dict(colorscale=style.PLAIN_COLORSCALE)


ColourScale = WeightScale | SignedScale | PlainScale  # what the values are, and so how they are coloured
WEIGHTS = WeightScale()
WEIGHTS_PER_HEAD = WeightScale("weight / head max")  # the weights divided by the matrix's maximum
WEIGHTS_PER_ROW = WeightScale("weight / row max")  # each row divided by its maximum
WEIGHTS_LOG = WeightScale("log10 weight", log=True)  # log10 of the weights
SIGNED = SignedScale()
PLAIN = PlainScale()


def plot_area(width: int, height: int, n_rows: int, n_cols: int) -> tuple[float, float]:
    """The size in px of one cell of an ``n_rows x n_cols`` heatmap drawn ``width x height`` px (less the margins,
    tick labels, title and colour bar)."""
    return max(1.0, (width - 190) / max(n_cols, 1)), max(1.0, (height - 150) / max(n_rows, 1))


def numbers_fit(text: list[list[str]], cell_width: float, cell_height: float) -> bool:
    """Whether the longest number fits inside a cell at :data:`CELL_TEXT_SIZE` (about 0.6 em a character)."""
    longest = max((len(value) for row in text for value in row), default=0)
    return cell_height >= CELL_TEXT_SIZE + 4 and cell_width >= 0.6 * CELL_TEXT_SIZE * longest + 6


def ranks_in_rows(matrix: np.ndarray) -> np.ndarray:
    """Each cell's rank in its row, 1 = the largest value; blank cells (NaN) rank last. ``[rows, cols]`` int16."""
    filled = np.where(np.isnan(matrix), -np.inf, matrix)
    order = np.argsort(-filled, axis=1, kind="stable")
    ranks = np.empty(matrix.shape, dtype=np.int16 if matrix.shape[1] < 32767 else np.int32)
    np.put_along_axis(ranks, order, np.arange(1, matrix.shape[1] + 1)[None, :].repeat(matrix.shape[0], 0), axis=1)
    return ranks


def coloured_labels(labels: list[str], segments: list[int] | None) -> list[str]:
    """Tick labels coloured by sentence (A dark, B orange) when a sentence pair is shown."""
    if not segments or not any(segments):
        return list(labels)
    return [f'<span style="color:{SENTENCE_COLOURS[1 if s else 0]}">{label}</span>'
            for label, s in zip(labels, segments, strict=True)]


def segment_boundaries(segments: list[int] | None) -> list[int]:
    """The indices where the sentence changes (A to B, or back)."""
    if not segments:
        return []
    return [i for i in range(1, len(segments)) if segments[i] != segments[i - 1]]


def mark_sentence_boundaries(figure: go.Figure, row_segments: list[int] | None, col_segments: list[int] | None,
                             n_rows: int, n_cols: int, row: int | None = None, col: int | None = None) -> None:
    """Dashed lines where sentence B starts, across a heatmap drawn on index (or category) axes."""
    where = {} if row is None else dict(row=row, col=col)
    for boundary in segment_boundaries(col_segments):
        figure.add_shape(type="line", x0=boundary - 0.5, x1=boundary - 0.5, y0=-0.5, y1=n_rows - 0.5,
                         line=dict(color=BOUNDARY_COLOUR, width=2, dash="dash"), **where)
    for boundary in segment_boundaries(row_segments):
        figure.add_shape(type="line", y0=boundary - 0.5, y1=boundary - 0.5, x0=-0.5, x1=n_cols - 0.5,
                         line=dict(color=BOUNDARY_COLOUR, width=2, dash="dash"), **where)


def matrix_heatmap(
    values,
    row_labels: list[str],
    col_labels: list[str],
    *,
    title: str,
    scale: ColourScale = WEIGHTS,
    x_title: str = "key",
    y_title: str = "query",
    show_values: bool = True,
    height: int | None = None,
    width: int = FULL_WIDTH,
    max_x_ticks: int = 48,
    row_segments: list[int] | None = None,
    col_segments: list[int] | None = None,
    row_notes: list[str | None] | None = None,
    col_notes: list[str | None] | None = None,
) -> go.Figure:
    """A heatmap of ``values [rows, cols]`` labelled by ``row_labels`` / ``col_labels``, coloured by ``scale``
    (:data:`ColourScale`: what the values are).

    -inf cells (masked) are drawn grey. Numbers are written in the cells (unless ``show_values`` is False), at a
    fixed size, only where they fit (``width`` is the px the figure is drawn at); tick labels are thinned to fit the
    width and the height (and to at most ``max_x_ticks`` on x). The hover names the row's and the column's label and
    the value to 3 significant digits at any size (labels cost one string per row and column), and, for weights up
    to :data:`RANK_LIMIT` cells (larger views are pooled), the cell's rank in its row. ``row_segments`` /
    ``col_segments`` (0 = sentence A, 1 = sentence B, per label) colour the labels and draw where sentence B starts.
    ``row_notes`` / ``col_notes`` (one per label, or None) are added to the hover after the label: a token's raw
    piece and id (:func:`attnviz.core.tokens_display.piece_note`).
    """
    matrix = _checked_matrix(values, row_labels, col_labels)
    row_hover, col_hover = _with_notes(row_labels, row_notes), _with_notes(col_labels, col_notes)
    row_labels, col_labels = style.plotly_texts(row_labels), style.plotly_texts(col_labels)  # "<s>" as text
    n_rows, n_cols = matrix.shape
    height = height or default_height(n_rows)
    text = _cell_text(matrix, scale, width, height) if show_values else None
    x_values, y_values, axis_type = _cell_positions(row_hover, col_hover)
    figure = go.Figure(_heatmap_trace(matrix, scale, text, x_values, y_values, x_title, y_title))
    x_max_ticks = min(max_x_ticks, max(4, (width - 190) // X_TICK_SPACING))
    y_max_ticks = max(4, (height - 120) // Y_TICK_SPACING)
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"),
        font=dict(family=style.FONT_FAMILY),
        xaxis=_axis(x_title, x_values, col_labels, col_segments, x_max_ticks, axis_type, tickangle=-45, side="bottom"),
        yaxis=_axis(y_title, y_values, row_labels, row_segments, y_max_ticks, axis_type, autorange="reversed"),
        plot_bgcolor=style.BLOCKED_COLOR,
        margin=dict(l=10, r=10, t=50, b=10),
        height=height,
    )
    mark_sentence_boundaries(figure, row_segments, col_segments, n_rows, n_cols)
    return figure


def _heatmap_trace(matrix: np.ndarray, scale: ColourScale, text: list[list[str]] | None, x_values: list,
                   y_values: list, x_title: str, y_title: str) -> go.Heatmap:
    """The cells of ``matrix`` coloured by ``scale``, with ``text`` written in them and the hover."""
    detailed = matrix.size <= DETAIL_LIMIT
    finite = np.where(np.isfinite(matrix), matrix, np.nan)  # -inf cells are left blank: the grey background shows
    if not detailed:
        finite = finite.astype(np.float32)  # sent as a compact binary array
    ranked = scale.ranks_in_hover and matrix.size <= RANK_LIMIT
    return go.Heatmap(
        z=finite,
        x=x_values,
        y=y_values,
        text=text,
        texttemplate=None if text is None else "%{text}",
        textfont=dict(size=CELL_TEXT_SIZE),
        customdata=ranks_in_rows(finite) if ranked else None,
        hovertemplate=_hovertemplate(scale, x_title, y_title, matrix.shape[1] if ranked else None),
        hoverongaps=True,
        xgap=1 if detailed else 0,  # cell borders would hide the cells of a 512 x 512 matrix
        ygap=1 if detailed else 0,
        **scale.colour_settings(finite),  # from the values as sent (float32 above DETAIL_LIMIT)
    )


def default_height(n_rows: int) -> int:
    """Pixels high for a heatmap of ``n_rows`` rows when the caller does not say."""
    return int(min(900, max(260, 60 + 38 * n_rows)))


def _checked_matrix(values, row_labels: list[str], col_labels: list[str]) -> np.ndarray:
    """``values`` as a 2-D float64 array with one label per row and per column, or a ValueError that says why."""
    matrix = np.asarray(values, dtype=np.float64)
    if matrix.ndim != 2:
        raise ValueError(f"matrix_heatmap draws 2-D values, got shape {matrix.shape}")
    n_rows, n_cols = matrix.shape
    if len(row_labels) != n_rows or len(col_labels) != n_cols:
        raise ValueError(
            f"{len(row_labels)} row labels and {len(col_labels)} column labels for a {n_rows} x {n_cols} matrix"
        )
    return matrix


def _cell_text(matrix: np.ndarray, scale: ColourScale, width: int, height: int) -> list[list[str]] | None:
    """The numbers written in the cells, or None above :data:`TEXT_LIMIT` cells or where the longest would not fit
    in a cell of a ``width x height`` px figure."""
    if matrix.size > TEXT_LIMIT:
        return None
    text = [[scale.cell_text(value) for value in row] for row in matrix.tolist()]
    return text if numbers_fit(text, *plot_area(width, height, *matrix.shape)) else None


def _with_notes(labels: list[str], notes: list[str | None] | None) -> list[str]:
    """Each label with its note in brackets (what the hover names a row or column by), as Plotly shows it."""
    if notes is None:
        return style.plotly_texts(labels)
    if len(notes) != len(labels):
        raise ValueError(f"{len(notes)} notes for {len(labels)} labels")
    return style.plotly_texts([label if not note else f"{label} ({note})" for label, note in zip(labels, notes,
                                                                                                strict=True)])


def _cell_positions(row_labels: list[str], col_labels: list[str]) -> tuple[list, list, str]:
    """The cells' x and y values, and the axes' type.

    Categorical axes carry the labels, so the hover can name both tokens without a string per cell; labels that
    repeat would be merged by Plotly, so those fall back to positions on linear axes."""
    if len(set(row_labels)) == len(row_labels) and len(set(col_labels)) == len(col_labels):
        return list(col_labels), list(row_labels), "category"
    return list(range(len(col_labels))), list(range(len(row_labels))), "linear"


def _hovertemplate(scale: ColourScale, x_title: str, y_title: str, ranked_among: int | None) -> str:
    """Both labels and the value; with ``ranked_among`` (the row's length) the rank that ``customdata`` holds."""
    rank = "" if ranked_among is None else f"<br>rank %{{customdata}} of {ranked_among} in its row"
    return f"{y_title} %{{y}}<br>{x_title} %{{x}}<br>{scale.value_name} %{{z:.3g}}{rank}<extra></extra>"


def _axis(title: str, values: list, labels: list[str], segments: list[int] | None, max_ticks: int, axis_type: str,
          **placement) -> dict:
    """One axis: its title and at most ``max_ticks`` of its labels (coloured by sentence when ``segments``), with
    ``placement`` (tick angle, side, direction)."""
    ticks, text = style.thinned_ticks(coloured_labels(labels, segments), max_ticks=max_ticks)
    return dict(title=title, tickmode="array", tickvals=[values[i] for i in ticks], ticktext=text, **placement,
                type=axis_type)


MASK_COLOURS = {0: ("#ffffff", "blocked"), 1: ("#2f6db5", "may attend")}
BLOCK_COLOURS = {
    0: ("#ffffff", "blocked"), 1: ("#d62728", "global"), 2: ("#2f6db5", "window"), 3: ("#ff9f1c", "random"),
}


def mask_heatmap(
    categories, row_labels: list[str], col_labels: list[str], *, title: str,
    legend: dict[int, tuple[str, str]] | None = None, height: int | None = None, x_title: str = "key",
    y_title: str = "query", width: int = FULL_WIDTH,
) -> go.Figure:
    """A mask drawn with discrete colours: ``categories [n_q, n_k]`` ints (0 = blocked, 1 = may attend, or BigBird's
    kinds with ``legend=BLOCK_COLOURS``)."""
    legend = legend or MASK_COLOURS
    values = np.asarray(categories, dtype=np.int64)
    levels = sorted(legend)
    top = max(levels)
    colorscale = []
    for level in levels:  # a stepped colour scale: each integer level gets a flat band
        colour = legend[level][0]
        colorscale += [[level / (top + 1), colour], [(level + 1) / (top + 1), colour]]
    row_labels, col_labels = style.plotly_texts(row_labels), style.plotly_texts(col_labels)  # "<s>" as text
    labelled = len(row_labels) == values.shape[0] and len(col_labels) == values.shape[1]
    # The hover names both tokens (by their labels) and what the cell is.
    rows = row_labels if labelled else range(values.shape[0])
    cols = col_labels if labelled else range(values.shape[1])
    names = [[f"{y_title} {row_name} → {x_title} {col_name}: {legend.get(int(v), ('', '?'))[1]}"
              for col_name, v in zip(cols, row, strict=True)]
             for row_name, row in zip(rows, values.tolist(), strict=True)]
    figure = go.Figure(
        go.Heatmap(
            z=values, x=list(range(values.shape[1])), y=list(range(values.shape[0])),
            zmin=-0.5, zmax=top + 0.5, colorscale=colorscale, customdata=names,
            hovertemplate="%{customdata}<extra></extra>",
            colorbar=dict(tickvals=levels, ticktext=[legend[level][1] for level in levels], thickness=14),
            xgap=1 if values.size <= DETAIL_LIMIT else 0, ygap=1 if values.size <= DETAIL_LIMIT else 0,
        )
    )
    height = height or int(min(900, max(300, 90 + 26 * values.shape[0])))
    x_ticks, x_text = style.thinned_ticks(col_labels, max_ticks=min(32, max(4, (width - 190) // X_TICK_SPACING)))
    y_ticks, y_text = style.thinned_ticks(row_labels, max_ticks=max(4, (height - 120) // Y_TICK_SPACING))
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"),
        font=dict(family=style.FONT_FAMILY),
        xaxis=dict(title=x_title, tickmode="array", tickvals=x_ticks, ticktext=x_text, tickangle=-45),
        yaxis=dict(title=y_title, tickmode="array", tickvals=y_ticks, ticktext=y_text, autorange="reversed"),
        plot_bgcolor="#eeeeee",
        margin=dict(l=10, r=10, t=50, b=10),
        height=height,
    )
    return figure


def wrap_title(text: str, max_chars: int) -> str:
    """Break a panel title into lines of at most ``max_chars`` (at spaces), so narrow panels' titles never overlap."""
    lines: list[str] = []
    for part in text.split("<br>"):
        line = ""
        for word in part.split(" "):
            if line and len(line) + 1 + len(word) > max_chars:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        lines.append(line)
    return "<br>".join(lines)


def heatmap_row(
    matrices: list,
    titles: list[str],
    row_labels: list[str],
    col_labels: list[str],
    *,
    title: str,
    scale: ColourScale = WEIGHTS,
    show_values: bool = False,
    height: int | None = None,
    width: int = NARROW_FULL_WIDTH,
) -> go.Figure:
    """Several same-shaped matrices side by side with one shared colour ``scale`` (a signed one without a bound
    takes the widest panel's), ``width`` px wide in all: numbers, ticks and panel titles are fitted to each panel's
    share of it. The default is the narrowest a full-width figure is drawn at, so panels' labels never collide."""
    from plotly.subplots import make_subplots

    count = len(matrices)
    panel_width = max(80, (width - 190) // count)  # less the y labels and the colour bar, as in plot_area
    chars = max(8, panel_width // 7)  # about 7 px a character at 12 px
    wrapped = [wrap_title(t, chars) for t in titles]
    lines = max(t.count("<br>") + 1 for t in wrapped)
    height = height or int(min(800, max(320, 140 + 26 * len(row_labels))))
    figure = make_subplots(rows=1, cols=count, subplot_titles=wrapped, shared_yaxes=True, horizontal_spacing=0.03)
    if isinstance(scale, SignedScale) and scale.bound is None:  # one bound for all panels, so they can be compared
        widest = max(scale.bound_of(np.asarray(m, dtype=np.float64)) for m in matrices)
        scale = replace(scale, bound=widest or 1.0)
    for index, values in enumerate(matrices):
        single = matrix_heatmap(values, row_labels, col_labels, title="", scale=scale, show_values=show_values,
                                width=panel_width + 190, height=height)
        trace = single.data[0]
        trace.showscale = index == count - 1
        figure.add_trace(trace, row=1, col=index + 1)
    col_labels, row_labels = style.plotly_texts(col_labels), style.plotly_texts(row_labels)  # "<s>" as text
    x_ticks, x_text = style.thinned_ticks(col_labels, max_ticks=min(24, max(3, panel_width // X_TICK_SPACING)))
    narrow = panel_width < NARROW_PANEL
    if narrow:  # long labels turned by 45 degrees would run into the next panel's: positions only
        x_text = [str(i) for i in x_ticks]
    y_ticks, y_text = style.thinned_ticks(row_labels, max_ticks=max(4, (height - 120) // Y_TICK_SPACING))
    figure.update_xaxes(tickmode="array", tickvals=x_ticks, ticktext=x_text, tickangle=-45)
    figure.update_yaxes(tickmode="array", tickvals=y_ticks, ticktext=y_text, autorange="reversed")
    figure.update_yaxes(title_text="query", row=1, col=1)
    if narrow:
        figure.update_xaxes(title_text="key position", row=1, col=(count + 1) // 2)
    figure.update_annotations(font_size=12)  # the subplot titles
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"),
        font=dict(family=style.FONT_FAMILY),
        plot_bgcolor=style.BLOCKED_COLOR,
        margin=dict(l=10, r=10, t=64 + 16 * lines, b=10),
        height=height,
    )
    return figure
