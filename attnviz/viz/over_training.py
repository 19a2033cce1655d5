"""Figures of the "Over training" page: a run's held-out loss and in-context-learning score against the training step,
and one small panel per head measure with a line per head; both on a log step axis that shows step 0, with the phase
change shaded and the step the page's slider picks marked. Data in (plain lists and arrays), figures out."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.viz import style

PHASE_FILL = "#fdd9a0"  # the phase change's band
PICKED_COLOUR = "#1b1f24"  # the slider's step
FAINT = "#9aa5b1"  # the heads the words do not name
STRONG = ("#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf")  # the heads they do, in order


def zero_position(steps) -> float:
    """Where step 0 is drawn on the log axis: half the smallest positive step (1 when there is none)."""
    positive = [step for step in steps if step > 0]
    return min(positive) / 2 if positive else 1.0


def positions(steps) -> list[float]:
    """Each step's x on the log axis: itself, and step 0 at :func:`zero_position`."""
    zero = zero_position(steps)
    return [float(step) if step > 0 else zero for step in steps]


def has_step_zero(steps) -> bool:
    return any(step <= 0 for step in steps)


def axis_title(steps, short: bool = False) -> str:
    """The step axis's title; where step 0 is drawn when the run has one (a series may start later)."""
    words = "step (log" if short else "training step (log scale"
    if not has_step_zero(steps):
        return words + ")"
    position = zero_position(steps)
    zero = f"{position:,.0f}" if position >= 1000 else style.format_number(position)  # 50,000, not 5e+04
    return f"{words}; 0 drawn at {zero})" if short else f"{words}; step 0 drawn at {zero})"


def _ticks(steps) -> tuple[list[float], list[str]]:
    """Tick positions and labels: step 0 at its place (when the run has one), then the powers of ten the steps reach
    (sparse enough for a half-width panel on a projector); where fewer than two of those fall among the steps (a
    series from step 3,000 to 5,000), the first and last steps themselves."""
    zero = zero_position(steps)
    last = max(max(steps), 1)
    positive = [step for step in steps if step > 0]
    start = zero * 1.8 if has_step_zero(steps) else min(positive) / 1.05
    values, labels = ([zero], ["0"]) if has_step_zero(steps) else ([], [])
    powers = [10 ** power for power in range(int(math.ceil(math.log10(last * 1.05))) + 1)
              if start <= 10 ** power <= last * 1.05]
    if len(powers) < 2 and positive:
        powers = sorted(set(powers) | {min(positive), max(positive)})
    values += [float(value) for value in powers]
    labels += [f"{value:,}" for value in powers]
    return values, labels


def _step_axes(figure: go.Figure, steps) -> None:
    values, labels = _ticks(steps)
    first = zero_position(steps) if has_step_zero(steps) else min(step for step in steps if step > 0)
    span = [math.log10(first) - 0.08, math.log10(max(max(steps), 1)) + 0.05]
    figure.update_xaxes(type="log", tickmode="array", tickvals=values, ticktext=labels, range=span, showgrid=True,
                        gridcolor="#eeeeee", zeroline=False)
    figure.update_yaxes(showgrid=True, gridcolor="#eeeeee", zeroline=False)


def _shade(figure: go.Figure, steps, span: tuple[int, int] | None, *, panels: bool) -> None:
    """The phase change's band, from ``span[0]`` to ``span[1]`` (steps), in every panel; labelled once, inside the
    first panel's top."""
    if span is None:
        return
    zero = zero_position(steps)
    low, high = (float(step) if step > 0 else zero for step in span)
    if high <= low:  # one measured step: a thin band around it
        low, high = low / 1.08, high * 1.08
    where = dict(row="all", col="all") if panels else {}
    figure.add_vrect(x0=low, x1=high, fillcolor=PHASE_FILL, opacity=0.55, layer="below", line_width=0, **where)
    figure.add_annotation(x=math.log10(math.sqrt(low * high)), y=1, xref="x", yref="y domain", yanchor="top",
                          text="phase change", showarrow=False, font=dict(size=11, color="#8a5a00"))


