"""Heatmaps of matrices with their numbers written in: attention weights, scores, Q/K/V."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from attnviz.viz import style

KINDS = ("weights", "signed", "plain")
TEXT_LIMIT = 400  # cells: numbers are written in each cell up to 20 x 20, where they fit
DETAIL_LIMIT = 4096  # cells: cell borders up to 64 x 64
RANK_LIMIT = 256 * 256  # cells: the hover gives each weight's rank in its row up to 256 x 256 (2 bytes a cell)
FULL_WIDTH = 1000  # px: a figure the page's full width on a laptop (layout="wide"); figures in columns pass less
HALF_WIDTH = 480  # px: a figure in one of two columns
NARROW_PANEL = 220  # px: side-by-side panels narrower than this label their x axis by position only
CELL_TEXT_SIZE = 12  # px: numbers in cells are printed at this fixed size, or not at all
X_TICK_SPACING = 18  # px between two x tick labels (turned by 45 degrees)
Y_TICK_SPACING = 14  # px between two y tick labels
SENTENCE_COLOURS = ("#1b1f24", "#c2410c")  # tick labels of sentence A and sentence B
BOUNDARY_COLOUR = "#c2410c"


def plot_area(width: int, height: int, n_rows: int, n_cols: int) -> tuple[float, float]:
    """The size in px of one cell of an ``n_rows x n_cols`` heatmap drawn ``width x height`` px (less the margins,
    tick labels, title and colour bar)."""
    return max(1.0, (width - 190) / max(n_cols, 1)), max(1.0, (height - 150) / max(n_rows, 1))


def numbers_fit(text: list[list[str]], cell_width: float, cell_height: float) -> bool:
    """Whether the longest number fits inside a cell at :data:`CELL_TEXT_SIZE` (about 0.6 em a character)."""
    longest = max((len(value) for row in text for value in row), default=0)
    return cell_height >= CELL_TEXT_SIZE + 4 and cell_width >= 0.6 * CELL_TEXT_SIZE * longest + 6


def _two_decimals(value: float) -> str:
    return style.format_number(value) if not np.isfinite(value) else f"{value:.2f}"


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
    kind: str = "weights",
    x_title: str = "key",
    y_title: str = "query",
    show_values: bool = True,
    height: int | None = None,
    robust: bool = False,
    max_x_ticks: int = 48,
    colour: str = "fixed",
    signed_bound: float | None = None,
    width: int = FULL_WIDTH,
    row_segments: list[int] | None = None,
    col_segments: list[int] | None = None,
) -> go.Figure:
    """A heatmap of ``values [rows, cols]`` labelled by ``row_labels`` / ``col_labels``.

    ``kind``: ``"weights"`` uses the shared 0..1 scale; ``"signed"`` a diverging scale centred on 0; ``"plain"``
    a sequential scale. For weights, ``colour`` says what ``values`` are: ``"fixed"`` the weights (0..1),
    ``"row"`` each row divided by its maximum (0..1), ``"log"`` log10 of the weights (ticks read as powers of 10).
    ``robust`` (signed only): the colour scale ends at the 99th percentile of |value|; ``signed_bound`` (signed
    only): the scale runs from -bound to +bound, so that figures meant to be compared share it. -inf cells (masked) are
    drawn grey. Numbers are written in the cells, at a fixed size, only where they fit (``width`` is the px the
    figure is drawn at); tick labels are thinned to fit the width and the height. The hover names the row's and the
    column's label and the value to 3 significant digits at any size (labels cost one string per row and column),
    and, for weights up to :data:`RANK_LIMIT` cells (larger views are pooled), the cell's rank in its row.
    ``row_segments`` / ``col_segments`` (0 = sentence A, 1 = sentence B, per label) colour the labels and draw
    where sentence B starts.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    matrix = np.asarray(values, dtype=np.float64)
    if matrix.ndim != 2:
        raise ValueError(f"matrix_heatmap draws 2-D values, got shape {matrix.shape}")
    n_rows, n_cols = matrix.shape
    if len(row_labels) != n_rows or len(col_labels) != n_cols:
        raise ValueError(
            f"{len(row_labels)} row labels and {len(col_labels)} column labels for a {n_rows} x {n_cols} matrix"
        )

    finite = np.where(np.isfinite(matrix), matrix, np.nan)  # -inf cells are left blank, drawn grey below
    height = height or int(min(900, max(260, 60 + 38 * n_rows)))
    show_values = show_values and n_rows * n_cols <= TEXT_LIMIT
    # Weights in cells with 2 decimals (4 characters: they fit more cells; the hover has 3 significant digits).
    cell_text = _two_decimals if kind == "weights" else style.format_number
    text = [[cell_text(v) for v in row] for row in matrix.tolist()] if show_values else None
    if text is not None and not numbers_fit(text, *plot_area(width, height, n_rows, n_cols)):
        show_values, text = False, None
    # Categorical axes carry the labels, so the hover can name both tokens without a string per cell; labels that
    # repeat would be merged by Plotly, so those fall back to positions.
    unique = len(set(row_labels)) == n_rows and len(set(col_labels)) == n_cols
    x_values = list(col_labels) if unique else list(range(n_cols))
    y_values = list(row_labels) if unique else list(range(n_rows))
    value_name = {"fixed": "weight", "head": "weight / head max", "row": "weight / row max",
                  "log": "log10 weight"}.get(colour, "value")
    value_name = value_name if kind == "weights" else "value"
    ranked = kind == "weights" and n_rows * n_cols <= RANK_LIMIT
    rank = f"<br>rank %{{customdata}} of {n_cols} in its row" if ranked else ""
    hovertemplate = f"{y_title} %{{y}}<br>{x_title} %{{x}}<br>{value_name} %{{z:.3g}}{rank}<extra></extra>"
    detailed = n_rows * n_cols <= DETAIL_LIMIT
    if not detailed:
        finite = finite.astype(np.float32)  # sent as a compact binary array

    colour_settings: dict = {}
    if kind == "weights" and colour == "log":
        low = float(np.nanmin(finite)) if np.isfinite(finite).any() else -6.0
        low = max(min(np.floor(low), -1.0), -12.0)
        ticks = list(range(int(low), 1))
        colour_settings = dict(colorscale=style.WEIGHT_COLORSCALE, zmin=low, zmax=0.0,
                               colorbar=dict(tickvals=ticks, ticktext=[f"1e{t}" if t else "1" for t in ticks]))
    elif kind == "weights":
        colour_settings = dict(colorscale=style.WEIGHT_COLORSCALE, zmin=0.0, zmax=1.0)
    elif kind == "signed":
        magnitudes = np.abs(finite[np.isfinite(finite)])
        bound = float(np.percentile(magnitudes, 99) if robust else magnitudes.max()) if magnitudes.size else 1.0
        bound = signed_bound or bound or 1.0
        colour_settings = dict(colorscale=style.SIGNED_COLORSCALE, zmin=-bound, zmax=bound, zmid=0.0)
    else:
        colour_settings = dict(colorscale=style.PLAIN_COLORSCALE)

    heatmap = go.Heatmap(
        z=finite,
        x=x_values,
        y=y_values,
        text=text,
        texttemplate="%{text}" if show_values else None,
        textfont=dict(size=CELL_TEXT_SIZE),
        customdata=ranks_in_rows(finite) if ranked else None,
        hovertemplate=hovertemplate,
        hoverongaps=True,
        xgap=1 if detailed else 0,  # cell borders would hide the cells of a 512 x 512 matrix
        ygap=1 if detailed else 0,
        **colour_settings,
    )
    figure = go.Figure(heatmap)
    x_ticks, x_text = style.thinned_ticks(coloured_labels(col_labels, col_segments),
                                          max_ticks=min(max_x_ticks, max(4, (width - 190) // X_TICK_SPACING)))
    y_ticks, y_text = style.thinned_ticks(coloured_labels(row_labels, row_segments),
                                          max_ticks=max(4, (height - 120) // Y_TICK_SPACING))
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"),
        font=dict(family=style.FONT_FAMILY),
        xaxis=dict(title=x_title, tickmode="array", tickvals=[x_values[i] for i in x_ticks], ticktext=x_text,
                   tickangle=-45, side="bottom", type="category" if unique else "linear"),
        yaxis=dict(title=y_title, tickmode="array", tickvals=[y_values[i] for i in y_ticks], ticktext=y_text,
                   autorange="reversed", type="category" if unique else "linear"),
        plot_bgcolor=style.BLOCKED_COLOR,
        margin=dict(l=10, r=10, t=50, b=10),
        height=height,
    )
    mark_sentence_boundaries(figure, row_segments, col_segments, n_rows, n_cols)
    return figure


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
    kind: str = "weights",
    show_values: bool = False,
    height: int | None = None,
    width: int = FULL_WIDTH,
) -> go.Figure:
    """Several same-shaped matrices side by side with one shared colour scale (weights: 0..1), ``width`` px wide
    in all: numbers, ticks and panel titles are fitted to each panel's share of it."""
    from plotly.subplots import make_subplots

    count = len(matrices)
    panel_width = max(80, (width - 190) // count)  # less the y labels and the colour bar, as in plot_area
    chars = max(8, panel_width // 7)  # about 7 px a character at 12 px
    wrapped = [wrap_title(t, chars) for t in titles]
    lines = max(t.count("<br>") + 1 for t in wrapped)
    height = height or int(min(800, max(320, 140 + 26 * len(row_labels))))
    figure = make_subplots(rows=1, cols=count, subplot_titles=wrapped, shared_yaxes=True, horizontal_spacing=0.03)
    bound = None
    if kind == "signed":  # one scale for all panels, so they can be compared
        finite = [np.abs(np.asarray(m, dtype=np.float64)) for m in matrices]
        bound = max(float(np.max(f[np.isfinite(f)])) if np.isfinite(f).any() else 0.0 for f in finite) or 1.0
    for index, values in enumerate(matrices):
        single = matrix_heatmap(values, row_labels, col_labels, title="", kind=kind, show_values=show_values,
                                width=panel_width + 190, height=height)
        trace = single.data[0]
        trace.showscale = index == count - 1
        if bound is not None:
            trace.zmin, trace.zmax = -bound, bound
        figure.add_trace(trace, row=1, col=index + 1)
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
