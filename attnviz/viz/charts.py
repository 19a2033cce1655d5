"""Line charts, histograms and bar charts in the house style."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from attnviz.viz import style
from attnviz.viz.heads import HEAD_COLOURS


def _layout(figure: go.Figure, title: str, x_title: str, y_title: str, height: int) -> go.Figure:
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"),
        xaxis_title=x_title,
        yaxis_title=y_title,
        height=height,
        margin=dict(l=10, r=10, t=60, b=10),
        font=dict(family=style.FONT_FAMILY),
        plot_bgcolor="white",
        # At the figure's bottom edge, under the axis title: Plotly makes room for it there at any size (a legend
        # placed a share of the plot's height below the axis ran into the axis title on short or narrow charts).
        legend=dict(orientation="h", x=0, xanchor="left", yref="container", y=0, yanchor="bottom"),
    )
    figure.update_xaxes(showgrid=True, gridcolor="#eeeeee", zeroline=False)
    figure.update_yaxes(showgrid=True, gridcolor="#eeeeee", zeroline=True, zerolinecolor="#cccccc")
    return figure


MOST_LABELLED_X = 10  # a log x axis over this many points or fewer labels each point's x (a sweep's sizes)


def line_chart(
    x,
    series: dict[str, list],
    *,
    title: str,
    x_title: str,
    y_title: str,
    log_x: bool = False,
    log_y: bool = False,
    markers: bool = False,
    dashed: set[str] | None = None,
    vlines: dict[str, float] | None = None,
    height: int = 380,
) -> go.Figure:
    """One line per named series over shared ``x``; ``dashed`` series (theory, references) are drawn dashed."""
    figure = go.Figure()
    for index, (name, values) in enumerate(series.items()):
        figure.add_trace(
            go.Scatter(
                x=list(x), y=list(values), name=name, mode="lines+markers" if markers else "lines",
                line=dict(color=HEAD_COLOURS[index % len(HEAD_COLOURS)], width=2.5,
                          dash="dash" if dashed and name in dashed else "solid"),
                hovertemplate=f"{name}<br>{x_title} %{{x}}<br>{y_title} %{{y:.4g}}<extra></extra>",
            )
        )
    values = [v for series_values in series.values() for v in series_values if v is not None]
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    for label, position in (vlines or {}).items():
        # A marker line as a trace, not a shape: shapes on log axes are placed in log units and stretch the range.
        figure.add_trace(
            go.Scatter(x=[position, position], y=[low, high], mode="lines+text", text=["", label],
                       textposition="top center", line=dict(color="#888888", dash="dot", width=1.5),
                       showlegend=False, hoverinfo="skip")
        )
    _layout(figure, title, x_title, y_title, height)
    if log_x:
        figure.update_xaxes(type="log")
        xs = [v for v in x if v is not None]
        if 1 < len(xs) <= MOST_LABELLED_X:  # a sweep's few sizes: each one labelled, not the log axis's 2 ... 9
            figure.update_xaxes(tickmode="array", tickvals=xs,
                                ticktext=[f"{v:,}" if float(v).is_integer() else style.format_number(v) for v in xs])
    if log_y:
        figure.update_yaxes(type="log")
    return figure


def histogram(samples: dict[str, object], *, title: str, x_title: str, bins: int = 60, height: int = 360) -> go.Figure:
    """Overlaid normalised histograms, one per named sample (a list or an array: arrays go to the browser as typed
    arrays, several times smaller and faster to build than lists of floats)."""
    figure = go.Figure()
    for index, (name, values) in enumerate(samples.items()):
        figure.add_trace(
            go.Histogram(
                x=np.asarray(values), name=name, nbinsx=bins, histnorm="probability density", opacity=0.6,
                marker_color=HEAD_COLOURS[index % len(HEAD_COLOURS)],
            )
        )
    figure.update_layout(barmode="overlay")
    return _layout(figure, title, x_title, "density", height)


def bar_chart(labels: list[str], values: list[float], *, title: str, y_title: str, text: list[str] | None = None,
              height: int = 360, log_y: bool = False, notes: list[str] | None = None) -> go.Figure:
    """Bars of ``values`` over ``labels``; ``notes`` (one string per bar, e.g. a token's raw piece and id) are added
    to each bar's hover."""
    extra = None if notes is None else [f"<br>{style.plotly_text(note)}" if note else "" for note in notes]
    figure = go.Figure(
        go.Bar(x=style.plotly_texts(labels), y=values, text=text, textposition="outside", marker_color=HEAD_COLOURS[0],
               customdata=extra,
               hovertemplate="%{x}<br>%{y:.4g}" + ("%{customdata}" if extra else "") + "<extra></extra>")
    )
    _layout(figure, title, "", y_title, height)
    if log_y:
        figure.update_yaxes(type="log")
    return figure