def _pick(figure: go.Figure, steps, picked: int | None) -> None:
    """The slider's step: a dashed vertical line in every panel (one shape per pair of axes, added directly: it works
    on the unvalidated copies :func:`marked` makes)."""
    if picked is None:
        return
    x = float(picked) if picked > 0 else zero_position(steps)
    suffixes = sorted((key[len("xaxis"):] for key in figure.layout.to_plotly_json() if key.startswith("xaxis")),
                      key=lambda suffix: int(suffix or 1))
    lines = [dict(type="line", xref=f"x{suffix}", yref=f"y{suffix} domain", x0=x, x1=x, y0=0, y1=1,
                  line=dict(color=PICKED_COLOUR, width=1.5, dash="dash")) for suffix in suffixes or [""]]
    figure.layout.shapes = (*figure.layout.shapes, *lines)


def marked(figure: go.Figure, steps, picked: int) -> go.Figure:
    """A copy of one of this module's figures, drawn without a step, with ``picked`` marked in every panel. Cheap
    (the copy is not validated again): a page builds each figure once per run and marks it per step."""
    copy = go.Figure(figure.to_dict(), _validate=False)
    _pick(copy, steps, picked)
    return copy


def loss_and_icl_figure(steps: list[int], loss, icl, *, span: tuple[int, int] | None = None,
                        picked: int | None = None, title: str = "Held-out loss and in-context learning over training",
                        early=None, late=None) -> go.Figure:
    """Two panels over the step: the held-out loss (with the loss on early and late tokens, when given, dotted) and
    the in-context-learning score (late minus early: below 0, later tokens are predicted better)."""
    x = positions(steps)
    figure = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.55, 0.45])
    hover = "%{customdata:,}"
    lines = [(loss, "held-out loss", "#1f77b4", "solid", 1)]
    if early is not None and late is not None:
        lines += [(early, "early tokens' loss", "#6baed6", "dot", 1), (late, "late tokens' loss", "#08519c", "dot", 1)]
    lines.append((icl, "in-context-learning score", "#d62728", "solid", 2))
    for values, name, colour, dash, row in lines:
        figure.add_trace(go.Scatter(
            x=x, y=[float(v) for v in values], customdata=list(steps), name=name, mode="lines+markers",
            marker=dict(size=4), line=dict(color=colour, width=2.5 if dash == "solid" else 1.5, dash=dash),
            hovertemplate=f"{name}<br>step {hover}<br>%{{y:.4g}} nats<extra></extra>"), row=row, col=1)
    figure.add_hline(y=0, line=dict(color="#aaaaaa", width=1), row=2, col=1)
    _step_axes(figure, steps)
    _shade(figure, steps, span, panels=True)
    _pick(figure, steps, picked)
    figure.update_yaxes(title_text="loss (nats)", row=1, col=1)
    figure.update_yaxes(title_text="ICL score (nats)", row=2, col=1)
    figure.update_xaxes(title_text=axis_title(steps), row=2, col=1)
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"), height=460, margin=dict(l=10, r=10, t=60, b=10),
        font=dict(family=style.FONT_FAMILY), plot_bgcolor="white",
        legend=dict(orientation="h", x=0, xanchor="left", yref="container", y=0, yanchor="bottom"),
    )
    return figure


def head_colours(labels: list[str], named: list[str]) -> dict[str, str]:
    """Each head's colour: the named heads strong (in :data:`STRONG`'s order), the rest faint."""
    strong = {label: STRONG[index % len(STRONG)] for index, label in enumerate(named)}
    return {label: strong.get(label, FAINT) for label in labels}


