"""Figures of pre-norm against post-norm (:mod:`attnviz.interventions.norm_placement`): each block's gradient norm at
initialisation, the blocks' gradient norms over the first steps of the four runs, and the four runs' loss curves.
Steps go on a log axis that shows step 0 (drawn at half the smallest positive step, as the "Over training" page's
figures draw it; the axis title says where). Data in (plain lists and dicts), figures out."""

from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.viz import style

NORM_COLOURS = {"pre": "#1f77b4", "post": "#d62728"}
LAYER_COLOURS = ("#08519c", "#3182bd", "#6baed6", "#9ecae1", "#c6dbef", "#deebf7")  # layer 0 darkest
WARMUP_DASH = "dash"  # the warm-up runs are dashed, the others solid


ZERO_AT = 0.5  # where step 0 is drawn on the log axis: half the smallest positive step (every run has step 1)


def step_positions(steps, zero: float = ZERO_AT) -> list[float]:
    """Each step's x on the log axis: itself, and step 0 at ``zero``."""
    return [float(step) if step > 0 else zero for step in steps]


def step_axis_title(zero: float = ZERO_AT) -> str:
    return f"training step (log scale; step 0 drawn at {style.format_number(zero)})"


def _step_ticks(zero: float, last: int) -> tuple[list[float], list[str]]:
    """Step 0 at its place, then 1, 2 and 5 times the powers of ten up to the last step."""
    values, labels = [zero], ["0"]
    for power in range(0, int(math.ceil(math.log10(max(last, 1)))) + 1):
        for factor in (1, 2, 5):
            value = factor * 10 ** power
            if zero * 1.6 < value <= last * 1.05:
                values.append(float(value))
                labels.append(f"{value:,}")
    return values, labels


def _step_axes(figure: go.Figure, zero: float, last: int) -> None:
    values, labels = _step_ticks(zero, last)
    figure.update_xaxes(type="log", tickmode="array", tickvals=values, ticktext=labels,
                        range=[math.log10(zero) - 0.08, math.log10(max(last, 1)) + 0.05], showgrid=True,
                        gridcolor="#eeeeee", zeroline=False)


def _finite(value: float) -> float | None:
    """A value Plotly can draw: None (a gap) for NaN and infinities (a diverged step)."""
    value = float(value)
    return value if math.isfinite(value) else None


def _layout(figure: go.Figure, title: str, height: int) -> go.Figure:
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"), height=height, margin=dict(l=10, r=10, t=60, b=10),
        font=dict(family=style.FONT_FAMILY), plot_bgcolor="white",
        legend=dict(orientation="h", x=0, xanchor="left", yref="container", y=0, yanchor="bottom"),
    )
    figure.update_yaxes(showgrid=True, gridcolor="#eeeeee", zeroline=False)
    return figure


def init_gradient_figure(gradients: dict[str, list[float]], names: dict[str, str],
                         title: str = "Each block's gradient norm at initialisation") -> go.Figure:
    """One line per norm (``gradients``: norm -> ``[layers]``), over the layer, on a log y axis (a ratio between
    layers is the same height whatever the scale); ``names``: norm -> its name in the legend."""
    figure = go.Figure()
    for norm, values in gradients.items():
        first = values[0] if values and values[0] else float("nan")
        figure.add_trace(go.Scatter(
            x=list(range(len(values))), y=[float(v) for v in values], name=names.get(norm, norm),
            mode="lines+markers+text", marker=dict(size=9), line=dict(color=NORM_COLOURS.get(norm), width=2.5),
            text=[style.format_number(float(v)) for v in values], textposition="top center",
            customdata=[float(v) / first for v in values],
            hovertemplate=(f"{names.get(norm, norm)}<br>block %{{x}}<br>gradient norm %{{y:.4g}}<br>"
                           "%{customdata:.3g}× block 0's<extra></extra>")))
    layers = max((len(values) for values in gradients.values()), default=0)
    figure.update_xaxes(title_text="block (0 is next to the embeddings, the last next to the output)",
                        tickmode="array", tickvals=list(range(layers)), ticktext=[str(i) for i in range(layers)],
                        showgrid=False)
    drawn = [float(v) for values in gradients.values() for v in values if math.isfinite(v) and v > 0]
    span = [math.log10(min(drawn)) - 0.15, math.log10(max(drawn)) + 0.3] if drawn else None  # room for the labels
    figure.update_yaxes(type="log", title_text="gradient norm (log scale)", minorloglabels="none", range=span)
    return _layout(figure, title, 380)


