"""The Generation page's own figures: the next-token distribution (one bar per token id) and one head's attention
over the whole sequence, prompt and generated tokens, with the cells an induction head fills outlined."""

from __future__ import annotations

import plotly.graph_objects as go

from attnviz.viz import style
from attnviz.viz.heads import HEAD_COLOURS
from attnviz.viz.matrix import BOUNDARY_COLOUR, NARROW_FULL_WIDTH, matrix_heatmap


def next_token_chart(labels: list[str], probabilities: list[float], ids: list[int], *, title: str,
                     chosen: int | None = None, height: int = 380, pieces: list[str] | None = None) -> go.Figure:
    """One bar per token, in the order given (most likely first), on integer x positions labelled by ``labels``
    (Plotly would merge two bars whose category labels are equal), each with its probability to 3 significant
    digits (0.250, 1.00); the hover adds the token id, the tokenizer's raw piece (``pieces``, one per bar) and the
    exact probability. ``chosen``: the id of the token taken, drawn
    in the generated tokens' colour."""
    if not len(labels) == len(probabilities) == len(ids):
        raise ValueError(f"{len(labels)} labels, {len(probabilities)} probabilities and {len(ids)} ids")
    positions = list(range(len(labels)))
    shown = style.plotly_texts(labels)  # "<0xE2>" as text, not markup
    figure = go.Figure(go.Bar(
        x=positions, y=list(probabilities), text=[f"{p:#.3g}" for p in probabilities],  # 0.250, not 0.25
        textposition="outside", cliponaxis=False,
        marker_color=[BOUNDARY_COLOUR if token_id == chosen else HEAD_COLOURS[0] for token_id in ids],
        customdata=[[label, int(token_id), "" if pieces is None else f"<br>piece {style.plotly_text(repr(piece))}"]
                    for label, token_id, piece in zip(shown, ids, pieces or ids, strict=True)],
        hovertemplate="%{customdata[0]}<br>token id %{customdata[1]}%{customdata[2]}<br>probability %{y:.6g}"
                      "<extra></extra>",
    ))
    top = max(probabilities, default=1.0)
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"), height=height, font=dict(family=style.FONT_FAMILY),
        plot_bgcolor="white", margin=dict(l=10, r=10, t=60, b=40), yaxis_title="probability",
        xaxis=dict(tickmode="array", tickvals=positions, ticktext=shown, tickangle=-45, showgrid=False),
        yaxis=dict(range=[0, top * 1.18 if top > 0 else 1], showgrid=True, gridcolor="#eeeeee"),
    )
    return figure


def sequence_heatmap(values, labels: list[str], segments: list[int], marks: list[tuple[int, int]], *, title: str,
                     width: int = NARROW_FULL_WIDTH, notes: list[str] | None = None) -> go.Figure:
    """One head's weights, every query (rows) over every key (columns) of the sequence, on the shared 0..1 scale;
    generated tokens' labels in orange after a dashed line; ``marks`` ``(row, col)`` outlined: the cells an
    induction head fills (each repeated token's query on the token after its earlier occurrence). ``notes`` (one
    per label: a token's raw piece and id) are added to the hover. ``width``: by default the narrowest the page
    draws it at (a 900-px window), so that its key labels, turned by 45 degrees, are thinned to fit there too."""
    n = len(labels)
    height = int(min(900, max(420, 160 + 15 * n)))  # every label up to ~50 tokens
    figure = matrix_heatmap(values, labels, labels, title=title, x_title="key", y_title="query", show_values=False,
                            height=height, width=width, max_x_ticks=64, row_segments=segments, col_segments=segments,
                            row_notes=notes, col_notes=notes)
    if marks:
        x_values = list(figure.data[0].x)
        y_values = list(figure.data[0].y)
        figure.add_trace(go.Scatter(
            x=[x_values[col] for _, col in marks], y=[y_values[row] for row, _ in marks], mode="markers",
            marker=dict(symbol="square-open", size=max(4, min(12, int(600 / max(n, 1)))), color=BOUNDARY_COLOUR,
                        line=dict(width=1.5)),
            name="the token after the earlier occurrence", hoverinfo="skip", showlegend=True,
        ))
        figure.update_layout(legend=dict(orientation="h", x=0, xanchor="left", y=1.0, yanchor="bottom"),
                             margin=dict(t=80))
    return figure