def head_panels_figure(steps: list[int], measures: dict[str, np.ndarray], *, named: list[tuple[int, int]] = (),
                       span: tuple[int, int] | None = None, picked: int | None = None,
                       ranges: dict[str, tuple[float, float]] | None = None,
                       title: str = "Every head over training") -> go.Figure:
    """One panel per head measure (``measures``: its title -> ``[steps, layers, heads]``), one line per head
    (``L2 H1``); the ``named`` heads (layer, head) in strong colours and wide, a trace each (the legend names them: a
    click hides one in every panel); the rest faint, drawn as one trace per panel whose lines are split by gaps (its
    hover names each point's head), so that a model of hundreds of heads stays a small figure. ``ranges``: a fixed y
    range by measure (scores that are attention weights: 0 to 1, so that panels and runs compare)."""
    titles = list(measures)
    columns = 2 if len(titles) > 1 else 1
    rows = math.ceil(len(titles) / columns)
    figure = make_subplots(rows=rows, cols=columns, shared_xaxes=True, subplot_titles=titles, vertical_spacing=0.14,
                           horizontal_spacing=0.08)
    x = positions(steps)
    first = np.asarray(next(iter(measures.values())))
    layers, heads = first.shape[1:]
    named = [(int(layer), int(head)) for layer, head in named]
    faint = [(layer, head) for layer in range(layers) for head in range(heads) if (layer, head) not in named]
    named_labels = [f"L{layer} H{head}" for layer, head in named]
    colours = head_colours(named_labels, named_labels)
    for index, measure in enumerate(titles):
        values = np.round(np.asarray(measures[measure], dtype=np.float64), 5)  # [steps, layers, heads]
        row, col = index // columns + 1, index % columns + 1
        if faint:  # every other head: one trace, a gap (NaN) after each head; numpy arrays travel as typed arrays
            count = len(steps) + 1
            gap_x = np.tile(np.append(np.asarray(x, dtype=np.float32), np.nan), len(faint))
            gap_y = np.concatenate([np.append(values[:, layer, head], np.nan) for layer, head in faint])
            small = max(steps) < np.iinfo(np.int16).max  # the bytes sent: 2 a number where they do
            where = np.array([[step, layer, head] for layer, head in faint for step in [*steps, -1]],
                             dtype=np.int16 if small else np.int32).reshape(len(faint) * count, 3)  # [points, 3]
            figure.add_trace(go.Scatter(
                x=gap_x, y=gap_y.astype(np.float32), customdata=where, name="other heads",
                legendgroup="other heads", showlegend=False, mode="lines", line=dict(color=FAINT, width=1.2),
                opacity=0.55, connectgaps=False,
                hovertemplate=f"L%{{customdata[1]}} H%{{customdata[2]}}<br>step %{{customdata[0]:,}}<br>{measure}: "
                              "%{y:.3g}<extra></extra>",
            ), row=row, col=col)
        for layer, head in named:  # on top
            label = f"L{layer} H{head}"
            figure.add_trace(go.Scatter(
                x=x, y=values[:, layer, head].tolist(), customdata=list(steps), name=label, legendgroup=label,
                showlegend=index == 0, mode="lines", line=dict(color=colours[label], width=2.8),
                hovertemplate=f"{label}<br>step %{{customdata:,}}<br>{measure}: %{{y:.3g}}<extra></extra>",
            ), row=row, col=col)
    _step_axes(figure, steps)
    for index, measure in enumerate(titles):
        if ranges and measure in ranges:
            figure.update_yaxes(range=list(ranges[measure]), row=index // columns + 1, col=index % columns + 1)
    _shade(figure, steps, span, panels=True)
    _pick(figure, steps, picked)
    for col in range(1, columns + 1):
        figure.update_xaxes(title_text=axis_title(steps, short=True), row=rows, col=col)
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"), height=250 + 220 * rows, margin=dict(l=10, r=10, t=60, b=10),
        font=dict(family=style.FONT_FAMILY), plot_bgcolor="white",
        legend=dict(orientation="h", x=0, xanchor="left", yref="container", y=0, yanchor="bottom",
                    title=dict(text="named heads:" if named else "")),
    )
    return figure