def gradients_over_steps_figure(runs: dict[str, list[list[float]]], *, first: int | None = None,
                                title: str = "Each block's gradient norm over the first steps") -> go.Figure:
    """One panel per run (``runs``: its name -> ``[steps][layers]``, gradient norms before clipping), one line per
    block, the first ``first`` steps (all when None); log x (step 0 shown) and one log y shared by every panel, so
    that the runs' scales compare."""
    names = list(runs)
    columns = 2 if len(names) > 1 else 1
    rows = math.ceil(len(names) / columns)
    figure = make_subplots(rows=rows, cols=columns, shared_xaxes=True, shared_yaxes=True, subplot_titles=names,
                           vertical_spacing=0.16, horizontal_spacing=0.06)
    last = 1
    for index, name in enumerate(names):
        values = runs[name] if first is None else runs[name][:first]  # [steps][layers]
        steps = list(range(len(values)))
        last = max(last, len(values) - 1)
        layers = len(values[0]) if values else 0
        row, col = index // columns + 1, index % columns + 1
        for layer in range(layers):
            figure.add_trace(go.Scatter(
                x=step_positions(steps), y=[_finite(step[layer]) for step in values], customdata=steps,
                name=f"block {layer}", legendgroup=f"block {layer}", showlegend=index == 0, mode="lines",
                line=dict(color=LAYER_COLOURS[layer % len(LAYER_COLOURS)], width=2),
                hovertemplate=f"{name}<br>block {layer}<br>step %{{customdata:,}}<br>gradient norm %{{y:.4g}}"
                              "<extra></extra>"), row=row, col=col)
    _step_axes(figure, ZERO_AT, last)
    drawn = [value for values in runs.values() for step in values for value in step
             if math.isfinite(value) and value > 0]
    low, high = (min(drawn), max(drawn)) if drawn else (1e-3, 1.0)
    # one range for every panel, set: Plotly's own autorange of shared log axes left the smallest values out
    figure.update_yaxes(type="log", range=[math.log10(low) - 0.15, math.log10(high) + 0.15], minorloglabels="none",
                        exponentformat="power")
    for col in range(1, columns + 1):
        figure.update_xaxes(title_text=step_axis_title(), row=rows, col=col)
    for row in range(1, rows + 1):
        figure.update_yaxes(title_text="gradient norm", row=row, col=1)
    return _layout(figure, title, 200 + 230 * rows)


def running_mean(values: list[float], window: int) -> list[float]:
    """The mean of each value and the ``window - 1`` before it (fewer at the start)."""
    means, total = [], 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        means.append(total / min(index + 1, window))
    return means


def loss_curves_figure(runs: dict[str, dict], *, smooth: int = 10,
                       title: str = "Loss of the four runs against the step") -> go.Figure:
    """Each run (``runs``: its name -> ``{"norm", "warmup", "losses": [steps], "held_out": {step: loss}}``): its
    held-out loss (lines and markers) and its training loss, the mean of the last ``smooth`` steps (thin, faint);
    pre-norm blue, post-norm red, the warm-up runs dashed. Log x, step 0 shown."""
    figure = go.Figure()
    last = 1
    for name, run in runs.items():
        colour, dash = NORM_COLOURS.get(run["norm"]), WARMUP_DASH if run["warmup"] else "solid"
        losses = [float(value) for value in run["losses"]]
        steps = list(range(len(losses)))
        last = max(last, len(losses))
        shown = [_finite(value) for value in running_mean(losses, smooth)]
        figure.add_trace(go.Scatter(
            x=step_positions(steps), y=shown, customdata=steps, name=f"{name}: training (mean of {smooth})",
            legendgroup=name, showlegend=False, mode="lines", opacity=0.35, line=dict(color=colour, width=1.2,
                                                                                        dash=dash),
            hovertemplate=f"{name}<br>step %{{customdata:,}}<br>training loss, mean of the last {smooth} steps "
                          "%{y:.4g}<extra></extra>"))
        measured = sorted(run["held_out"])
        figure.add_trace(go.Scatter(
            x=step_positions(measured), y=[_finite(run["held_out"][step]) for step in measured],
            customdata=measured, name=name, legendgroup=name, mode="lines+markers", marker=dict(size=6),
            line=dict(color=colour, width=2.5, dash=dash),
            hovertemplate=f"{name}<br>step %{{customdata:,}}<br>held-out loss %{{y:.4g}}<extra></extra>"))
    _step_axes(figure, ZERO_AT, last)
    figure.update_xaxes(title_text=step_axis_title())
    figure.update_yaxes(title_text="loss (nats per token)")
    return _layout(figure, title, 440)
